// The transformer on the real default model (SmolLM2-135M-Instruct Q4_1):
//  - invariances the speculative engine relies on (model/backend.h's determinism contract):
//    a token tree equals its root-to-leaf paths run as chains, chunked prefill equals one
//    chunk, a sequence's logits do not depend on what else is in the batch; bit for bit;
//  - input validation (Status naming the sequence and field);
//  (parity with llama.cpp: tests/model/llama_parity_test.cpp);
//  - the Engine: the same prompts batched together give the tokens each gives alone, also when
//    the KV cache is too small and sequences are preempted.
// The model is loaded once per process (SetUpTestSuite); one backend thread (ctest runs test
// processes in parallel).
#include "model/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/sampling.h"
#include "model/tokenizer.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using nlohmann::json;

constexpr int64_t kBlockSize = 16;

float max_abs_diff(const float* a, const float* b, int64_t n) {
  float m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// Consecutive block ids [first, first + n).
std::vector<int32_t> blocks(int32_t first, int32_t n) {
  std::vector<int32_t> b(static_cast<size_t>(n));
  std::iota(b.begin(), b.end(), first);
  return b;
}

int32_t blocks_for(int64_t tokens) { return static_cast<int32_t>((tokens + kBlockSize - 1) / kBlockSize); }

class ModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (model_ || error_) return;
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
    auto t = Tokenizer::from_gguf(*file_);
    if (!t.ok()) {
      error_ = new std::string(t.status().to_string());
      return;
    }
    tokenizer_ = new Tokenizer(std::move(*t));
    model_ = m->release();
  }
  static void TearDownTestSuite() {
    delete model_;
    delete tokenizer_;
    delete backend_;
    delete file_;
    delete error_;
    model_ = nullptr;
    tokenizer_ = nullptr;
    backend_ = nullptr;
    file_ = nullptr;
    error_ = nullptr;
  }
  void SetUp() override {
    // A missing model fails the test: it is part of the test setup (README's test command).
    ASSERT_EQ(error_, nullptr) << "cannot load " << testing::default_model_path() << ": " << *error_;
    ASSERT_NE(model_, nullptr);
  }

  static std::unique_ptr<KvStorage> kv(int64_t num_blocks) {
    auto k = model_->create_kv(num_blocks, kBlockSize);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    return k.ok() ? std::move(*k) : nullptr;
  }
  static int64_t vocab() { return model_->config().vocab_size; }
  static std::vector<int32_t> encode(const std::string& text) { return tokenizer_->encode(text, true, false); }

  // Runs `batch`; fails the test on a Status.
  static ForwardOutput run(const ForwardBatch& batch, KvStorage& kv) {
    ForwardOutput out;
    Status st = model_->forward(batch, kv, &out);
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
  static SequenceInput seq(std::vector<int32_t> tokens, int32_t num_cached, std::vector<int32_t> table,
                           bool all_rows = false) {
    SequenceInput s;
    s.tokens = std::move(tokens);
    s.num_cached = num_cached;
    s.block_table = std::move(table);
    if (all_rows) {
      s.logit_rows.resize(s.tokens.size());
      std::iota(s.logit_rows.begin(), s.logit_rows.end(), 0);
    }
    return s;
  }
  static ForwardOutput run_one(SequenceInput s, KvStorage& kv) {
    ForwardBatch b;
    b.seqs.push_back(std::move(s));
    return run(b, kv);
  }

  static inline GgufFile* file_ = nullptr;
  static inline Backend* backend_ = nullptr;
  static inline Transformer* model_ = nullptr;
  static inline Tokenizer* tokenizer_ = nullptr;
  static inline std::string* error_ = nullptr;
};

const char* kText =
    "The history of the lighthouse is, in many ways, the history of maritime trade itself. Long before the "
    "invention of the electric lamp, coastal communities lit fires on hilltops and cliffs to warn sailors of "
    "dangerous rocks and to guide them safely into harbour. The most famous of these early structures was the "
    "Pharos of Alexandria, built in the third century BC on a small island at the mouth of the city's harbour. "
    "During the Middle Ages, lighthouses were few and far between. Many were maintained by monasteries or by "
    "local lords who charged a fee to ships entering their waters.";

// ---------------------------------------------------------------------------------------------
// invariances

