// specserve CLI: name -> run function of each subcommand.
#pragma once

#include <functional>
#include <string>

namespace specserve::cli {

/// Records the function `specserve <name>` runs after parsing.
void register_command(const std::string& name, std::function<int()> fn);

}  // namespace specserve::cli
