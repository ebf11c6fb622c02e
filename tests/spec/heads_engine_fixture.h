// Shared by the real-model Medusa / EAGLE engine tests (heads_engine_test.cpp, the default set;
// heads_engine_slow_test.cpp, the full matrix): the default model, the committed head files
// (models/heads/, trained by tools/train/train_all.sh), prompts from the recorded llama.cpp
// reference, and a runner that drives an Engine to the end.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "spec/eagle_proposer.h"
#include "spec/engine.h"
#include "spec/medusa_proposer.h"
#include "spec/token_tree.h"
#include "tests/test_util.h"

namespace specserve::heads_testing {

inline const std::string kMedusaFile = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/medusa-smollm2-135m.gguf";
inline const std::string kEagleFile = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/eagle-smollm2-135m.gguf";
/// The same heads with their matrices in Q8_0 (tools/train/quantize_head.py).
inline const std::string kMedusaQ8File = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/medusa-smollm2-135m.q8_0.gguf";
inline const std::string kEagleQ8File = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/eagle-smollm2-135m.q8_0.gguf";

struct EngineRun {
  std::vector<std::vector<int32_t>> tokens;  ///< per prompt
  SpecStats spec;
  EngineStats stats;
};

class HeadsEngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = make_cpu_backend(1).release();
    auto f = GgufFile::open(testing::default_model_path());
    ASSERT_TRUE(f.ok()) << f.status().to_string() << " (scripts/fetch-model.sh fetches it)";
    file_ = new GgufFile(std::move(*f));
    auto m = Transformer::load(*file_, *backend_);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = m->release();
    auto t = Tokenizer::from_gguf(*file_);
    ASSERT_TRUE(t.ok());
    tokenizer_ = new Tokenizer(std::move(*t));
    std::ifstream in(testing::data_path("llama_ref/smollm2_greedy.json"));
    ASSERT_TRUE(in.good());
    nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& p : j["cases"]) {
      std::vector<int32_t> ids = p["prompt_ids"].get<std::vector<int32_t>>();
      if (ids.size() > 96) ids.erase(ids.begin(), ids.end() - 96);  // keep prefill short on two cores
      prompts_.push_back(ids);
    }
    ASSERT_GE(prompts_.size(), 4u);
  }

  static std::unique_ptr<Proposer> medusa(const std::string& tree = "", int64_t draft_vocab = 0, const std::string& file = kMedusaFile) {
    MedusaOptions o;
    o.draft_vocab_size = draft_vocab;
    if (!tree.empty()) {
      auto t = parse_token_tree(tree);
      EXPECT_TRUE(t.ok()) << t.status().to_string();
      if (t.ok()) o.tree_paths = t->paths;
    } else {
      o.tree_paths = medusa_mc_sim_7b_63();
    }
    auto m = MedusaProposer::load(file, *model_, *file_, o);
    EXPECT_TRUE(m.ok()) << m.status().to_string();
    return m.ok() ? std::unique_ptr<Proposer>(std::move(*m)) : nullptr;
  }
  static std::unique_ptr<Proposer> eagle(EagleOptions o, const std::string& file = kEagleFile) {
    auto e = EagleProposer::load(file, *model_, *file_, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    return e.ok() ? std::unique_ptr<Proposer>(std::move(*e)) : nullptr;
  }

  /// Runs of the first `num_prompts` prompts, `batch` at a time, k = tree node budget; greedy
  /// unless `temperature` > 0 (then prompt i samples with seed `seed + i`); with
  /// EngineOptions::disable_by_goodput as given.
  static EngineRun run(Proposer* proposer, int32_t k, int32_t batch, int32_t max_tokens, size_t num_prompts,
                       float temperature = 0.0f, uint64_t seed = 0, bool disable_by_goodput = false) {
    EngineOptions o;
    o.disable_by_goodput = disable_by_goodput;
    o.max_num_seqs = batch;
    o.max_model_len = 512;
    o.num_speculative_tokens = proposer ? k : 0;
    auto e = Engine::create(*model_, tokenizer_, proposer, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    EngineRun r;
    if (!e.ok()) return r;
    r.tokens.resize(num_prompts);
    std::map<int64_t, size_t> which;
    for (size_t i = 0; i < num_prompts; ++i) {
      GenerateParams p;
      p.prompt = prompts_[i];
      p.max_tokens = max_tokens;
      p.sampling.temperature = temperature;
      if (temperature > 0) {
        p.sampling.seed = seed + i;
        p.sampling.has_seed = true;
      }
      p.sampling.ignore_eos = true;
      auto id = (*e)->add_request(p);
      EXPECT_TRUE(id.ok()) << id.status().to_string();
      if (id.ok()) which[*id] = i;
    }
    std::vector<SeqEvent> evs;
    int guard = 0;
    while ((*e)->has_work() && ++guard < 10000) {
      evs.clear();
      Status st = (*e)->step(&evs);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) break;
      for (const SeqEvent& ev : evs) {
        auto& out = r.tokens[which[ev.seq_id]];
        out.insert(out.end(), ev.tokens.begin(), ev.tokens.end());
      }
    }
    r.stats = (*e)->stats();
    r.spec = r.stats.spec;
    return r;
  }

  /// The default batch-4 head runs both greedy-identity tests compare: Medusa (mc_sim_7b_63
  /// trimmed to k = 6) and EAGLE (topk 3, depth 4, k = 6), 8192-id draft vocabulary, the first 4
  /// prompts, `max_tokens` each; the Q8_0 head files with `q8`. `ok` is false (after a failed
  /// EXPECT) when a head did not load.
  struct HeadsBatch4 {
    bool ok = false;
    EngineRun medusa, eagle;
  };
  static HeadsBatch4 run_heads_batch4(int32_t max_tokens, bool q8 = false) {
    HeadsBatch4 r;
    auto m = medusa("", 8192, q8 ? kMedusaQ8File : kMedusaFile);
    EagleOptions o;
    o.topk = 3;
    o.depth = 4;
    o.draft_vocab_size = 8192;
    auto e = eagle(o, q8 ? kEagleQ8File : kEagleFile);
    if (!m || !e) return r;
    r.medusa = run(m.get(), 6, 4, max_tokens, 4);
    r.eagle = run(e.get(), 6, 4, max_tokens, 4);
    r.ok = true;
    return r;
  }

  static Backend* backend_;
  static GgufFile* file_;
  static Transformer* model_;
  static Tokenizer* tokenizer_;
  static std::vector<std::vector<int32_t>> prompts_;
};

inline Backend* HeadsEngineTest::backend_ = nullptr;
inline GgufFile* HeadsEngineTest::file_ = nullptr;
inline Transformer* HeadsEngineTest::model_ = nullptr;
inline Tokenizer* HeadsEngineTest::tokenizer_ = nullptr;
inline std::vector<std::vector<int32_t>> HeadsEngineTest::prompts_;

}  // namespace specserve::heads_testing
