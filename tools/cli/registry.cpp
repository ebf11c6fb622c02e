#include <functional>
#include <map>
#include <string>

#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {

std::map<std::string, std::function<int()>>& registry() {
  static std::map<std::string, std::function<int()>> r;
  return r;
}

void register_command(const std::string& name, std::function<int()> fn) { registry()[name] = std::move(fn); }

int run_selected(CLI::App& app) {
  for (auto* sub : app.get_subcommands()) {
    auto it = registry().find(sub->get_name());
    if (it != registry().end()) return it->second();
  }
  return 2;
}

}  // namespace specserve::cli
