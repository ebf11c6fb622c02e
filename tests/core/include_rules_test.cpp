// The include rules of DESIGN.md section 1 ("who may include whom"), checked over the source
// tree: each folder's files include project headers ("x/y.h" or <x/y.h>, a leading ../ too)
// only from the folders its arrow points at. A new include across a layer fails here, naming
// the file, the line and the include. Not checked: scheduler's "spec (types)" and "pure: no
// threads, sockets, actors" (which need more than the include lines).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace specserve {
namespace {

namespace fs = std::filesystem;

// DESIGN.md: config -> core; model -> core; cpu, gpu -> model, core; kv -> core (kv/transfer
// may use Backend buffers); spec -> model, kv, core; scheduler -> kv, spec, config, core;
// actors -> everything above (not cluster, server, tools: nothing points back up);
// cluster, server -> actors, config. tools may include anything.
// NOTE: cluster and server may also include core (status, logging, JSON reading): DESIGN.md's
// arrow for them leaves core out, but core is the base every other arrow names, and an error
// type (core/status.h) crosses every layer.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> a = {
      {"core", {"core"}},
      {"config", {"config", "core"}},
      {"model", {"model", "core"}},
      {"cpu", {"cpu", "model", "core"}},
      {"gpu", {"gpu", "model", "core"}},
      {"kv", {"kv", "core"}},
      {"spec", {"spec", "model", "kv", "core"}},
      {"scheduler", {"scheduler", "kv", "spec", "config", "core"}},
      {"actors", {"actors", "scheduler", "spec", "kv", "cpu", "gpu", "model", "config", "core"}},
      {"cluster", {"cluster", "actors", "config", "core"}},
      {"server", {"server", "actors", "config", "core"}},
  };
  return a;
}

// DESIGN.md's named exception: kv/transfer* may use Backend buffers (model/backend.h). Its UCX
// and NCCL are libraries (<ucp/...>, <nccl.h>), not project folders: kv/ builds without CUDA.
bool exception(const std::string& file, const std::string& included) {
  return file.rfind("kv/transfer", 0) == 0 && included == "model/backend.h";
}

TEST(IncludeRules, EveryFolderIncludesOnlyTheLayersDesignMdAllows) {
  const fs::path root = SPECSERVE_SOURCE_DIR;
  const std::regex include_re(R"(^\s*#\s*include\s*[<"](?:\.\./)*([a-z_]+)/([^">]+)[">])");
  std::vector<std::string> violations;
  size_t files = 0;
  for (const auto& [folder, ok] : allowed()) {
    if (!fs::is_directory(root / folder)) {
      ADD_FAILURE() << folder << "/ is in the table but not in " << root;
      continue;
    }
    for (const auto& e : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh")) continue;
      ++files;
      const std::string rel = fs::relative(e.path(), root).string();
      std::ifstream in(e.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include_re)) continue;
        const std::string dir = m[1].str(), included = dir + "/" + m[2].str();
        // Only the project's own folders count (a system header such as "nlohmann/json.hpp" is not one).
        if (!fs::is_directory(root / dir) || ok.count(dir) || exception(rel, included)) continue;
        violations.push_back(rel + ":" + std::to_string(n) + ": " + folder + " includes " + included);
      }
    }
  }
  EXPECT_GT(files, 100u) << "the source tree was not found under " << root;
  std::string all;
  for (const std::string& v : violations) all += "\n  " + v;
  EXPECT_TRUE(violations.empty()) << "includes against DESIGN.md section 1:" << all;
}

}  // namespace
}  // namespace specserve
