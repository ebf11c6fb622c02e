// cluster/topology_snapshot.h: what `up` validated is what its node and worker processes read,
// whatever happens to the file afterwards; relative paths still resolve from the file's folder.
#include "cluster/topology_snapshot.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/config/topology_test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;
using topology_testing::base_yaml;
using topology_testing::replace_once;

// A child's view: the variables up hands down, set in this process (each test leaves none behind).
void publish(const TopologySource& src) {
  auto env = topology_snapshot_env(src);
  ASSERT_TRUE(env.ok()) << env.status().to_string();
  for (const auto& [k, v] : *env) ::setenv(k.c_str(), v.c_str(), 1);
}

class TopologySnapshot : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) / ("specserve_snapshot_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    // The model referenced relative to the file's folder, as users write it next to models/.
    fs::remove(dir_ / "m.gguf");
    fs::create_symlink(testing::default_model_path(), dir_ / "m.gguf");
    path_ = (dir_ / "cluster.yaml").string();
  }
  void TearDown() override {
    clear_inherited_topology_snapshot();
    EXPECT_EQ(std::getenv(kTopologySnapshotEnv), nullptr);
    fs::remove_all(dir_);
  }
  void write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }
  static std::string yaml(int32_t max_num_seqs) {
    return replace_once(replace_once(base_yaml(), "path: MODEL", "path: m.gguf"), "max_num_seqs: 64",
                        "max_num_seqs: " + std::to_string(max_num_seqs));
  }
  fs::path dir_;
  std::string path_;
};

TEST_F(TopologySnapshot, ChildrenReadWhatUpValidatedAfterTheFileChangedOrWentAway) {
  write(yaml(7));
  auto src = read_topology_source(path_);
  ASSERT_TRUE(src.ok()) << src.status().to_string();
  publish(*src);
  write(yaml(9) + "bogus_key: 1\n");  // edited while up runs: unparsable now
  auto t = load_launched_topology(path_);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->scheduler.max_num_seqs, 7);
  EXPECT_EQ(t->models.target.path, (dir_ / "m.gguf").string()) << "relative paths resolve from the file's folder";
  // The same file named another way (relative to the current folder) is the same snapshot.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  auto rel = load_launched_topology("./cluster.yaml");
  fs::current_path(cwd);
  ASSERT_TRUE(rel.ok()) << rel.status().to_string();
  EXPECT_EQ(rel->scheduler.max_num_seqs, 7);
  fs::remove(path_);
  auto gone = load_launched_topology(path_);
  ASSERT_TRUE(gone.ok()) << gone.status().to_string();
  EXPECT_EQ(gone->scheduler.max_num_seqs, 7);
}

TEST_F(TopologySnapshot, AnotherFileOrNoSnapshotIsReadFromDisk) {
  write(yaml(7));
  auto t = load_launched_topology(path_);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->scheduler.max_num_seqs, 7);
  auto src = read_topology_source(path_);
  ASSERT_TRUE(src.ok());
  publish(*src);
  const std::string other = (dir_ / "other.yaml").string();
  std::ofstream(other) << yaml(5);
  auto o = load_launched_topology(other);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->scheduler.max_num_seqs, 5);
  // Errors of a snapshot name the file as the user wrote it, with line and column.
  ::setenv(kTopologySnapshotEnv, (yaml(7) + "bogus_key: 1\n").c_str(), 1);
  auto bad = load_launched_topology(path_);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path_ + ":15:"), std::string::npos) << bad.status().message();
  EXPECT_NE(bad.status().message().find("bogus_key"), std::string::npos) << bad.status().message();
}

TEST_F(TopologySnapshot, ATopologyTooLargeForTheEnvironmentIsNotHandedDown) {
  TopologySource big{path_, path_, dir_.string(), yaml(7) + "# " + std::string(kMaxTopologySnapshotBytes, 'x') + "\n"};
  auto env = topology_snapshot_env(big);
  ASSERT_FALSE(env.ok());
  EXPECT_NE(env.status().message().find(path_), std::string::npos) << env.status().message();
  EXPECT_NE(env.status().message().find("read the file again"), std::string::npos) << env.status().message();
  TopologySource nul{path_, path_, dir_.string(), std::string("cluster: {name: t}\n") + '\0'};
  EXPECT_FALSE(topology_snapshot_env(nul).ok());
  TopologySource fits{path_, path_, dir_.string(), yaml(7)};
  auto ok = topology_snapshot_env(fits);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->at(kTopologySnapshotOfEnv), path_);
  EXPECT_EQ(ok->at(kTopologySnapshotEnv), yaml(7));
}

}  // namespace
}  // namespace specserve