TEST_F(ModelTest, TreePassEqualsEachRootToLeafPathAsAChain) {
  auto cache = kv(8);
  const auto prefix = encode("The capital of France is Paris, and the capital of Germany is");
  ASSERT_GE(prefix.size(), 8u);
  const auto words = encode(" Berlin. The capital of Italy is Rome");
  ASSERT_GE(words.size(), 7u);
  const int32_t P = static_cast<int32_t>(prefix.size());
  const std::vector<int32_t> table = blocks(0, blocks_for(P + 7));
  run_one(seq(prefix, 0, table), *cache);

  // 7 nodes, 3 root-to-leaf paths sharing prefixes: [0,1,2], [0,1,3], [0,4,5,6].
  const std::vector<int32_t> parents = {-1, 0, 1, 1, 0, 4, 5};
  const std::vector<int32_t> tree_tokens = {words[0], words[1], words[2], words[3], words[4], words[5], words[6]};
  SequenceInput tree = seq(tree_tokens, P, table, true);
  tree.parents = parents;
  const ForwardOutput t = run_one(tree, *cache);
  ASSERT_EQ(t.seq_row_offset.back(), 7);

  const std::vector<std::vector<int32_t>> paths = {{0, 1, 2}, {0, 1, 3}, {0, 4, 5, 6}};
  for (const auto& path : paths) {
    std::vector<int32_t> toks;
    for (int32_t node : path) toks.push_back(tree_tokens[node]);
    // The chain overwrites the tree's slots past the prefix; the prefix stays.
    const ForwardOutput c = run_one(seq(toks, P, table, true), *cache);
    for (size_t r = 0; r < path.size(); ++r) {
      const float diff = max_abs_diff(c.row(0, static_cast<int32_t>(r)), t.row(0, path[r]), vocab());
      EXPECT_EQ(0, std::memcmp(c.row(0, static_cast<int32_t>(r)), t.row(0, path[r]), vocab() * sizeof(float)))
          << "node " << path[r] << " (depth " << r << ") differs from its chain; max abs diff " << diff;
    }
  }
}

TEST_F(ModelTest, ChunkedPrefillEqualsOneChunk) {
  auto all = encode(kText);
  ASSERT_GE(all.size(), 100u);
  all.resize(100);
  auto cache = kv(2 * blocks_for(100));
  const auto table = blocks(0, blocks_for(100));
  SequenceInput whole = seq(all, 0, table);
  whole.logit_rows = {15, 36, 99};  // ends of the 16- and 37-token chunks below, and the last
  const ForwardOutput ref = run_one(whole, *cache);
  for (const int32_t chunk : {16, 37}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    const auto table2 = blocks(blocks_for(100), blocks_for(100));  // other blocks: nothing shared
    for (int32_t at = 0; at < 100; at += chunk) {
      const int32_t n = std::min(chunk, 100 - at);
      const ForwardOutput o = run_one(seq({all.begin() + at, all.begin() + at + n}, at, table2), *cache);
      const int32_t last = at + n - 1;
      const int32_t k = last == 15 ? 0 : last == 36 ? 1 : last == 99 ? 2 : -1;
      if (k < 0) continue;
      EXPECT_EQ(0, std::memcmp(o.row(0, 0), ref.row(0, k), vocab() * sizeof(float)))
          << "logits after token " << last << "; max abs diff " << max_abs_diff(o.row(0, 0), ref.row(0, k), vocab());
    }
  }
}

