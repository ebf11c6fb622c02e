// Parity of the transformer on the real default model (SmolLM2-135M-Instruct Q4_1) with
// llama.cpp: greedy tokens and top-5 logits recorded by tools/record_llama_reference.py
//  - tests/data/llama_ref/smollm2_greedy_f32.json: llama.cpp on the same weights converted to
//    F32 with an F32 K/V cache, i.e. the computation we do (weights dequantised to fp32 at load,
//    fp32 activations and K/V): strict (identical tokens, logits to 1e-3);
//  - tests/data/llama_ref/smollm2_greedy.json: llama.cpp on the Q4_1 file itself (Q8_1
//    activations, F16 K/V): loose, documented at its tolerances.
// A file of its own (not transformer_test.cpp) so that ctest runs these two ~30 s tests in
// parallel with the rest. The model is loaded once per process; one backend thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/sampling.h"
#include "model/transformer.h"
#include "tests/cpu/fp32_kernel_scope.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using nlohmann::json;

constexpr int64_t kBlockSize = 16;

int32_t blocks_for(int64_t tokens) { return static_cast<int32_t>((tokens + kBlockSize - 1) / kBlockSize); }

struct RefCase {
  std::string name;
  std::vector<int32_t> prompt;
  std::vector<int32_t> greedy;
  std::vector<std::vector<std::pair<int32_t, float>>> top5;
  std::vector<float> gap;
};

struct Reference {
  json meta;  // the top-level fields other than "cases"
  std::vector<RefCase> cases;
};

Reference load_reference(const std::string& rel) {
  json doc = json::parse(testing::read_file(testing::data_path(rel)));
  Reference ref;
  for (const auto& c : doc.at("cases")) {
    RefCase r;
    r.name = c.at("name").get<std::string>();
    r.prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
    r.greedy = c.at("greedy_ids").get<std::vector<int32_t>>();
    for (const auto& step : c.at("top5")) {
      std::vector<std::pair<int32_t, float>> s;
      for (const auto& e : step) s.emplace_back(e.at(0).get<int32_t>(), e.at(1).get<float>());
      r.top5.push_back(std::move(s));
    }
    r.gap = c.at("gap").get<std::vector<float>>();
    ref.cases.push_back(std::move(r));
  }
  doc.erase("cases");
  ref.meta = std::move(doc);
  return ref;
}

struct ParityStats {
  int64_t steps = 0, logits = 0;  // compared
  float worst = 0;                // max |top-5 logit diff|
  std::string worst_at;
  float gap_err = 0;  // max error of our logit(top1) - logit(top2), llama.cpp's top-2 ids
  std::vector<std::string> divergences;
};

class LlamaParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (model_ || error_) return;
    // The tolerances below are measured for the fp32 kernels; they hold when a run sets
    // SPECSERVE_CPU_MATMUL=vnni or amx for the whole suite too (the README gives those kernels'
    // distance from llama.cpp).
    fp32_ = new testing::Fp32MatmulScope();
    auto f = GgufFile::open(testing::default_model_path());
    if (!f.ok()) {
      error_ = new std::string(f.status().to_string() + " (fetch it with scripts/fetch-model.sh)");
      return;
    }
    file_ = new GgufFile(std::move(*f));
    backend_ = make_cpu_backend(1).release();
    auto m = Transformer::load(*file_, *backend_);
    if (!m.ok()) {
      error_ = new std::string(m.status().to_string());
      return;
    }
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete fp32_;
    fp32_ = nullptr;
    delete model_;
    delete backend_;
    delete file_;
    delete error_;
    model_ = nullptr;
    backend_ = nullptr;
    file_ = nullptr;
    error_ = nullptr;
  }
  void SetUp() override {
    // A missing model fails the test: it is part of the test setup (README's test command).
    ASSERT_EQ(error_, nullptr) << "cannot load " << testing::default_model_path() << ": " << *error_;
    ASSERT_NE(model_, nullptr);
  }
  static int64_t vocab() { return model_->config().vocab_size; }

  // Greedy decoding of every case's prompt, compared step by step with llama.cpp's: each of
  // llama.cpp's top-5 logits must be within logit_tol of ours; where our argmax differs from
  // llama.cpp's token, llama.cpp's top-2 gap must be < tie_gap and our token its runner-up,
  // and that prompt's comparison stops there (the contexts differ afterwards). Each prompt is
  // prefilled alone; decode steps then batch the prompts still being compared (batching does
  // not change a sequence's logits: transformer_test's SequenceLogitsDoNotDependOnTheBatch).
  static ParityStats compare_greedy(const std::vector<RefCase>& cases, float logit_tol, float tie_gap) {
    ParityStats st;
    int64_t total_blocks = 0;
    for (const auto& c : cases) total_blocks += blocks_for(static_cast<int64_t>(c.prompt.size() + c.greedy.size()));
    auto kv = model_->create_kv(total_blocks, kBlockSize);
    EXPECT_TRUE(kv.ok()) << kv.status().to_string();
    if (!kv.ok()) return st;
    KvStorage& cache = **kv;
    auto forward = [&](const ForwardBatch& b, ForwardOutput* out) {
      Status s = model_->forward(b, cache, out);
      EXPECT_TRUE(s.ok()) << s.to_string();
      return s.ok();
    };

    struct Live {
      size_t c;
      std::vector<int32_t> table;
      std::vector<int32_t> tokens;  // prompt + generated
      std::vector<float> logits;    // current step's logits
    };
    std::vector<Live> live;
    int32_t next_block = 0;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const auto& c = cases[ci];
      EXPECT_EQ(c.greedy.size(), c.top5.size()) << c.name;
      EXPECT_EQ(c.greedy.size(), c.gap.size()) << c.name;
      if (c.greedy.empty() || c.greedy.size() != c.top5.size() || c.greedy.size() != c.gap.size()) return st;
      Live l{ci, std::vector<int32_t>(static_cast<size_t>(blocks_for(static_cast<int64_t>(c.prompt.size() + c.greedy.size())))),
             c.prompt, {}};
      std::iota(l.table.begin(), l.table.end(), next_block);
      next_block += static_cast<int32_t>(l.table.size());
      ForwardBatch b;
      SequenceInput s;
      s.tokens = c.prompt;
      s.num_cached = 0;
      s.block_table = l.table;
      b.seqs.push_back(std::move(s));
      ForwardOutput o;
      if (!forward(b, &o)) return st;
      l.logits.assign(o.row(0, 0), o.row(0, 0) + vocab());
      live.push_back(std::move(l));
    }

    for (size_t step = 0; !live.empty(); ++step) {
      std::vector<Live> still;
      for (auto& l : live) {
        const RefCase& c = cases[l.c];
        for (const auto& [id, ref_logit] : c.top5[step]) {
          const float d = std::fabs(l.logits[static_cast<size_t>(id)] - ref_logit);
          ++st.logits;
          if (d > st.worst) {
            st.worst = d;
            st.worst_at = c.name + " step " + std::to_string(step) + " token " + std::to_string(id);
          }
          EXPECT_LE(d, logit_tol) << c.name << " step " << step << " token " << id << ": ours "
                                  << l.logits[static_cast<size_t>(id)] << ", llama.cpp " << ref_logit;
        }
        ++st.steps;
        const auto& t = c.top5[step];
        const float ours_gap = l.logits[static_cast<size_t>(t[0].first)] - l.logits[static_cast<size_t>(t[1].first)];
        st.gap_err = std::max(st.gap_err, std::fabs(ours_gap - (t[0].second - t[1].second)));
        const int32_t ours = Sampler::argmax(l.logits.data(), static_cast<int32_t>(vocab()));
        const int32_t theirs = c.greedy[step];
        if (ours != theirs) {
          EXPECT_LT(c.gap[step], tie_gap) << c.name << " step " << step << ": ours " << ours << ", llama.cpp " << theirs
                                          << " (llama.cpp top-2 gap " << c.gap[step] << ")";
          EXPECT_EQ(ours, t[1].first) << c.name << " step " << step << ": our token is not llama.cpp's runner-up";
          st.divergences.push_back(c.name + "@" + std::to_string(step) + " gap " + std::to_string(c.gap[step]));
          continue;
        }
        l.tokens.push_back(ours);
        if (step + 1 < c.greedy.size()) still.push_back(std::move(l));
      }
      live = std::move(still);
      if (live.empty()) break;
      ForwardBatch b;
      for (const auto& l : live) {
        SequenceInput s;
        s.tokens = {l.tokens.back()};
        s.num_cached = static_cast<int32_t>(l.tokens.size() - 1);
        s.block_table = l.table;
        b.seqs.push_back(std::move(s));
      }
      ForwardOutput o;
      if (!forward(b, &o)) return st;
      for (size_t i = 0; i < live.size(); ++i) {
        const float* row = o.row(static_cast<int32_t>(i), 0);
        live[i].logits.assign(row, row + vocab());
      }
    }
    return st;
  }

  static void report(const char* what, const ParityStats& st) {
    std::printf("%s: %lld steps, %lld top-5 logits compared; max |diff| %.6g at %s; max error of the top-2 "
                "difference %.6g; divergences: %zu\n",
                what, static_cast<long long>(st.steps), static_cast<long long>(st.logits), st.worst, st.worst_at.c_str(),
                st.gap_err, st.divergences.size());
    for (const auto& d : st.divergences) std::printf("  diverged at %s\n", d.c_str());
    ::testing::Test::RecordProperty("max_top5_logit_diff", std::to_string(st.worst));
    ::testing::Test::RecordProperty("divergences", static_cast<int>(st.divergences.size()));
  }

  static inline GgufFile* file_ = nullptr;
  static inline Backend* backend_ = nullptr;
  static inline Transformer* model_ = nullptr;
  static inline std::string* error_ = nullptr;
  static inline testing::Fp32MatmulScope* fp32_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Strict: llama.cpp on the same weights in F32 (llama_model_quantize, ftype ALL_F32: the exact
// dequantisation of the Q4_1 blocks) with an F32 K/V cache and flash attention off, 64 greedy
// steps per prompt, logits recorded to 6 decimals. Measured on the 10 prompts (640 steps, 3200
// top-5 logits, no divergence): max |logit diff| 3.4e-5 (chat_capital step 12), max error of
// the top-1 minus top-2 difference 3.1e-5: fp32 rounding only (summation order of the dot
// products, softmax, RMSNorm). The tolerance leaves a ~30x margin for other compilers, SIMD
// widths and BLAS builds, and is 760x tighter than the Q4_1 comparison below.
constexpr float kF32LogitTol = 1e-3f;
// The issue's rule: a different greedy token is accepted only where llama.cpp's own top two
// logits are within 1e-3 (the smallest recorded gap is 0.003, so none is expected).
constexpr float kF32TieGap = 1e-3f;

TEST_F(LlamaParityTest, GreedyDecodingMatchesLlamaCppF32) {
  const Reference ref = load_reference("llama_ref/smollm2_greedy_f32.json");
  ASSERT_EQ(ref.meta.at("n_vocab").get<int64_t>(), vocab());
  ASSERT_GE(ref.cases.size(), 10u);
  // What makes this the fp32 reference: the weight/KV types llama.cpp ran with, and the source
  // GGUF being the one the Q4_1 reference was recorded from (so the prompts are the same too).
  const json& r = ref.meta.at("reference");
  EXPECT_EQ(r.at("type_k"), "f32");
  EXPECT_EQ(r.at("type_v"), "f32");
  EXPECT_EQ(r.at("flash_attn"), false);
  EXPECT_EQ(r.at("weights").get<std::string>().rfind("f32", 0), 0u) << r.at("weights");
  const Reference q41 = load_reference("llama_ref/smollm2_greedy.json");
  EXPECT_EQ(ref.meta.at("model_sha256"), q41.meta.at("model_sha256"));
  ASSERT_EQ(ref.cases.size(), q41.cases.size());
  for (size_t i = 0; i < ref.cases.size(); ++i) {
    EXPECT_EQ(ref.cases[i].prompt, q41.cases[i].prompt) << ref.cases[i].name;
    EXPECT_EQ(ref.cases[i].greedy.size(), 64u) << ref.cases[i].name;
  }

  const ParityStats st = compare_greedy(ref.cases, kF32LogitTol, kF32TieGap);
  report("llama.cpp F32 parity", st);
  if (st.divergences.empty()) EXPECT_EQ(st.steps, static_cast<int64_t>(64 * ref.cases.size()));
}

// ---------------------------------------------------------------------------------------------
// Loose: llama.cpp on the Q4_1 file itself. Both use the same weights (Q4_1 blocks dequantise
// exactly), but llama.cpp quantises the activations to Q8_1 for every Q4_1 dot product and
// keeps K/V in fp16, while we compute in fp32 throughout. Measured on the 10 recorded prompts
// (249 compared steps, 1245 top-5 logits): max |logit diff| 0.761, max error of the top-1
// minus top-2 logit difference 0.506. That noise flips near-ties: 8 of the 10 prompts diverge,
// at llama.cpp top-2 gaps of 0.023 to 0.348, and each time our token is llama.cpp's runner-up;
// a tie gap of 1e-3 is therefore not attainable by any fp32 implementation against this file
// (the strict 1e-3 rule is checked against the F32 reference above).
constexpr float kQ41LogitTol = 1.0f;  // measured 0.761
// A greedy divergence is accepted where llama.cpp's top-2 gap is within the measured error of
// that gap (0.506) plus margin, and only if our token is llama.cpp's runner-up.
constexpr float kQ41TieGap = 0.75f;

TEST_F(LlamaParityTest, GreedyDecodingMatchesLlamaCpp) {
  const Reference ref = load_reference("llama_ref/smollm2_greedy.json");
  ASSERT_GE(ref.cases.size(), 8u);
  ASSERT_EQ(ref.meta.at("n_vocab").get<int64_t>(), vocab());
  const ParityStats st = compare_greedy(ref.cases, kQ41LogitTol, kQ41TieGap);
  report("llama.cpp Q4_1 parity", st);
  EXPECT_LE(st.gap_err, kQ41TieGap) << "the tie rule assumes the top-2 difference is this accurate";
}

}  // namespace
}  // namespace specserve
