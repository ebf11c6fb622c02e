// specserve core: one named spdlog logger per module.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace specserve {

/// The logger for `module` ("model", "cpu", "cli", ...), created on first use, writing to
/// stderr. Thread-safe. Level from SPECSERVE_LOG_LEVEL (trace|debug|info|warn|error|off),
/// default info.
std::shared_ptr<spdlog::logger> get_logger(const std::string& module);

}  // namespace specserve
