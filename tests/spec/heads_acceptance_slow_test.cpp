// Offline acceptance of the committed heads (models/heads/) on Spec-Bench questions, without the
// engine's timing: the target greedily continues each question once, its final-norm hidden
// states of every position are recorded, then each proposer is driven step by step as the engine
// would (the hand-over of spec/proposer.h: the hidden states of the positions new since the last
// call) and its draft is walked greedily against the known continuation. Prints mean accepted
// length (tokens per target step) and acceptance by depth for the default configurations, with
// and without the draft vocabulary, and holds the heads to a floor (a regression check for a
// retrained head). This is where bench/results/heads_generate_*.md's offline figures come from.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "spec/eagle_proposer.h"
#include "spec/medusa_proposer.h"
#include "spec/token_tree.h"
#include "tests/spec/heads_test_util.h"
#include "tests/spec/spec_test_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace heads_testing;

struct Recorded {
  std::vector<int32_t> tokens;  // prompt + greedy continuation
  int32_t prompt_len = 0;
  std::vector<float> hidden;    // [tokens, d] the target's final-norm hidden state of each position
};

struct Acceptance {
  double mean_length = 0;            // tokens per target step (accepted + 1)
  std::vector<double> by_depth;      // fraction of steps whose depth-j token was accepted
  double propose_ms = 0;             // per step
};

class HeadsAcceptance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Backend& b = spec_testing::backend();
    target_ = new Target(open_target(testing::default_model_path(), b));
    ASSERT_TRUE(target_->model);
    Transformer& m = *target_->model;
    auto tok = Tokenizer::from_gguf(*target_->file);
    ASSERT_TRUE(tok.ok());
    auto kv = m.create_kv(64, 16);
    ASSERT_TRUE(kv.ok());
    std::vector<int32_t> table(64);
    for (int i = 0; i < 64; ++i) table[static_cast<size_t>(i)] = i;
    // Spec-Bench beside the checkout, as `specserve bench-spec` finds it; SPECSERVE_SPEC_BENCH
    // (the question.jsonl path) for a checkout elsewhere.
    const char* env = std::getenv("SPECSERVE_SPEC_BENCH");
    const std::string questions = env ? env : std::string(SPECSERVE_SOURCE_DIR) + "/../shared/data/spec_bench/question.jsonl";
    std::ifstream in(questions);
    ASSERT_TRUE(in.good()) << "Spec-Bench questions not found at " << questions << " (set SPECSERVE_SPEC_BENCH)";
    std::string line;
    int lineno = 0;
    while (std::getline(in, line) && recorded_.size() < 8) {
      if (lineno++ % 60 != 0) continue;  // spread over the tasks
      auto j = nlohmann::json::parse(line);
      auto text = apply_chat_template(*target_->file, {{"user", j["turns"][0].get<std::string>()}}, true);
      ASSERT_TRUE(text.ok());
      Recorded r;
      r.tokens = tok->encode(*text, true, true);
      if (r.tokens.size() > 320) continue;
      r.prompt_len = static_cast<int32_t>(r.tokens.size());
      ForwardBatch fb;
      SequenceInput s;
      s.tokens = r.tokens;
      s.block_table = table;
      fb.seqs.push_back(s);
      ForwardOutput fo;
      ASSERT_TRUE(m.forward(fb, **kv, &fo).ok());
      for (int g = 0; g < 64; ++g) {
        r.tokens.push_back(argmax(fo.row(0, 0), fo.vocab_size));
        ForwardBatch next;
        SequenceInput n;
        n.tokens = {r.tokens.back()};
        n.num_cached = static_cast<int32_t>(r.tokens.size()) - 1;
        n.block_table = table;
        next.seqs.push_back(n);
        ASSERT_TRUE(m.forward(next, **kv, &fo).ok());
      }
      ForwardBatch all;
      SequenceInput a;
      a.tokens = r.tokens;
      a.block_table = table;
      for (int32_t i = 0; i < static_cast<int32_t>(r.tokens.size()); ++i) a.hidden_rows.push_back(i);
      all.seqs.push_back(a);
      all.return_hidden = true;
      ASSERT_TRUE(m.forward(all, **kv, &fo).ok());
      r.hidden = fo.hidden;
      recorded_.push_back(std::move(r));
    }
    ASSERT_GE(recorded_.size(), 6u);
  }

  /// Drives `p` over every recorded continuation with node budget k; greedy walk of each draft.
  static Acceptance simulate(Proposer& p, int32_t k) {
    const int64_t d = target_->model->config().hidden_size;
    SamplingParams greedy;
    greedy.temperature = 0;
    int64_t steps = 0, emitted = 0;
    std::vector<int64_t> depth(64, 0);
    double seconds = 0;
    for (size_t si = 0; si < recorded_.size(); ++si) {
      const Recorded& r = recorded_[si];
      const int32_t end = static_cast<int32_t>(r.tokens.size());
      int32_t n = r.prompt_len, hb = 0;
      while (n < end) {
        DraftRequest q;
        q.seq_id = static_cast<int64_t>(si);
        q.tokens = std::span<const int32_t>(r.tokens.data(), static_cast<size_t>(n));
        q.prompt_len = r.prompt_len;
        q.num_tokens = k;
        q.sampling = &greedy;
        q.hidden_begin = hb;
        q.hidden = std::span<const float>(r.hidden.data() + hb * d, static_cast<size_t>((n - 1 - hb) * d));
        q.hidden_size = static_cast<int32_t>(d);
        std::vector<DraftTree> out;
        const auto t0 = std::chrono::steady_clock::now();
        EXPECT_TRUE(p.propose({q}, &out).ok());
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const DraftTree& t = out[0];
        int32_t acc = 0, v = -1;
        while (n + acc < end) {
          int32_t found = -1;
          for (size_t i = 0; i < t.tokens.size() && found < 0; ++i) {
            const int32_t parent = t.parents.empty() ? static_cast<int32_t>(i) - 1 : t.parents[i];
            if (parent == v && t.tokens[i] == r.tokens[static_cast<size_t>(n + acc)]) found = static_cast<int32_t>(i);
          }
          if (found < 0) break;
          v = found;
          ++depth[static_cast<size_t>(acc)];
          ++acc;
        }
        hb = n - 1;
        n += acc + 1;
        ++steps;
        emitted += acc + 1;
      }
      p.release(static_cast<int64_t>(si));
    }
    Acceptance a;
    a.mean_length = static_cast<double>(emitted) / static_cast<double>(steps);
    for (int j = 0; j < 6; ++j) a.by_depth.push_back(static_cast<double>(depth[static_cast<size_t>(j)]) / static_cast<double>(steps));
    a.propose_ms = seconds / static_cast<double>(steps) * 1e3;
    return a;
  }

  static void report(const std::string& name, int32_t k, const Acceptance& a) {
    std::printf("[heads] %-44s k=%2d  mean accepted length %.3f  propose %6.2f ms/step  by depth:", name.c_str(), k,
                a.mean_length, a.propose_ms);
    for (double x : a.by_depth) std::printf(" %.3f", x);
    std::printf("\n");
  }

  static Target* target_;
  static std::vector<Recorded> recorded_;
};