TEST_F(ModelTest, SequenceLogitsDoNotDependOnTheBatch) {
  const auto text = encode(kText);
  ASSERT_GE(text.size(), 60u);
  auto slice = [&](size_t from, size_t n) { return std::vector<int32_t>(text.begin() + from, text.begin() + from + n); };
  auto cache = kv(16);
  // Cached prefixes, each sequence in its own blocks.
  const auto t1 = blocks(0, 3), t2 = blocks(3, 2), t3 = blocks(5, 2), t0 = blocks(7, 2);
  run_one(seq(slice(0, 30), 0, t1), *cache);
  run_one(seq(slice(5, 10), 0, t2), *cache);
  run_one(seq(slice(20, 8), 0, t3), *cache);

  // One pass: a fresh 20-token prefill chunk, a decode token after 30, a 5-token chunk after
  // 10, and a 4-node tree after 8.
  std::vector<SequenceInput> inputs = {
      seq(slice(40, 20), 0, t0, true),
      seq(slice(30, 1), 30, t1, true),
      seq(slice(15, 5), 10, t2, true),
      seq(slice(28, 4), 8, t3, true),
  };
  inputs[3].parents = {-1, 0, 0, 2};
  ForwardBatch batch;
  batch.seqs = inputs;
  const ForwardOutput together = run(batch, *cache);
  ASSERT_EQ(together.seq_row_offset, (std::vector<int32_t>{0, 20, 21, 26, 30}));

  // Each alone, in reverse order (rewrites its own slots with the same values).
  for (int si = 3; si >= 0; --si) {
    const ForwardOutput alone = run_one(inputs[static_cast<size_t>(si)], *cache);
    const int32_t rows = static_cast<int32_t>(inputs[static_cast<size_t>(si)].tokens.size());
    for (int32_t r = 0; r < rows; ++r) {
      EXPECT_EQ(0, std::memcmp(alone.row(0, r), together.row(si, r), vocab() * sizeof(float)))
          << "sequence " << si << " row " << r << "; max abs diff " << max_abs_diff(alone.row(0, r), together.row(si, r), vocab());
    }
  }
}

