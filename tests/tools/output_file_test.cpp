// The results files of the benchmarks (tools/cli/output_file_lib.h): a path that cannot be written
// is refused before the run, naming the flag and the path, and a failed write is an error.
// Bug: bench-spec --output /nonexistent/dir/x.json ran, printed "wrote /nonexistent/dir/x.json"
// and exited 0 with no file (bench-actors and bench-model the same).
#include "tools/cli/output_file_lib.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <unistd.h>

namespace specserve::cli {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("specserve-output-file-test-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void expect_error(const Status& st, StatusCode code, std::initializer_list<const char*> words) {
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), code) << st.to_string();
  for (const char* w : words) EXPECT_NE(st.message().find(w), std::string::npos) << "'" << w << "' in " << st.message();
}

TEST(OutputFile, CheckRefusesWhatCannotBeWrittenAndCreatesNothing) {
  const fs::path d = temp_dir();
  expect_error(check_output_file("--output", "/nonexistent-dir-xyz/r.json"), StatusCode::kInvalidArgument,
               {"--output", "/nonexistent-dir-xyz/r.json", "does not exist"});
  expect_error(check_output_file("--out", d.string()), StatusCode::kInvalidArgument, {"--out", "is a directory"});
  const fs::path file = d / "f";
  std::ofstream(file) << "x";
  expect_error(check_output_file("--output", (file / "r.json").string()), StatusCode::kInvalidArgument,
               {"is not a directory"});
  expect_error(check_output_file("--output", ""), StatusCode::kInvalidArgument, {"--output", "empty"});

  const fs::path fresh = d / "r.json";
  EXPECT_TRUE(check_output_file("--output", fresh.string()).ok());
  EXPECT_FALSE(fs::exists(fresh));  // nothing created
  EXPECT_TRUE(check_output_file("--output", file.string()).ok());  // an existing file is overwritten later
  fs::remove_all(d);
}

// A directory that takes no new files whatever access() says (as root it says yes): /proc.
// NOTE: `bench --output-json /proc/x` passed the check, ran, and failed writing at the end.
TEST(OutputFile, ADirectoryThatTakesNoNewFilesIsRefusedBeforeTheRun) {
  if (!fs::is_directory("/proc/self")) GTEST_SKIP() << "no /proc on this system";
  expect_error(check_output_file("--output-json", "/proc/specserve-results.json"), StatusCode::kInvalidArgument,
               {"--output-json", "/proc/specserve-results.json", "cannot create a file in /proc"});
}

// A symbolic link to nothing: the write would follow it into a folder never checked.
TEST(OutputFile, ALinkToAMissingFileIsRefused) {
  const fs::path d = temp_dir();
  fs::create_symlink("/nonexistent-dir-xyz/r.json", d / "link.json");
  expect_error(check_output_file("--output", (d / "link.json").string()), StatusCode::kInvalidArgument,
               {"--output", "symbolic link to a missing file", "/nonexistent-dir-xyz/r.json"});
  fs::remove_all(d);
}

TEST(OutputFile, WriteWritesOrSaysWhyNot) {
  const fs::path d = temp_dir();
  const fs::path p = d / "r.json";
  ASSERT_TRUE(write_output_file("--output", p.string(), "{}\n").ok());
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "{}\n");
  expect_error(write_output_file("--output", (d / "no" / "r.json").string(), "{}"), StatusCode::kUnavailable,
               {"--output", "cannot open"});
  if (fs::exists("/dev/full")) {  // every write fails with ENOSPC
    expect_error(write_output_file("--output", "/dev/full", std::string(1 << 16, 'x')), StatusCode::kUnavailable,
                 {"--output /dev/full", "write failed"});
  }
  fs::remove_all(d);
}

// --ready-file is written by a rename into its folder: the folder decides, not an existing
// file's own permissions.
TEST(OutputFile, ReplaceableFileNeedsItsFolderOnly) {
  const fs::path d = temp_dir();
  const fs::path ro = d / "ready";
  std::ofstream(ro) << "old";
  fs::permissions(ro, fs::perms::owner_read);
  EXPECT_TRUE(check_replaceable_file("--ready-file", ro.string()).ok());
  expect_error(check_replaceable_file("--ready-file", (d / "no" / "ready").string()), StatusCode::kInvalidArgument,
               {"--ready-file", "does not exist"});
  expect_error(check_replaceable_file("--ready-file", d.string()), StatusCode::kInvalidArgument, {"is a directory"});
  expect_error(check_replaceable_file("--ready-file", ""), StatusCode::kInvalidArgument, {"empty"});
  fs::remove_all(d);
}

}  // namespace
}  // namespace specserve::cli