Target* HeadsAcceptance::target_ = nullptr;
std::vector<Recorded> HeadsAcceptance::recorded_;

const std::string kDir = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/";

TEST_F(HeadsAcceptance, DefaultConfigurationsOnSpecBench) {
  for (int64_t vocab : {int64_t{8192}, int64_t{0}}) {
    const std::string v = " vocab " + std::to_string(vocab);
    MedusaOptions mo;
    mo.draft_vocab_size = vocab;
    mo.tree_paths = medusa_mc_sim_7b_63();
    auto m = MedusaProposer::load(kDir + "medusa-smollm2-135m.gguf", *target_->model, *target_->file, mo);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    const Acceptance ma = simulate(**m, 8);
    report("medusa mc_sim_7b_63" + v, 8, ma);
    EagleOptions eo;
    eo.draft_vocab_size = vocab;
    auto e = EagleProposer::load(kDir + "eagle-smollm2-135m.gguf", *target_->model, *target_->file, eo);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    const Acceptance ea = simulate(**e, 8);
    report("eagle dynamic topk 4 depth 4" + v, 8, ea);
    eo.mode = EagleOptions::Mode::kChain;
    auto c = EagleProposer::load(kDir + "eagle-smollm2-135m.gguf", *target_->model, *target_->file, eo);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    const Acceptance ca = simulate(**c, 3);
    report("eagle chain" + v, 3, ca);
    // Floors well under what the committed heads reach (about 1.3, 1.45, 1.3): a head that
    // broke (wrong position, wrong features) accepts almost nothing.
    EXPECT_GT(ma.mean_length, 1.1);
    EXPECT_GT(ea.mean_length, 1.2);
    EXPECT_GT(ca.mean_length, 1.1);
  }
}

}  // namespace
}  // namespace specserve
