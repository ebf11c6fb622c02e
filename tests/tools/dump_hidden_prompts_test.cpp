// `specserve dump-hidden`'s prompt file and sizing on the real default model: what a prompt row
// tokenizes to (special-token text as serving reads it), empty prompts and unknown keys reported,
// a run past the model's context or a KV cache too large for this machine refused naming the
// flags that size it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "tests/test_util.h"
#include "tools/cli/dump_hidden_lib.h"

namespace specserve::cli {
namespace {

// Each test loads the default model on a one-thread CPU backend.
class DumpHidden : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend_ = make_cpu_backend(1);
  Expected<LoadedModel> lm_ = load_model(specserve::testing::default_model_path(), *backend_, /*quiet=*/true);
};

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("dump_hidden_prompts_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(p);
  return p;
}

// Helper review of the CLI: past the model's context the error was the engine's ("max_model_len
// = 9004 exceeds the model's context length 8192"), a number the user never gave.
TEST_F(DumpHidden, PastTheContextTheErrorNamesTheFlagsAndWhatFits) {
  ASSERT_TRUE(lm_.ok()) << lm_.status().to_string();
  LoadedModel* lm = &*lm_;
  const int64_t ctx = lm->model->config().context_length;
  ASSERT_GT(ctx, 0);
  const auto dir = temp_dir("context");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello there\"}\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = static_cast<int32_t>(ctx);
  o.write_weights = false;
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  const std::string m = r.status().message();
  for (const std::string& w : std::vector<std::string>{"--max-new-tokens " + std::to_string(ctx), "--max-prompt-tokens",
                                                       "context length " + std::to_string(ctx), "lower --max-new-tokens to at most"}) {
    EXPECT_NE(m.find(w), std::string::npos) << "'" << w << "' in " << m;
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "out")) << "a failed dump leaves nothing";
  std::filesystem::remove_all(dir);
}

