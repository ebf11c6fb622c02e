// `specserve generate` as a user runs it (the real binary): a model whose weights are corrupt
// (NaN in output_norm, so every logit is NaN) must not look like a success. The engine ends the
// sequence with finish reason "error"; the command says why on stderr and exits 1, instead of
// printing an empty completion and exiting 0 — under the default kernel and the int8 one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "model/gguf.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using CliRun = specserve::testing::CliResult;

CliRun run(const std::string& args) { return specserve::testing::run_specserve("generate " + args); }

/// A copy of the default model with every value of the F32 tensor `name` set to NaN.
std::filesystem::path nan_model_copy(const std::string& name, const std::filesystem::path& dir) {
  std::ifstream in(specserve::testing::default_model_path(), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto file = GgufFile::from_memory(bytes.data(), bytes.size(), "copy");
  if (!file.ok()) return {};
  const GgufTensorInfo* t = file->find_tensor(name);
  if (t == nullptr || t->type() != GgmlType::F32) return {};
  const size_t at = static_cast<size_t>(t->data - bytes.data());
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t i = 0; i < t->num_elements; ++i) std::memcpy(bytes.data() + at + 4 * i, &nan, 4);
  const auto out = dir / "nan.gguf";
  std::ofstream(out, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return out;
}

// The completion `generate` printed: its output without log lines ("[HH:MM:SS.mmm] [...") up to
// the statistics ("--- prompt tokens").
std::string completion(const std::string& out) {
  static const std::regex log_line(R"(^\[\d\d:\d\d:\d\d\.\d{3}\] \[)");
  std::string text;
  size_t begin = 0;
  while (begin < out.size()) {
    const size_t end = out.find('\n', begin);
    const std::string line = out.substr(begin, end == std::string::npos ? std::string::npos : end + 1 - begin);
    begin = end == std::string::npos ? out.size() : end + 1;
    if (line.rfind("--- prompt tokens", 0) == 0) break;
    if (!std::regex_search(line, log_line)) text += line;
  }
  return text;
}

TEST(GenerateCli, CorruptWeightsExitOneNamingTheError) {
  const auto dir = std::filesystem::temp_directory_path() / ("generate_cli_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto model = nan_model_copy("output_norm.weight", dir);
  ASSERT_FALSE(model.empty()) << "could not write a NaN copy of the default model";
  // Also under the int8 kernel, whose x quantisation would otherwise turn the NaN rows into
  // zeros (finite logits, token 0); on a CPU without avx512vnni the process says so and runs
  // the fp32 kernel, and the check repeats the first.
  for (const char* kernel : {"", "SPECSERVE_CPU_MATMUL=vnni"}) {
    for (const char* mode : {"--temperature 0", "--temperature 1 --seed 1"}) {
      const CliRun r = specserve::testing::run_specserve(
          "generate --model " + model.string() + " --threads 1 --max-tokens 4 --chat Hello " + mode, 0, kernel);
      EXPECT_EQ(r.exit_code, 1) << kernel << " " << mode << "\n" << r.out;
      EXPECT_NE(r.out.find("finish: error"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("specserve generate: the generation failed: the target model produced non-finite logits"),
                std::string::npos)
          << r.out;
    }
  }
  // The intact model still exits 0.
  const CliRun ok = run("--model " + specserve::testing::default_model_path() + " --threads 1 --max-tokens 2 --prompt Hello");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
  std::filesystem::remove_all(dir);
}

// A block-format weight with an infinite or NaN scale (here one fp16 d of the tied output head,
// token 1000's first block) is refused as the model loads, naming tensor, row and scale. It used
// to load: the fp32 kernel then gave non-finite logits, while the int8 kernel gave token 1000 a
// logit of -inf and generated normal-looking text.
TEST(GenerateCli, AnInfiniteBlockScaleIsRefusedAtLoadNamingTheTensor) {
  const auto dir = std::filesystem::temp_directory_path() / ("generate_cli_scale_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ifstream in(specserve::testing::default_model_path(), std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto file = GgufFile::from_memory(bytes.data(), bytes.size(), "copy");
  ASSERT_TRUE(file.ok()) << file.status().to_string();
  const GgufTensorInfo* t = file->find_tensor("token_embd.weight");
  ASSERT_TRUE(t != nullptr && t->type() == GgmlType::Q8_0 && t->shape[0] % 32 == 0);
  const size_t at = static_cast<size_t>(t->data - bytes.data()) + static_cast<size_t>(1000 * (t->shape[0] / 32) * 34);
  const uint16_t inf = 0x7c00;
  std::memcpy(bytes.data() + at, &inf, 2);
  const auto model = dir / "inf_scale.gguf";
  std::ofstream(model, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  for (const char* kernel : {"", "SPECSERVE_CPU_MATMUL=vnni"}) {
    const CliRun r = specserve::testing::run_specserve("generate --model " + model.string() + " --threads 1 --max-tokens 4 --prompt Hello", 0,
                                                       kernel);
    EXPECT_EQ(r.exit_code, 2) << kernel << "\n" << r.out;
    EXPECT_NE(r.out.find("tensor 'token_embd.weight' (Q8_0): block " + std::to_string(1000 * (t->shape[0] / 32)) +
                         " of "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("(row 1000, columns 0..31) has scale d = inf: the file is corrupt"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("generated tokens"), std::string::npos) << r.out;
  }
  std::filesystem::remove_all(dir);
}

// An empty --model / --speculative-model (`--model "$UNSET"`) is refused naming the flag, not
// taken as the flag left out (the default model; no draft model, so n-gram lookup).
TEST(GenerateCli, EmptyModelPathsAreRefused) {
  for (const char* flag : {"--model", "--speculative-model"}) {
    const CliRun r = run(std::string(flag) + " '' --threads 1 --max-tokens 2 --num-speculative-tokens 2 --prompt Hello");
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string(flag) + ": an empty path"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("generated tokens"), std::string::npos) << r.out;
  }
}

// So is an empty or blank --speculative-config: it used to run without speculation silently.
TEST(GenerateCli, EmptySpeculativeConfigIsRefused) {
  for (const char* value : {"''", "' '"}) {
    const CliRun r = run(std::string("--speculative-config ") + value + " --threads 1 --max-tokens 2 --prompt Hello");
    EXPECT_EQ(r.exit_code, 2) << value << "\n" << r.out;
    EXPECT_NE(r.out.find("--speculative-config: empty: give a JSON object"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("generated tokens"), std::string::npos) << r.out;
  }
  // bench-spec's --spec takes the same JSON: an empty one ran as a second, mislabelled baseline.
  const CliRun b = specserve::testing::run_specserve("bench-spec --spec '' --per-task 1 --max-tokens 2");
  EXPECT_EQ(b.exit_code, 2) << b.out;
  EXPECT_NE(b.out.find("--spec: empty: give a JSON object"), std::string::npos) << b.out;
}

// --system applies to --chat only: with --prompt it was silently ignored.
TEST(GenerateCli, SystemWithoutChatIsRefused) {
  const CliRun r = run("--system 'be brief' --prompt Hello --max-tokens 2");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--system requires --chat"), std::string::npos) << r.out;
}

// Bug: CLI11 reads an int64 flag with strtoll and ignores ERANGE, so --seed 99999999999999999999
// (or 18446744073709551615) ran with the seed 9223372036854775807, silently. A --seed outside
// [0, 2^63 - 1] is refused naming the flag and the value, before the model loads.
TEST(GenerateCli, OutOfRangeSeedsAreRefusedNotClamped) {
  for (const char* seed : {"99999999999999999999", "18446744073709551615", "9223372036854775808", "-1",
                           "-9223372036854775809", "1.5", "x", "010", "0x10"}) {
    const CliRun r = run(std::string("--threads 1 --max-tokens 2 --temperature 1 --prompt Hello --seed ") + seed);
    EXPECT_EQ(r.exit_code, 2) << seed << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string("--seed: ") + seed + ": must be an integer in [0, 9223372036854775807]"), std::string::npos)
        << r.out;
    EXPECT_EQ(r.out.find("generated tokens"), std::string::npos) << r.out;
  }
  const CliRun ok = run("--threads 1 --max-tokens 2 --temperature 1 --prompt Hello --seed 9223372036854775807");
  EXPECT_EQ(ok.exit_code, 0) << ok.out;
}

// The KV cache of `generate` holds its one sequence: the prompt, --max-tokens (at most
// --max-model-len) and a step's drafts. NOTE: it was the engine's default of 4 sequences of
// max_model_len, ~1.5 GB for the default model (1.7 GB resident to generate 4 tokens).
// Generating up to --max-model-len with drafts that keep their own KV (draft_model, an EAGLE tree)
// still fits and gives the target's tokens.
TEST(GenerateCli, TheKvCacheHoldsOneSequenceOfThePromptAndMaxTokens) {
  const CliRun small = run("--threads 1 --max-tokens 8 --prompt 'Tell me a story'");
  ASSERT_EQ(small.exit_code, 0) << small.out;
  const size_t at = small.out.find("KV cache: ");
  ASSERT_NE(at, std::string::npos) << small.out;
  int blocks = 0, block_size = 0;
  double mib = 0;
  ASSERT_EQ(std::sscanf(small.out.c_str() + at, "KV cache: %d blocks of %d tokens (%lf MiB)", &blocks, &block_size, &mib), 3)
      << small.out;
  const size_t pt = small.out.find("prompt tokens: ");
  ASSERT_NE(pt, std::string::npos) << small.out;
  const int prompt_tokens = std::atoi(small.out.c_str() + pt + std::strlen("prompt tokens: "));
  EXPECT_EQ(blocks, (prompt_tokens + 8 + 64 + 2 * block_size + block_size - 1) / block_size) << small.out;
  EXPECT_LT(mib, 16.0) << small.out;

  const std::string until = "--threads 1 --max-tokens 1000 --ignore-eos --max-model-len 48 --prompt 'Tell me a story'";
  const CliRun plain = run(until);
  ASSERT_EQ(plain.exit_code, 0) << plain.out;
  EXPECT_NE(plain.out.find("generated tokens: 44 | finish: length"), std::string::npos) << plain.out;
  const std::string text = completion(plain.out);
  ASSERT_FALSE(text.empty()) << plain.out;
  const std::string heads = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/eagle-smollm2-135m.q8_0.gguf";
  // Each spec with the drafts it makes at least: the self-draft is accepted whole (8 tokens a
  // draft: ~5 drafts); the topk-64 tree drafts in most of its ~40 steps (without its own blocks
  // for the 64 x 3 tree rows a step past the sequence's tokens: 2 or 3, at the end).
  const std::pair<std::string, int> specs[] = {
      {"--speculative-model " + specserve::testing::default_model_path() + " --num-speculative-tokens 8", 3},
      {"--speculative-config '{\"method\":\"eagle\",\"model\":\"" + heads +
           "\",\"num_speculative_tokens\":16,\"eagle_topk\":4,\"eagle_depth\":6}'",
       10},
      {"--speculative-config '{\"method\":\"eagle\",\"model\":\"" + heads +
           "\",\"num_speculative_tokens\":64,\"eagle_topk\":64,\"eagle_depth\":4}'",
       10}};
  for (const auto& [spec, min_drafts] : specs) {
    const CliRun r = run(until + " " + spec);
    ASSERT_EQ(r.exit_code, 0) << spec << "\n" << r.out;
    EXPECT_NE(r.out.find("generated tokens: 44 | finish: length"), std::string::npos) << r.out;
    const size_t st = r.out.find("): drafts ");
    ASSERT_NE(st, std::string::npos) << r.out;
    EXPECT_GE(std::atoi(r.out.c_str() + st + std::strlen("): drafts ")), min_drafts) << spec << ": it hardly drafted\n" << r.out;
    EXPECT_EQ(completion(r.out), text) << spec << "\n" << r.out << "\nwithout speculation:\n" << plain.out;
  }
}

}  // namespace
}  // namespace specserve
