// The committed EAGLE head (models/heads/eagle-smollm2-135m.gguf) on the real target drafts, step
// after step, the greedy chain that PyTorch drafts from the same file and the same target features
// (tests/data/eagle_chain_reference.json, written by tools/train/eagle_chain_reference.py with the
// command recorded in it): its own predicted features fed back, its own KV, RoPE at the drafted
// positions. heads_reference_test checks one teacher-forced pass; this checks depth >= 2.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "spec/eagle_proposer.h"
#include "tests/spec/heads_test_util.h"
#include "tests/spec/spec_test_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using heads_testing::Target;

const std::string kHeads = std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/";

class EagleChainReference : public ::testing::Test {
 protected:
  void SetUp() override {
    target_ = heads_testing::open_target(testing::default_model_path(), spec_testing::backend());
    ASSERT_TRUE(target_.model);
    std::ifstream f(testing::data_path("eagle_chain_reference.json"));
    ASSERT_TRUE(f.good()) << testing::data_path("eagle_chain_reference.json");
    f >> ref_;
    ASSERT_EQ(ref_.value("format", ""), "specserve-eagle-chain-reference/1");
    ASSERT_EQ(ref_["target_fingerprint"].get<std::string>(), target_.fingerprint_hex)
        << "the reference was made for another target";
  }

  /// Drafts every case with `o` (num_tokens = the reference depth) and compares with the chain.
  void expect_chains(EagleOptions o, const std::string& what) {
    o.draft_vocab_size = ref_["draft_vocab"].get<int64_t>() == target_.model->config().vocab_size ? 0 : ref_["draft_vocab"].get<int64_t>();
    auto e = EagleProposer::load(kHeads + ref_["eagle_file"].get<std::string>(), *target_.model, *target_.file, o);
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    const int32_t depth = ref_["depth"].get<int32_t>();
    const auto& cases = ref_["cases"];
    ASSERT_FALSE(cases.empty());
    SamplingParams greedy{};
    int64_t id = 1;
    for (const auto& c : cases) {
      const std::vector<int32_t> tokens = c["tokens"].get<std::vector<int32_t>>();
      std::vector<float> feats;
      for (const auto& row : c["features"]) {
        std::vector<float> r = row.get<std::vector<float>>();
        feats.insert(feats.end(), r.begin(), r.end());
      }
      DraftRequest r;
      r.seq_id = id++;
      r.tokens = tokens;
      r.prompt_len = 1;
      r.num_tokens = depth;
      r.sampling = &greedy;
      r.hidden_begin = c["hidden_begin"].get<int32_t>();
      r.hidden = feats;
      r.hidden_size = static_cast<int32_t>(target_.model->config().hidden_size);
      std::vector<DraftTree> out;
      ASSERT_TRUE((*e)->propose({r}, &out).ok());
      ASSERT_EQ(out.size(), 1u);
      EXPECT_TRUE(out[0].parents.empty()) << what << ": a chain";
      EXPECT_EQ(out[0].tokens, c["chain"].get<std::vector<int32_t>>())
          << what << ", sequence " << c["sequence"].get<int>() << " (target's greedy: " << c["target_greedy"].dump() << ")";
    }
  }

  Target target_;
  nlohmann::json ref_;
};

TEST_F(EagleChainReference, ChainModeDraftsThePyTorchChain) {
  EagleOptions o;
  o.mode = EagleOptions::Mode::kChain;
  expect_chains(o, "chain mode");
}

TEST_F(EagleChainReference, DynamicTopOneDraftsThePyTorchChain) {
  EagleOptions o;
  o.topk = 1;
  o.depth = ref_["depth"].get<int32_t>();
  expect_chains(o, "dynamic, topk 1");
}

}  // namespace
}  // namespace specserve
