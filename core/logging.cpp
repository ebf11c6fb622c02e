#include "core/logging.h"

#include <cstdlib>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace specserve {

std::shared_ptr<spdlog::logger> get_logger(const std::string& module) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (auto existing = spdlog::get(module)) return existing;
  auto logger = spdlog::stderr_color_mt(module);
  const char* lvl = std::getenv("SPECSERVE_LOG_LEVEL");
  logger->set_level(lvl ? spdlog::level::from_str(lvl) : spdlog::level::info);
  logger->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return logger;
}

}  // namespace specserve
