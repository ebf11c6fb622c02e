// The committed head files (models/heads/*.gguf) on the real target give what PyTorch computed
// from the same files (tests/data/heads_reference.json, written by tools/train/make_reference.py
// with the command recorded in it): the C++ loader and head code match the trainer's model.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "spec/eagle_proposer.h"
#include "spec/medusa_proposer.h"
#include "tests/cpu/fp32_kernel_scope.h"
#include "tests/spec/heads_test_util.h"
#include "tests/spec/spec_test_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using heads_testing::Target;

const std::string kHeads = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/";

nlohmann::json reference() {
  std::ifstream f(testing::data_path("heads_reference.json"));
  EXPECT_TRUE(f.good()) << testing::data_path("heads_reference.json");
  nlohmann::json j;
  f >> j;
  return j;
}

/// `got` [vocab] logits give the reference top-5 ids; an id may differ from the reference only
/// where two logits tie within `tol` (float32 sums in another order).
void expect_top5(const float* got, int64_t vocab, const std::vector<int32_t>& ids, const std::vector<float>& logits,
                 const std::string& what, float tol = 2e-3f) {
  std::vector<int32_t> top;
  top_k(got, static_cast<int32_t>(vocab), 5, &top);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_NEAR(got[ids[i]], logits[i], tol) << what << " rank " << i << " id " << ids[i];
    if (top[i] != ids[i]) {
      EXPECT_NEAR(got[top[i]], got[ids[i]], tol) << what << " rank " << i << ": got id " << top[i] << ", reference " << ids[i];
    }
  }
}

class HeadsReference : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = heads_testing::open_target(testing::default_model_path(), spec_testing::backend());
    ASSERT_TRUE(target_.model);
    ref_ = reference();
    ASSERT_EQ(ref_.value("format", ""), "specserve-heads-reference/1");
    ASSERT_EQ(ref_["target_fingerprint"].get<std::string>(), target_.fingerprint_hex)
        << "the reference was made for another target";
  }
  // The references are PyTorch's fp32 arithmetic: an fp32 matmul kernel also where the run set
  // SPECSERVE_CPU_MATMUL=vnni or amx (constructed before SetUp loads anything).
  testing::Fp32MatmulScope fp32_;
  Target target_;
  nlohmann::json ref_;
};

TEST_F(HeadsReference, MedusaTop5MatchesPyTorch) {
  auto m = MedusaProposer::load(kHeads + ref_["medusa_file"].get<std::string>(), *target_.model, *target_.file);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  const int K = ref_["medusa"]["num_heads"].get<int>();
  ASSERT_EQ((*m)->num_heads(), K);
  const int64_t vocab = target_.model->config().vocab_size;
  const auto& cases = ref_["medusa"]["cases"];
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    std::vector<float> h = c["hidden"].get<std::vector<float>>();
    std::vector<float> logits;
    ASSERT_TRUE((*m)->head_logits(h, 1, &logits).ok());
    for (int k = 0; k < K; ++k) {
      expect_top5(logits.data() + k * vocab, vocab, c["top5"][k].get<std::vector<int32_t>>(),
                  c["top5_logits"][k].get<std::vector<float>>(), "medusa case " + std::to_string(c["sequence"].get<int>()) + " head " + std::to_string(k));
    }
  }
}

TEST_F(HeadsReference, EagleTop5MatchesPyTorch) {
  auto e = EagleProposer::load(kHeads + ref_["eagle_file"].get<std::string>(), *target_.model, *target_.file);
  ASSERT_TRUE(e.ok()) << e.status().to_string();
  const int64_t vocab = target_.model->config().vocab_size, d = target_.model->config().hidden_size;
  const auto& cases = ref_["eagle"]["cases"];
  ASSERT_FALSE(cases.empty());
  for (const auto& c : cases) {
    const std::vector<int32_t> positions = c["positions"].get<std::vector<int32_t>>();
    const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
    std::vector<float> feats;
    for (const auto& f : c["features"]) {
      std::vector<float> row = f.get<std::vector<float>>();
      feats.insert(feats.end(), row.begin(), row.end());
    }
    std::vector<float> pred, logits;
    ASSERT_TRUE((*e)->teacher_forced(tokens, feats, positions[0], &pred, &logits).ok());
    for (size_t r = 0; r < tokens.size(); ++r) {
      const std::string what = "eagle case " + std::to_string(c["sequence"].get<int>()) + " row " + std::to_string(r);
      expect_top5(logits.data() + r * vocab, vocab, c["top5"][r].get<std::vector<int32_t>>(),
                  c["top5_logits"][r].get<std::vector<float>>(), what);
      const std::vector<float> first8 = c["feature_out_first8"][r].get<std::vector<float>>();
      for (size_t i = 0; i < first8.size(); ++i) EXPECT_NEAR(pred[r * d + i], first8[i], 2e-3) << what << " feature " << i;
    }
  }
}

}  // namespace
}  // namespace specserve