// The KV cache holds at most as many sequences as there are prompts (2 prompts with
// --max-num-seqs 1024 and --max-new-tokens 4000 asked for 189 GB: "not allocatable"); one that
// cannot be allocated names the flags that size it.
TEST_F(DumpHidden, TheKvCacheIsForThePromptsThereAreAndItsErrorNamesTheFlags) {
  ASSERT_TRUE(lm_.ok()) << lm_.status().to_string();
  LoadedModel* lm = &*lm_;
  const auto dir = temp_dir("kv_size");
  std::ofstream(dir / "two.jsonl") << "{\"prompt\": \"Hello there\"}\n{\"prompt\": \"Good morning\"}\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "two.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 4000;
  o.max_num_seqs = 1024;
  o.write_weights = false;
  const std::atomic<bool> stop{true};  // the engine is made, then the run stops before a step
  o.stop = &stop;
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().to_string();

  std::ofstream many(dir / "many.jsonl");
  for (int i = 0; i < 200; ++i) many << "{\"prompt\": \"Question " << i << "\"}\n";
  many.close();
  o.prompts_path = (dir / "many.jsonl").string();
  o.max_new_tokens = 8000;
  o.max_num_seqs = 256;
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().to_string();
  EXPECT_NE(r.status().message().find("200 sequence(s)"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("lower --max-num-seqs below 200 or --max-new-tokens"), std::string::npos) << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out")) << "a failed dump leaves nothing";
  std::filesystem::remove_all(dir);
}

TEST_F(DumpHidden, ReportsEmptyPromptsAndUnknownKeys) {
  // Empty prompts are skipped and reported (count, first line); "task" is allowed; another key
  // is ignored with one warning naming its line and key; max_new_tokens 1 still records every
  // prompt position (their rows come with the sequence's last step).
  ASSERT_TRUE(lm_.ok()) << lm_.status().to_string();
  LoadedModel* lm = &*lm_;
  const auto dir = temp_dir("empty");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello there\", \"task\": \"qa\"}\n"
                                    "{\"prompt\": \"\"}\n"
                                    "\n"
                                    "{\"messages\": [{\"role\": \"user\", \"content\": \"  \"}]}\n"
                                    "{\"prompt\": \"Good morning\", \"id\": 7}\n"
                                    "{\"prompt\": \"Good evening\", \"source\": \"x\"}\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 1;
  o.write_weights = false;
  std::vector<std::string> lines;
  auto sum = dump_hidden(*lm, o, [&](const std::string& l, bool) { lines.push_back(l); });
  ASSERT_TRUE(sum.ok()) << sum.status().to_string();
  EXPECT_EQ(sum->num_sequences, 3);
  EXPECT_EQ(sum->num_prompts_empty, 2);
  EXPECT_EQ(sum->first_empty_prompt_line, 2);
  EXPECT_EQ(sum->num_prompts_too_long, 0);
  EXPECT_EQ(sum->num_prompts_skipped, 2);
  ASSERT_EQ(sum->warnings.size(), 2u);
  EXPECT_NE(sum->warnings[0].find("2 unknown key(s)"), std::string::npos) << sum->warnings[0];
  EXPECT_NE(sum->warnings[0].find("p.jsonl:5: \"id\""), std::string::npos) << sum->warnings[0];
  EXPECT_NE(sum->warnings[1].find("2 empty prompt(s), the first at " + o.prompts_path + ":2"), std::string::npos) << sum->warnings[1];
  EXPECT_EQ(std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("warning: ", 0) == 0; }), 2);
  std::ifstream jf(dir / "out" / "index.json");
  const auto idx = nlohmann::json::parse(jf);
  EXPECT_EQ(idx["num_prompts_skipped"], 2);
  EXPECT_EQ(idx["num_prompts_empty"], 2);
  EXPECT_EQ(idx["first_empty_prompt_line"], 2);
  for (const auto& s : idx["sequences"]) {
    EXPECT_EQ(s["generated"], 1);
    EXPECT_EQ(s["length"], s["prompt_length"]) << "max_new_tokens 1: every prompt position, no generated one";
  }
  EXPECT_EQ(sum->num_generated, 0);
  EXPECT_EQ(sum->num_sequences_unrecorded, 0);

  // Nothing usable: bad input naming the counts.
  std::ofstream(dir / "empty.jsonl") << "{\"prompt\": \"\"}\n";
  o.prompts_path = (dir / "empty.jsonl").string();
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("no usable prompt (0 over --max-prompt-tokens 384, 1 empty)"), std::string::npos)
      << r.status().message();
  std::filesystem::remove_all(dir);
}

// A "prompt" row's special-token text ("<|im_start|>") is its token, as generate --prompt and the
// HTTP API read a prompt, so the dump trains on what is served. NOTE: it was tokenized as text
// (17 positions where serving has 5).
TEST_F(DumpHidden, APromptRowsSpecialTokenTextIsItsToken) {
  ASSERT_TRUE(lm_.ok()) << lm_.status().to_string();
  LoadedModel* lm = &*lm_;
  const auto dir = temp_dir("special");
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n";
  std::ofstream(dir / "p.jsonl") << nlohmann::json{{"prompt", text}}.dump() << "\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 1;
  o.write_weights = false;
  auto sum = dump_hidden(*lm, o);
  ASSERT_TRUE(sum.ok()) << sum.status().to_string();
  std::ifstream jf(dir / "out" / "index.json");
  const auto idx = nlohmann::json::parse(jf);
  const auto served = lm->tokenizer->encode(text, /*add_special=*/true, /*parse_special=*/true);
  ASSERT_EQ(idx["sequences"].size(), 1u);
  EXPECT_EQ(idx["sequences"][0]["prompt_length"], served.size());
  EXPECT_LT(served.size(), lm->tokenizer->encode(text, true, false).size()) << "the case is vacuous";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve::cli
