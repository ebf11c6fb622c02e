#include "tests/test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace specserve::testing {

std::string data_path(const std::string& rel) { return std::string(SPECSERVE_SOURCE_DIR) + "/tests/data/" + rel; }

std::string default_model_path() {
  if (const char* env = std::getenv("SPECSERVE_MODEL")) return env;
  return std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specserve::testing
