// Speculative decoding on the real default model (SmolLM2-135M-Instruct Q4_1): every method
// that runs on it without a second model (ngram, layer_skip) gives, greedy, token-for-token the
// output of plain decoding, alone and in a batch of 8, with logprobs equal too; and the
// speculative counters show that drafts were accepted. Prompts come from the recorded llama.cpp
// reference (chat and plain), cut to keep the run short on two cores.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "spec/engine.h"
#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

struct SpecRun {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<float>> logprobs;
  SpecStats spec;
};

class RealModelSpecTest : public ::testing::Test {
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
      // The tail of long prompts: n-gram lookup still finds the passage's phrases.
      if (ids.size() > 160) ids.erase(ids.begin(), ids.end() - 160);
      prompts_.push_back(ids);
      if (prompts_.size() == 8) break;
    }
  }

  SpecRun run(Proposer* proposer, int32_t k, int32_t batch, int32_t max_tokens) {
    EngineOptions o;
    o.max_num_seqs = batch;
    o.max_model_len = 1024;
    o.num_speculative_tokens = proposer ? k : 0;
    auto e = Engine::create(*model_, tokenizer_, proposer, o);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    SpecRun r;
    std::map<int64_t, int64_t> which;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      GenerateParams p;
      p.prompt = prompts_[i];
      p.max_tokens = max_tokens;
      p.sampling.temperature = 0;
      p.sampling.ignore_eos = true;
      p.sampling.logprobs = 1;
      auto id = (*e)->add_request(p);
      EXPECT_TRUE(id.ok());
      which[*id] = static_cast<int64_t>(i);
    }
    std::vector<SeqEvent> evs;
    while ((*e)->has_work()) {
      evs.clear();
      Status st = (*e)->step(&evs);
      EXPECT_TRUE(st.ok()) << st.to_string();
      if (!st.ok()) break;
      for (const auto& ev : evs) {
        auto& t = r.tokens[which[ev.seq_id]];
        t.insert(t.end(), ev.tokens.begin(), ev.tokens.end());
        for (const auto& lp : ev.logprobs) r.logprobs[which[ev.seq_id]].push_back(lp.logprob);
      }
    }
    r.spec = (*e)->stats().spec;
    EXPECT_EQ((*e)->block_pool().num_free(), (*e)->block_pool().num_blocks()) << "KV blocks leaked";
    return r;
  }

  static Backend* backend_;
  static GgufFile* file_;
  static Transformer* model_;
  static Tokenizer* tokenizer_;
  static std::vector<std::vector<int32_t>> prompts_;
};

Backend* RealModelSpecTest::backend_ = nullptr;
GgufFile* RealModelSpecTest::file_ = nullptr;
Transformer* RealModelSpecTest::model_ = nullptr;
Tokenizer* RealModelSpecTest::tokenizer_ = nullptr;
std::vector<std::vector<int32_t>> RealModelSpecTest::prompts_;

void expect_same(const SpecRun& base, const SpecRun& spec, const std::string& what) {
  ASSERT_EQ(base.tokens.size(), spec.tokens.size()) << what;
  for (const auto& [i, toks] : base.tokens) {
    EXPECT_EQ(spec.tokens.at(i), toks) << what << ": prompt " << i;
    const auto& a = base.logprobs.at(i);
    const auto& b = spec.logprobs.at(i);
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t t = 0; t < a.size(); ++t) EXPECT_EQ(a[t], b[t]) << what << ": prompt " << i << " token " << t;
  }
  EXPECT_GT(spec.spec.num_accepted_tokens, 0) << what << ": no draft token was accepted, the test would be vacuous";
}

TEST_F(RealModelSpecTest, GreedyNgramAndLayerSkipEqualPlainDecodingAloneAndBatched) {
  const SpecRun base1 = run(nullptr, 0, 1, 24);
  const SpecRun base8 = run(nullptr, 0, 8, 24);
  EXPECT_EQ(base1.tokens, base8.tokens) << "batch of 8 differs from each prompt alone";
  NgramProposer ngram(1, 5);
  expect_same(base1, run(&ngram, 4, 1, 24), "ngram k=4 batch 1");
  expect_same(base8, run(&ngram, 4, 8, 24), "ngram k=4 batch 8");
  DrafterOptions o;
  o.name = "layer_skip";
  o.num_layers = 20;
  o.max_model_len = 1024;
  auto ls = ModelDrafter::create(*model_, o);
  ASSERT_TRUE(ls.ok()) << ls.status().to_string();
  expect_same(base1, run(ls->get(), 3, 1, 24), "layer_skip k=3 batch 1");
  expect_same(base8, run(ls->get(), 2, 8, 24), "layer_skip k=2 batch 8");
}

// True when `s` is well-formed UTF-8 (RFC 3629: no overlongs, surrogates or values past U+10FFFF).
bool well_formed_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// A stop string makes the engine hold back the text's last bytes (a stop string may be
// starting there); the cut must not split a multi-byte character: every event's text is
// well-formed UTF-8 on its own (an HTTP stream's deltas are JSON strings, which would turn a
// split character into U+FFFD), and the events add up to the text without stop strings — plain
// and with n-gram speculation, for stop strings of several lengths that never match.
TEST_F(RealModelSpecTest, StreamedTextWithStopStringsNeverSplitsACharacter) {
  const std::vector<int32_t> prompt = tokenizer_->encode("日本語の文章を書いてください。日本語の文章", true, false);
  NgramProposer ngram(1, 3);
  std::string reference;
  for (const std::vector<std::string>& stops : std::vector<std::vector<std::string>>{{}, {"xy"}, {"xyz"}, {"xyz12"}, {"@@", "never matches"}}) {
    for (Proposer* proposer : {static_cast<Proposer*>(nullptr), static_cast<Proposer*>(&ngram)}) {
      EngineOptions o;
      o.max_model_len = 512;
      o.num_speculative_tokens = proposer ? 4 : 0;
      auto e = Engine::create(*model_, tokenizer_, proposer, o);
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      GenerateParams p;
      p.prompt = prompt;
      p.max_tokens = 40;
      p.sampling.temperature = 0;
      p.sampling.ignore_eos = true;
      p.stop = stops;
      ASSERT_TRUE((*e)->add_request(p).ok());
      std::string text;
      int events = 0;
      std::vector<SeqEvent> evs;
      while ((*e)->has_work()) {
        evs.clear();
        ASSERT_TRUE((*e)->step(&evs).ok());
        for (const auto& ev : evs) {
          EXPECT_TRUE(well_formed_utf8(ev.text)) << "event " << events << " of stops[0] = '" << (stops.empty() ? "" : stops[0])
                                                 << "' splits a character: '" << ev.text << "'";
          text += ev.text;
          events += !ev.text.empty();
        }
      }
      const std::string what = std::string(proposer ? "ngram" : "plain") + ", " + std::to_string(stops.size()) + " stop strings";
      if (stops.empty() && !proposer) {
        reference = text;
        // Not vacuous: the output holds characters of several bytes, some of them split over
        // tokens (bytes of one character in two tokens).
        size_t multibyte = 0;
        for (unsigned char c : text) multibyte += c >= 0xC0;
        ASSERT_GE(multibyte, 10u) << "the output has too few multi-byte characters to test with: '" << text << "'";
        EXPECT_GT(events, 10) << what;
      } else {
        EXPECT_EQ(text, reference) << what;
      }
    }
  }
}

}  // namespace
}  // namespace specserve
