#include "tools/cli/common.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "core/logging.h"

namespace specserve::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("SPECSERVE_MODEL"); env && *env) return env;
  const std::string name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string candidates[2] = {std::string(SPECSERVE_SOURCE_DIR) + "/models/" + name, ""};
  if (const char* home = std::getenv("HOME")) candidates[1] = std::string(home) + "/.cache/specserve/models/" + name;
  for (const auto& c : candidates)
    if (!c.empty() && std::filesystem::exists(c)) return c;
  return candidates[0];
}

}  // namespace specserve::cli
