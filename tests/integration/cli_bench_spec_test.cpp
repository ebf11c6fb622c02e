// bench-spec and bench-model as a user runs them (the real binary): inputs refused before any
// work (an unwritable --output, bad questions, a --spec whose files are missing or of another
// method, batch sizes a task cannot fill), the tokens-per-step figures of a run, and
// bench-model's verification-step timings.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

using CmdResult = specserve::testing::CliResult;
using specserve::testing::temp_dir;

CmdResult run(const std::string& args, int timeout_s = 0) { return specserve::testing::run_specserve(args, timeout_s); }

// Bugs: bench-spec with --output in a missing directory ran, said "wrote" and exited 0 with no
// file; an empty questions file ran over nothing ("-nanx" speedups, exit 0); a number where a
// string belongs escaped as "specserve: error: [json.exception.type_error.302] ...".
TEST(CliChecks, BenchSpecRefusesAnUnwritableOutputAndBadQuestionsUpFront) {
  const std::string dir = temp_dir("bench_spec_checks");
  const std::string empty = dir + "/empty.jsonl", typed = dir + "/typed.jsonl";
  std::ofstream(empty) << "";
  std::ofstream(typed) << "{\"question_id\": 1, \"category\": \"writing\", \"turns\": [\"Hi\"]}\n"
                       << "{\"question_id\": 2, \"category\": 5, \"turns\": [\"Hi\"]}\n";
  const CmdResult o = run("bench-spec --model /nonexistent/target.gguf --questions " + empty + " --output " + dir + "/no/such/r.json");
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_NE(o.out.find("--output " + dir + "/no/such/r.json"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("wrote"), std::string::npos) << o.out;
  const CmdResult e = run("bench-spec --threads 1 --questions " + empty + " --max-tokens 2 --batch-sizes 1");
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_NE(e.out.find("holds no question"), std::string::npos) << e.out;
  const CmdResult t = run("bench-spec --threads 1 --questions " + typed + " --max-tokens 2 --batch-sizes 1");
  EXPECT_EQ(t.exit_code, 1) << t.out;
  EXPECT_NE(t.out.find(typed + ":2: needs a string 'category'"), std::string::npos) << t.out;
  // A malformed --spec is named before the model loads (it failed after the whole baseline),
  // and a batch size of 0 is a usage error.
  const CmdResult bad_spec = run("bench-spec --model /nonexistent/target.gguf --questions " + typed + " --spec '{bad'");
  EXPECT_EQ(bad_spec.exit_code, 2) << bad_spec.out;
  EXPECT_NE(bad_spec.out.find("--spec {bad: malformed JSON"), std::string::npos) << bad_spec.out;
  EXPECT_EQ(bad_spec.out.find("nonexistent"), std::string::npos) << "the model was opened first:\n" << bad_spec.out;
  // Its errors name bench-spec's flag, not serve's --speculative-config.
  const CmdResult no_head = run("bench-spec --questions " + typed + " --spec '{\"method\":\"eagle\",\"num_speculative_tokens\":2}'");
  EXPECT_EQ(no_head.exit_code, 2) << no_head.out;
  EXPECT_NE(no_head.out.find("--spec {\"method\":\"eagle\",\"num_speculative_tokens\":2}: speculative method eagle needs its "
                             "head file: \"model\": PATH\n"),
            std::string::npos)
      << no_head.out;
  EXPECT_EQ(no_head.out.find("--speculative-config"), std::string::npos) << no_head.out;
  const CmdResult zero = run("bench-spec --questions " + typed + " --batch-sizes 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.out;
  EXPECT_NE(zero.out.find("--batch-sizes"), std::string::npos) << zero.out;
  // A batch holds one task's questions: "--batch-sizes 3" with one question a task ran batches of
  // 1 under the heading "batch 3". A category Spec-Bench does not have counted as mt_bench; an
  // empty first turn was benchmarked; --max-tokens 1 leaves no decode phase ("-nanx" speedups).
  const std::string two = dir + "/two.jsonl", odd = dir + "/odd.jsonl", blank = dir + "/blank.jsonl";
  std::ofstream(two) << "{\"question_id\": 1, \"category\": \"writing\", \"turns\": [\"Hi\"]}\n"
                     << "{\"question_id\": 2, \"category\": \"qa\", \"turns\": [\"Hi\"]}\n"
                     << "{\"question_id\": 3, \"category\": \"qa\", \"turns\": [\"Hi\"]}\n";
  std::ofstream(odd) << "{\"question_id\": 1, \"category\": \"poetry\", \"turns\": [\"Hi\"]}\n";
  std::ofstream(blank) << "{\"question_id\": 1, \"category\": \"qa\", \"turns\": [\"\"]}\n";
  const CmdResult big = run("bench-spec --threads 1 --questions " + two + " --per-task 2 --max-tokens 2 --batch-sizes 1 2");
  EXPECT_EQ(big.exit_code, 2) << big.out;
  EXPECT_NE(big.out.find("--batch-sizes 2: a batch holds questions of one task, and mt_bench has 1 (--per-task 2)"),
            std::string::npos) << big.out;
  EXPECT_EQ(big.out.find("## batch"), std::string::npos) << "it ran before refusing:\n" << big.out;
  // --per-task already allows the batch, the file has too few of a task: it said "give --per-task 2 or more".
  const CmdResult few = run("bench-spec --threads 1 --questions " + two + " --per-task 2 --max-tokens 2 --batch-sizes 2");
  EXPECT_EQ(few.exit_code, 2) << few.out;
  EXPECT_NE(few.out.find("--questions holds only 1 of that task: give a smaller batch, or more of its questions"), std::string::npos)
      << few.out;
  EXPECT_EQ(few.out.find("give --per-task"), std::string::npos) << few.out;
  // A --spec whose head file is missing, or is a head of another method, is refused before
  // anything runs (it failed after the baseline and the methods before it, their results lost).
  const std::string heads = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/";
  const CmdResult missing = run("bench-spec --threads 1 --questions " + two + " --per-task 1 --max-tokens 2 --output " + dir +
                                "/part.json --spec '{\"method\":\"ngram\",\"num_speculative_tokens\":4}' --spec '{\"method\":\"eagle\",\"model\":\"" +
                                heads + "nope.gguf\",\"num_speculative_tokens\":4}'");
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_NE(missing.out.find("nope.gguf\",\"num_speculative_tokens\":4}: \"model\" " + heads + "nope.gguf: cannot open"),
            std::string::npos)
      << missing.out;
  EXPECT_EQ(missing.out.find("--speculative-config"), std::string::npos) << "bench-spec has no such flag:\n" << missing.out;
  EXPECT_EQ(missing.out.find("## batch"), std::string::npos) << "it ran before refusing:\n" << missing.out;
  EXPECT_EQ(missing.out.find("baseline"), std::string::npos) << "it ran before refusing:\n" << missing.out;
  const CmdResult other = run("bench-spec --threads 1 --questions " + two + " --per-task 1 --max-tokens 2 --spec '{\"method\":\"eagle\",\"model\":\"" +
                              heads + "medusa-smollm2-135m.gguf\",\"num_speculative_tokens\":4}'");
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("medusa-smollm2-135m.gguf: general.architecture = 'medusa': expected 'eagle'"), std::string::npos)
      << other.out;
  EXPECT_EQ(other.out.find("## batch"), std::string::npos) << "it ran before refusing:\n" << other.out;
  const CmdResult poetry = run("bench-spec --threads 1 --questions " + odd + " --max-tokens 2");
  EXPECT_EQ(poetry.exit_code, 1) << poetry.out;
  EXPECT_NE(poetry.out.find(odd + ":1: category 'poetry' is not a Spec-Bench task"), std::string::npos) << poetry.out;
  const CmdResult empty_turn = run("bench-spec --threads 1 --questions " + blank + " --max-tokens 2");
  EXPECT_EQ(empty_turn.exit_code, 1) << empty_turn.out;
  EXPECT_NE(empty_turn.out.find(blank + ":1: turns[0] is empty"), std::string::npos) << empty_turn.out;
  const CmdResult one = run("bench-spec --questions " + two + " --max-tokens 1");
  EXPECT_EQ(one.exit_code, 2) << one.out;
  EXPECT_NE(one.out.find("--max-tokens"), std::string::npos) << one.out;
  fs::remove_all(dir);
}

// bench-spec end to end on one question: the JSON's tokens per step (decode tokens / target steps
// after the first token, every step counted) is 1 for the baseline and, with n-gram drafts, at
// most the mean accepted tokens of the drafted steps; each step gives 1 + its accepted tokens.
TEST(CliChecks, BenchSpecReportsTokensPerStepOverEveryStep) {
  const std::string dir = temp_dir("bench_spec_steps");
  const std::string q = dir + "/q.jsonl", out = dir + "/r.json";
  std::ofstream(q) << "{\"question_id\": 7, \"category\": \"writing\", \"turns\": [\"Repeat exactly: one two three four five "
                      "six seven eight, one two three four five six seven eight, one two three four five six seven eight.\"]}\n";
  const CmdResult r = run("bench-spec --threads 1 --questions " + q + " --per-task 1 --max-tokens 24 --batch-sizes 1 --spec "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 3, \"prompt_lookup_min\": 1, \"prompt_lookup_max\": 3}' "
                          "--output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("tokens per step"), std::string::npos) << r.out;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j["runs"].size(), 2u);
  const nlohmann::json& base = j["runs"][0]["overall"];
  EXPECT_EQ(base["decode_tokens"].get<int64_t>(), 23);
  EXPECT_EQ(base["decode_steps"].get<int64_t>(), 23);
  EXPECT_EQ(base["tokens_per_step"].get<double>(), 1.0);
  const nlohmann::json& ng = j["runs"][1]["overall"];
  const int64_t tokens = ng["decode_tokens"].get<int64_t>(), steps = ng["decode_steps"].get<int64_t>();
  EXPECT_EQ(tokens, 23);
  EXPECT_GT(ng["num_accepted_tokens"].get<int64_t>(), 0) << "n-gram lookup accepted nothing on a repeating prompt";
  EXPECT_LT(steps, tokens);
  EXPECT_LE(tokens, steps + ng["num_accepted_tokens"].get<int64_t>());
  EXPECT_DOUBLE_EQ(ng["tokens_per_step"].get<double>(), static_cast<double>(tokens) / static_cast<double>(steps));
  EXPECT_LE(ng["tokens_per_step"].get<double>(), ng["mean_accepted_tokens"].get<double>() + 1e-9);
  // Where a decode step's time goes: at batch 1 one engine step per decode step; the baseline
  // proposes nothing; proposer + target forward fit in the step.
  EXPECT_NE(r.out.find("Time per engine step in the decode phase"), std::string::npos) << r.out;
  EXPECT_EQ(base["decode_engine_steps"].get<int64_t>(), 23);
  EXPECT_EQ(ng["decode_engine_steps"].get<int64_t>(), steps);
  EXPECT_EQ(base["draft_ms_per_engine_step"].get<double>(), 0.0);
  for (const nlohmann::json* o : {&base, &ng}) {
    const double all = (*o)["ms_per_engine_step"].get<double>(), draft = (*o)["draft_ms_per_engine_step"].get<double>();
    const double fwd = (*o)["forward_ms_per_engine_step"].get<double>();
    EXPECT_GT(fwd, 0.0);
    EXPECT_GE(draft, 0.0);
    EXPECT_LE(draft + fwd, all + 1e-9);
    EXPECT_NEAR((*o)["other_ms_per_engine_step"].get<double>(), all - draft - fwd, 1e-9);
  }
  fs::remove_all(dir);
}

// bench-model --verify-rows: one sequence's verification steps of N chain rows, as ms and as a
// ratio to its 1-row step (the 1-row entry is that step itself); out-of-range counts are usage
// errors.
TEST(CliChecks, BenchModelTimesVerificationStepsAndRefusesImpossibleRowCounts) {
  const std::string dir = temp_dir("bench_model_verify");
  const std::string out = dir + "/r.json";
  const CmdResult r = run("bench-model --synthetic llama-tiny --threads 1 --prompt-lengths 4 --decode-context 8 --decode-tokens 2 "
                          "--repeats 1 --verify-rows 3 1 3 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const size_t at = r.out.find("verify 3 rows after 8 cached");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("verify 3 rows after 8 cached", at + 1), std::string::npos) << "a repeated row count was timed twice:\n" << r.out;
  std::ifstream in(out);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_TRUE(j.contains("verify")) << j.dump();
  EXPECT_EQ(j["verify"]["1"]["ratio_to_one_row"].get<double>(), 1.0);
  EXPECT_GT(j["verify"]["3"]["ms_per_step"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(j["verify"]["3"]["ratio_to_one_row"].get<double>(),
                   j["verify"]["3"]["ms_per_step"].get<double>() / j["verify"]["1"]["ms_per_step"].get<double>());
  for (const char* bad : {"0", "65"}) {
    const CmdResult b = run(std::string("bench-model --synthetic llama-tiny --verify-rows ") + bad);
    EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.out;
    EXPECT_NE(b.out.find("--verify-rows"), std::string::npos) << b.out;
  }
  // Rows that do not fit the context after the prompt: named with the context.
  const CmdResult big = run("bench-model --synthetic llama-tiny --decode-context 8180 --prompt-lengths 4 --decode-tokens 2 --verify-rows 64");
  EXPECT_EQ(big.exit_code, 2) << big.out;
  EXPECT_NE(big.out.find("--verify-rows: 64"), std::string::npos) << big.out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace specserve