// argmax_only: those sequences get greedy_pick of each of their rows (and no logits); the others
// get exactly the rows they would get alone, at their usual row() places.
TEST_F(ModelTest, ArgmaxOnlySequencesGetTheirRowsRowPicksAndNoLogits) {
  const auto text = encode(kText);
  ASSERT_GE(text.size(), 40u);
  auto slice = [&](size_t from, size_t n) { return std::vector<int32_t>(text.begin() + from, text.begin() + from + n); };
  auto cache = kv(12);
  std::vector<SequenceInput> inputs = {
      seq(slice(0, 9), 0, blocks(0, 3), true),
      seq(slice(10, 6), 0, blocks(3, 3), true),
      seq(slice(20, 5), 0, blocks(6, 3), true),
      seq(slice(30, 7), 0, blocks(9, 3)),  // only its last row
  };
  ForwardBatch all_full;
  all_full.seqs = inputs;
  const ForwardOutput full = run(all_full, *cache);
  EXPECT_TRUE(full.argmax.empty());
  for (const std::vector<bool>& picks : std::vector<std::vector<bool>>{{true, false, true, false}, {false, true, false, true},
                                                                     {true, true, true, true}}) {
    ForwardBatch b;
    b.seqs = inputs;
    for (size_t i = 0; i < picks.size(); ++i) b.seqs[i].argmax_only = picks[i];
    const ForwardOutput out = run(b, *cache);
    ASSERT_EQ(out.seq_row_offset, full.seq_row_offset);
    ASSERT_EQ(out.argmax.size(), static_cast<size_t>(full.seq_row_offset.back()));
    int64_t want_rows = 0;
    for (int32_t si = 0; si < 4; ++si) {
      const int32_t rows = full.seq_row_offset[si + 1] - full.seq_row_offset[si];
      for (int32_t r = 0; r < rows; ++r) {
        const RowPick g = greedy_pick(full.row(si, r), static_cast<int32_t>(vocab()));
        EXPECT_EQ(out.argmax_of(si, r), g.token) << "sequence " << si << " row " << r;
        EXPECT_EQ(out.argmax_logprob_of(si, r), g.logprob) << "sequence " << si << " row " << r;
        EXPECT_GE(out.argmax_of(si, r), 0);
        if (!picks[static_cast<size_t>(si)]) {
          EXPECT_EQ(0, std::memcmp(out.row(si, r), full.row(si, r), vocab() * sizeof(float))) << "sequence " << si << " row " << r;
        }
      }
      if (!picks[static_cast<size_t>(si)]) want_rows += rows;
    }
    EXPECT_EQ(static_cast<int64_t>(out.logits.size()), want_rows * vocab()) << "only the other sequences' rows are downloaded";
    for (int32_t si = 0; si < 4; ++si) {
      if (picks[static_cast<size_t>(si)]) EXPECT_DEATH((void)out.row(si, 0), "has no logits");
    }
  }
  // A sequence that draws at a temperature gets temperature_pick of its rows; the others in
  // the batch keep their argmax; a uniform outside [0, 1) is refused before any work.
  ForwardBatch b;
  b.seqs = inputs;
  for (SequenceInput& s : b.seqs) s.argmax_only = true;
  b.seqs[1].sample_temperature = 0.8f;
  b.seqs[1].sample_uniform = 0.37;
  const ForwardOutput out = run(b, *cache);
  for (int32_t si = 0; si < 4; ++si) {
    for (int32_t r = 0; r < full.seq_row_offset[si + 1] - full.seq_row_offset[si]; ++r) {
      const RowPick want = si == 1 ? temperature_pick(full.row(si, r), static_cast<int32_t>(vocab()), 0.8f, 0.37)
                                   : greedy_pick(full.row(si, r), static_cast<int32_t>(vocab()));
      EXPECT_EQ(out.argmax_of(si, r), want.token) << "sequence " << si << " row " << r;
      EXPECT_EQ(out.argmax_logprob_of(si, r), want.logprob) << "sequence " << si << " row " << r;
    }
  }
  b.seqs[1].sample_uniform = 1.0;
  ForwardOutput bad;
  const Status st = model_->forward(b, *cache, &bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sample_uniform"), std::string::npos) << st.to_string();
}

TEST_F(ModelTest, ReturnsHiddenStatesAndLayerSkipOnRequest) {
  auto cache = kv(2);
  const auto toks = encode("Hello there");
  SequenceInput s = seq(toks, 0, blocks(0, 1));
  ForwardBatch b;
  b.seqs.push_back(s);
  b.return_hidden = true;
  const ForwardOutput full = run(b, *cache);
  ASSERT_EQ(full.hidden.size(), static_cast<size_t>(model_->config().hidden_size));
  for (float h : full.hidden) ASSERT_TRUE(std::isfinite(h));
  b.num_layers = 4;  // the layer-skip draft: a different (cheaper) model, same shapes
  const ForwardOutput early = run(b, *cache);
  ASSERT_EQ(early.logits.size(), full.logits.size());
  EXPECT_GT(max_abs_diff(early.logits.data(), full.logits.data(), vocab()), 0.0f);
}

// hidden_rows: rows of their own (no logits needed) give the same final-norm hidden state as
// when they are logit rows, and that hidden state times the output head is the row's logits.
TEST_F(ModelTest, HiddenRowsEqualTheHiddenOfLogitRows) {
  auto cache = kv(4);
  const auto toks = encode("The quick brown fox jumps over the lazy dog");
  const int32_t n = static_cast<int32_t>(toks.size());
  ForwardBatch all;
  SequenceInput s = seq(toks, 0, blocks(0, blocks_for(n)));
  for (int32_t r = 0; r < n; ++r) s.logit_rows.push_back(r);
  all.seqs.push_back(s);
  all.return_hidden = true;
  const ForwardOutput ref = run(all, *cache);
  const int64_t d = model_->config().hidden_size;
  ASSERT_EQ(ref.hidden.size(), static_cast<size_t>(n * d));
  ASSERT_EQ(ref.seq_hidden_offset, (std::vector<int32_t>{0, n}));

  // Two sequences: the first asks for hidden rows {n-1, 0, 2} and only its last row's logits,
  // the second (same prompt, other blocks) for the default (its logit rows).
  ForwardBatch b;
  SequenceInput a = seq(toks, 0, blocks(0, blocks_for(n)));
  a.hidden_rows = {n - 1, 0, 2};
  SequenceInput c = seq(toks, 0, blocks(blocks_for(n), blocks_for(n)));
  c.logit_rows = {1, 3};
  b.seqs = {a, c};
  b.return_hidden = true;
  const ForwardOutput out = run(b, *cache);
  ASSERT_EQ(out.seq_hidden_offset, (std::vector<int32_t>{0, 3, 5}));
  ASSERT_EQ(out.hidden.size(), static_cast<size_t>(5 * d));
  const int32_t want[5] = {n - 1, 0, 2, 1, 3};
  for (int32_t k = 0; k < 5; ++k) {
    const int32_t seq_i = k < 3 ? 0 : 1, row_k = k < 3 ? k : k - 3;
    EXPECT_EQ(0, std::memcmp(out.hidden_row(seq_i, row_k), ref.hidden_row(0, want[k]), d * sizeof(float))) << "hidden row " << k;
  }
  // The output head applied to a hidden row gives that row's logits (argmax and values).
  std::vector<float> logits(static_cast<size_t>(vocab()));
  const float* h = ref.hidden_row(0, n - 1);
  const auto& head = model_->output_head();
  ASSERT_EQ(head.rows(), vocab());
  ASSERT_EQ(head.cols(), d);
  auto hb = model_->backend().alloc(d * 4);
  auto lb = model_->backend().alloc(vocab() * 4);
  model_->backend().upload(*hb, h, d * 4);
  model_->backend().matmul(head, hb->f32(), 1, lb->f32());
  model_->backend().download(logits.data(), *lb, vocab() * 4);
  EXPECT_LT(max_abs_diff(logits.data(), ref.row(0, n - 1), vocab()), 1e-3f);

  SequenceInput bad = seq(toks, 0, blocks(0, blocks_for(n)));
  bad.hidden_rows = {n};
  ForwardBatch bb;
  bb.seqs = {bad};
  bb.return_hidden = true;
  ForwardOutput o2;
  const Status st = model_->forward(bb, *cache, &o2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("hidden_rows"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------------
// validation

TEST_F(ModelTest, BadInputIsAStatusNamingSequenceAndField) {
  auto cache = kv(4);
  const SequenceInput good = seq({1, 2, 3}, 0, blocks(0, 1));
  auto check = [&](SequenceInput bad, const std::vector<std::string>& words) {
    ForwardBatch b;
    b.seqs = {good, std::move(bad)};
    ForwardOutput out;
    Status st = model_->forward(b, *cache, &out);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.message();
    for (const auto& w : words) EXPECT_NE(st.message().find(w), std::string::npos) << "'" << w << "' not in: " << st.message();
  };
  const std::string V = std::to_string(vocab());
  check(seq({5, static_cast<int32_t>(vocab())}, 0, blocks(1, 1)), {"token", V, "vocabulary"});
  check(seq({-1}, 0, blocks(1, 1)), {"token", "-1"});
  check(seq({5, 6, 7}, 15, blocks(1, 1)), {"block_table", "1", "2"});  // 18 tokens need 2 blocks
  check(seq({5}, 0, {}), {"block_table"});
  check(seq({5}, 0, {4}), {"block_table[0]", "4"});                    // the cache has 4 blocks
  SequenceInput tree = seq({5, 6, 7}, 0, blocks(1, 1));
  tree.parents = {-1, 2, 0};
  check(tree, {"parents[1]", "2"});
  tree.parents = {-1, 1, 0};  // self-parent
  check(tree, {"parents[1]"});
  tree.parents = {-1, 0};
  check(tree, {"parents", "2", "3"});
  const int32_t ctx = static_cast<int32_t>(model_->config().context_length);
  // Position ctx: the table may repeat block 1, validation rejects the position first.
  check(seq({5, 6}, ctx - 1, std::vector<int32_t>(static_cast<size_t>(blocks_for(ctx + 1)), 1)),
        {"position", std::to_string(ctx)});
  check(seq({}, 0, blocks(1, 1)), {"tokens", "empty"});
  SequenceInput rows = seq({5, 6}, 0, blocks(1, 1));
  rows.logit_rows = {2};
  check(rows, {"logit_rows", "2"});
  check(seq({5}, -3, blocks(1, 1)), {"num_cached", "-3"});

  // A tree whose deepest node is at the last position is fine, whatever its node count.
  SequenceInput wide = seq({5, 6, 7}, ctx - 2, std::vector<int32_t>(static_cast<size_t>(blocks_for(ctx + 1)), 1));
  wide.parents = {-1, 0, 0};
  ForwardBatch b;
  b.seqs = {wide};
  ForwardOutput out;
  EXPECT_TRUE(model_->forward(b, *cache, &out).ok());
  ForwardBatch empty;
  EXPECT_EQ(model_->forward(empty, *cache, &out).code(), StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Engine

// Greedy, ignore_eos, max_tokens[i] tokens for prompt i (one entry: the same for all); all
// submitted at once.
std::vector<std::vector<int32_t>> engine_generate(Transformer& model, const Tokenizer* tok, const EngineOptions& opts,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  const std::vector<int32_t>& max_tokens) {
  auto e = Engine::create(model, tok, nullptr, opts);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return {};
  Engine& engine = **e;
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerateParams p;
    p.prompt = prompts[i];
    p.sampling.temperature = 0.0f;
    p.sampling.ignore_eos = true;
    p.max_tokens = max_tokens[max_tokens.size() == 1 ? 0 : i];
    auto id = engine.add_request(p);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    if (!id.ok()) return {};
    index[*id] = i;
  }
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<FinishReason> finish(prompts.size(), FinishReason::kNone);
  for (int guard = 0; engine.has_work(); ++guard) {
    if (guard > 100000) {
      ADD_FAILURE() << "engine does not finish";
      return {};
    }
    std::vector<SeqEvent> events;
    Status st = engine.step(&events);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return {};
    for (const auto& ev : events) {
      const size_t i = index.at(ev.seq_id);
      out[i].insert(out[i].end(), ev.tokens.begin(), ev.tokens.end());
      if (ev.finish != FinishReason::kNone) finish[i] = ev.finish;
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(finish[i], FinishReason::kLength) << "prompt " << i;
    EXPECT_EQ(out[i].size(), static_cast<size_t>(max_tokens[max_tokens.size() == 1 ? 0 : i])) << "prompt " << i;
  }
  EXPECT_EQ(engine.block_pool().num_free(), engine.block_pool().num_blocks()) << "blocks leaked";
  return out;
}

// The first 8 prompts recorded in tests/data/llama_ref/smollm2_greedy.json, each cut to at most 96 tokens (a long prompt would only add
// prefill time here; chunked prefill has its own test).
std::vector<std::vector<int32_t>> eight_prompts() {
  const json doc = json::parse(testing::read_file(testing::data_path("llama_ref/smollm2_greedy.json")));
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : doc.at("cases")) {
    if (prompts.size() == 8) break;
    prompts.push_back(c.at("prompt_ids").get<std::vector<int32_t>>());
    if (prompts.back().size() > 96) prompts.back().resize(96);
  }
  return prompts;
}

TEST_F(ModelTest, EngineBatchGivesTheTokensOfEachPromptAlone) {
  const auto prompts = eight_prompts();
  ASSERT_EQ(prompts.size(), 8u);
  EngineOptions opts;
  opts.max_num_seqs = 8;
  opts.max_num_batched_tokens = 64;  // prompts prefill in chunks, mixed with other sequences' decode tokens
  opts.block_size = static_cast<int32_t>(kBlockSize);
  opts.max_model_len = 1024;
  opts.num_kv_blocks = 72;  // 8 x ceil((96 + 32) / 16) = 64 needed
  const auto together = engine_generate(*model_, tokenizer_, opts, prompts, {32});
  ASSERT_EQ(together.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = engine_generate(*model_, tokenizer_, opts, {prompts[i]}, {32});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(together[i], alone[0]) << "prompt " << i;
  }
}

TEST_F(ModelTest, EnginePreemptionKeepsTheOtherSequencesBlocks) {
  // Regression: the engine plans decode tokens before prefill chunks, so the youngest sequence
  // (the preemption victim) can come first in the plan. Preempting it erased its plan entry
  // and the reservation loop then skipped the entry after it: that sequence ran without the
  // blocks for its chunk and forward() failed ("block_table has 2 blocks, 3 needed").
  // Here, with 4 blocks of 4 tokens and 2 tokens a step: A (11-token prompt, admitted first)
  // prefills one token a step; B (1-token prompt, younger) decodes from the first step. In
  // step 9 B needs a third block, none is free, B preempts itself, and A's 9th prompt token
  // still needs A's third block.
  auto text = encode(kText);
  ASSERT_GE(text.size(), 11u);
  const std::vector<std::vector<int32_t>> prompts = {{text.begin(), text.begin() + 11}, {text[0]}};
  EngineOptions opts;
  opts.max_num_seqs = 2;
  opts.max_num_batched_tokens = 2;
  opts.block_size = 4;
  opts.max_model_len = 64;
  opts.num_kv_blocks = 4;
  const std::vector<int32_t> max_tokens = {3, 12};
  const auto together = engine_generate(*model_, tokenizer_, opts, prompts, max_tokens);
  ASSERT_EQ(together.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = engine_generate(*model_, tokenizer_, opts, {prompts[i]}, {max_tokens[i]});
    ASSERT_EQ(alone.size(), 1u);
    EXPECT_EQ(together[i], alone[0]) << "prompt " << i;
  }
}

}  // namespace
}  // namespace specserve
