#include "tests/test_util.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "model/gguf.h"
#include "model/tokenizer.h"

namespace specserve::testing {

std::string data_path(const std::string& rel) { return std::string(SPECSERVE_SOURCE_DIR) + "/tests/data/" + rel; }

std::string default_model_path() {
  if (const char* env = std::getenv("SPECSERVE_MODEL")) return env;
  return std::string(SPECSERVE_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

const GgufFile& default_gguf() {
  static const GgufFile* f = [] {
    auto g = GgufFile::open(default_model_path());
    if (!g.ok()) throw std::runtime_error(g.status().to_string());
    return new GgufFile(std::move(*g));
  }();
  return *f;
}

const Tokenizer& default_tokenizer() {
  static const Tokenizer* t = [] {
    auto k = Tokenizer::from_gguf(default_gguf());
    if (!k.ok()) throw std::runtime_error(k.status().to_string());
    return new Tokenizer(std::move(*k));
  }();
  return *t;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace specserve::testing
