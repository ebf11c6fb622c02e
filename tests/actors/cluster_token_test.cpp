// The cluster token file (actors/runtime.h): read_cluster_token / ensure_cluster_token name
// what is wrong with the path. A directory (cluster.token_file: /tmp) used to get "readable by
// group or others (mode 777); run chmod 600 on it" — advice to chmod /tmp — and a directory of
// mode 700 read as an "empty" token.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "actors/runtime.h"

namespace specserve {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("cluster_token_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

TEST(ClusterToken, ADirectoryIsNamedAsOneWhateverItsMode) {
  const auto dir = temp_dir("dir");
  for (mode_t mode : {0777, 0700}) {
    ::chmod(dir.c_str(), mode);
    for (auto read : {&read_cluster_token, &ensure_cluster_token}) {
      auto t = read(dir.string());
      ASSERT_FALSE(t.ok()) << "mode " << mode;
      EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(t.status().message().find(dir.string() + ": is a directory"), std::string::npos) << t.status().message();
      EXPECT_EQ(t.status().message().find("chmod"), std::string::npos) << t.status().message();
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(ClusterToken, ADeviceIsNotATokenFile) {
  auto t = read_cluster_token("/dev/null");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("/dev/null: not a regular file"), std::string::npos) << t.status().message();
}

TEST(ClusterToken, ARegularFileStillReadsAndItsModeIsStillChecked) {
  const auto dir = temp_dir("file");
  const auto path = dir / "token";
  std::ofstream(path) << "  abc\n";
  ::chmod(path.c_str(), 0600);
  auto t = read_cluster_token(path.string());
  ASSERT_FALSE(t.ok()) << "a 3-character token is guessable";
  EXPECT_NE(t.status().message().find("the token is 3 bytes long; at least 16 are needed"), std::string::npos)
      << t.status().message();
  std::ofstream(path) << "  secret-token-of-24-chars \n";
  t = read_cluster_token(path.string());
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(*t, "secret-token-of-24-chars");
  ::chmod(path.c_str(), 0644);
  t = read_cluster_token(path.string());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("readable by group or others (mode 644); run chmod 600 on it"), std::string::npos)
      << t.status().message();
  // A missing file is created by ensure_cluster_token (mode 0600) and then reads back.
  const auto made = dir / "sub" / "token";
  auto created = ensure_cluster_token(made.string());
  ASSERT_TRUE(created.ok()) << created.status().message();
  auto again = read_cluster_token(made.string());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(*again, *created);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve
