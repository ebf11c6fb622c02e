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

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run(const std::string& args) {
  CliRun r;
  const std::string cmd = std::string(SPECSERVE_BIN) + " dump-hidden " + args + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) r.output.append(buf, n);
  const int status = ::pclose(f);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

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
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(help_of(r.output, "--prompts").find("REQUIRED"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--out").find("REQUIRED"), std::string::npos) << r.output;
  EXPECT_EQ(help_of(r.output, "--max-num-seqs").find("REQUIRED"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--max-new-tokens").find("=96"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--max-num-seqs").find("=24"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--max-prompts").find("=0"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--max-prompt-tokens").find("=384"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--check-every").find("=8"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--threads").find("=0"), std::string::npos) << r.output;
  EXPECT_NE(help_of(r.output, "--model").find("default"), std::string::npos) << r.output;
}

TEST(DumpHiddenCli, BadInputExitsTwoNamingTheFlag) {
  const auto dir = temp_dir("bad");
  // --prompts naming a directory: found before the model loads (this model path does not exist).
  CliRun r = run("--model " + (dir / "none.gguf").string() + " --prompts " + dir.string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prompts " + dir.string() + " is a directory"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  // Missing --prompts / --out.
  r = run("--out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--prompts is required"), std::string::npos) << r.output;

  // --out that cannot be created: exit 2 naming --out and the path.
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello\"}\n";
  r = run("--model " + specserve::testing::default_model_path() + " --threads 1 --prompts " + (dir / "p.jsonl").string() +
          " --out /proc/specserve_dump_hidden_cli_test");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--out /proc/specserve_dump_hidden_cli_test"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

TEST(DumpHiddenCli, SummaryReportsSkippedPrompts) {
  const auto dir = temp_dir("summary");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello there\"}\n{\"prompt\": \"\"}\n{\"prompt\": \"Good morning\"}\n";
  const CliRun r = run("--model " + specserve::testing::default_model_path() + " --threads 1 --max-new-tokens 2 --no-weights --prompts " +
                    (dir / "p.jsonl").string() + " --out " + (dir / "out").string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("warning: skipped 1 empty prompt(s), the first at " + (dir / "p.jsonl").string() + ":2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1 prompts skipped (0 over --max-prompt-tokens, 1 empty, the first at line 2)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 sequences"), std::string::npos) << r.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve
