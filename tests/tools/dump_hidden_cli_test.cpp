// `specserve dump-hidden` as a user runs it (the real binary): --help marks the required flags
// and shows the defaults; bad input (--prompts naming a directory, an --out that cannot be
// created) exits 2 naming the flag and the value; the summary reports skipped prompts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace specserve {
namespace {

using CliRun = specserve::testing::CliResult;

CliRun run(const std::string& args) { return specserve::testing::run_specserve("dump-hidden " + args); }

/// The help line(s) of `flag`: from its line to the next flag's.
std::string help_of(const std::string& help, const std::string& flag) {
  const size_t at = help.find("  " + flag + " ");
  if (at == std::string::npos) return "";
  const size_t next = help.find("\n  --", at + 1);
  return help.substr(at, next == std::string::npos ? std::string::npos : next - at);
}

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("dump_hidden_cli_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(p);
  return p;
}

TEST(DumpHiddenCli, HelpMarksRequiredFlagsAndShowsDefaults) {
  const CliRun r = run("--help");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(help_of(r.out, "--prompts").find("REQUIRED"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--out").find("REQUIRED"), std::string::npos) << r.out;
  EXPECT_EQ(help_of(r.out, "--max-num-seqs").find("REQUIRED"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--max-new-tokens").find("=96"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--max-num-seqs").find("=24"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--max-prompts").find("=0"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--max-prompt-tokens").find("=384"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--check-every").find("=8"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--threads").find("=0"), std::string::npos) << r.out;
  EXPECT_NE(help_of(r.out, "--model").find("default"), std::string::npos) << r.out;
}

TEST(DumpHiddenCli, BadInputExitsTwoNamingTheFlag) {
  const auto dir = temp_dir("bad");
  // --prompts naming a directory: found before the model loads (this model path does not exist).
  CliRun r = run("--model " + (dir / "none.gguf").string() + " --prompts " + dir.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--prompts " + dir.string() + " is a directory"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  // Missing --prompts / --out.
  r = run("--out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--prompts is required"), std::string::npos) << r.out;

  // --out that cannot be created: exit 2 naming --out and the path.
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello\"}\n";
  r = run("--model " + specserve::testing::default_model_path() + " --threads 1 --prompts " + (dir / "p.jsonl").string() +
          " --out /proc/specserve_dump_hidden_cli_test");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--out /proc/specserve_dump_hidden_cli_test"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("internal"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

TEST(DumpHiddenCli, SummaryReportsSkippedPrompts) {
  const auto dir = temp_dir("summary");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello there\"}\n{\"prompt\": \"\"}\n{\"prompt\": \"Good morning\"}\n";
  const CliRun r = run("--model " + specserve::testing::default_model_path() + " --threads 1 --max-new-tokens 2 --no-weights --prompts " +
                    (dir / "p.jsonl").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: skipped 1 empty prompt(s), the first at " + (dir / "p.jsonl").string() + ":2"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("1 prompts skipped (0 over --max-prompt-tokens, 1 empty, the first at line 2)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 sequences"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve
