// CUDA graphs in CudaBackend (gpu/cuda_graphs.h): a replayed step must do exactly what the eager
// ops do, so every logit is bit-identical with graphs on and off, for decode steps, a batch whose
// shape changes as sequences finish, and speculative verify passes; and graphs must actually be
// replayed (the counters), else the speed-up they exist for is not there. Each test skips with a
// visible message when no CUDA device is present (ctest label "gpu").

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gpu/cuda_backend.h"
#include "model/gguf.h"
#include "model/synthetic_model.h"
#include "model/transformer.h"
#include "spec/engine.h"
#include "spec/ngram_proposer.h"
#include "tests/gpu/cuda_parity_util.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

class CudaGraphs : public ::testing::Test {
 protected:
  void SetUp() override { SKIP_WITHOUT_CUDA(); }
};

bool bit_identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Logits of a prompt and then `steps` greedy decode steps of two sequences in one batch (the
// second one stops halfway, so the batch shrinks), on `backend`.
std::vector<float> decode_logits(const GgufFile& f, Backend& backend, int steps) {
  auto m = Transformer::load(f, backend);
  EXPECT_TRUE(m.ok());
  auto kv = (*m)->create_kv(64, 16);
  EXPECT_TRUE(kv.ok());
  const int64_t V = (*m)->config().vocab_size;
  std::vector<std::vector<int32_t>> tables(2, std::vector<int32_t>(32));
  std::iota(tables[0].begin(), tables[0].end(), 0);
  std::iota(tables[1].begin(), tables[1].end(), 32);
  std::vector<std::vector<int32_t>> next = {{5, 77, 300, 12, 12, 400, 9, 1, 250}, {33, 81, 2, 499, 100}};
  std::vector<int32_t> cached = {0, 0};
  std::vector<float> all;
  for (int step = 0; step < steps; ++step) {
    ForwardBatch b;
    const int live = step < steps / 2 ? 2 : 1;
    for (int s = 0; s < live; ++s) {
      SequenceInput in;
      in.tokens = next[s];
      in.num_cached = cached[s];
      in.block_table = tables[s];
      b.seqs.push_back(in);
    }
    ForwardOutput fo;
    EXPECT_TRUE((*m)->forward(b, **kv, &fo).ok());
    all.insert(all.end(), fo.logits.begin(), fo.logits.end());
    for (int s = 0; s < live; ++s) {
      cached[s] += static_cast<int32_t>(next[s].size());
      const float* row = fo.row(s, 0);
      next[s] = {static_cast<int32_t>(std::max_element(row, row + V) - row)};
    }
  }
  return all;
}

TEST_F(CudaGraphs, DecodeLogitsAreBitIdenticalToEagerAndGraphsAreReplayed) {
  SyntheticModelSpec spec;
  spec.num_layers = 4;
  spec.hidden_size = 128;
  spec.num_heads = 4;
  spec.num_kv_heads = 2;
  spec.ffn_size = 256;
  spec.vocab_size = 512;
  spec.storage = GgmlType::Q8_0;
  const std::string path = ::testing::TempDir() + "/cuda_graphs_synthetic.gguf";
  ASSERT_TRUE(write_synthetic_llama(spec, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  for (CudaMatmul mm : {CudaMatmul::kCublas, CudaMatmul::kBatchInvariant}) {
    CudaBackendOptions eager_opts{mm};
    eager_opts.cuda_graphs = false;
    auto eager = make_cuda_backend(0, eager_opts);
    auto graphs = make_cuda_backend(0, CudaBackendOptions{mm});
    ASSERT_TRUE(eager.ok() && graphs.ok());
    const auto want = decode_logits(*f, **eager, 24);
    const auto got = decode_logits(*f, **graphs, 24);
    EXPECT_TRUE(bit_identical(got, want)) << cuda_matmul_name(mm) << ": logits with graphs differ from eager";
    const CudaGraphStats st = cuda_graph_stats(**graphs);
    std::printf("[ info ] cuda graphs, %s: %lld replays, %lld captures, %lld eager segments, %lld failed captures\n",
                cuda_matmul_name(mm), static_cast<long long>(st.replays), static_cast<long long>(st.captures),
                static_cast<long long>(st.eager_segments), static_cast<long long>(st.failed_captures));
    EXPECT_EQ(st.failed_captures, 0);
    // 24 steps: the prefill and the first step of each batch shape run eagerly, the second is
    // captured, the rest replay.
    EXPECT_GE(st.captures, 2);
    EXPECT_GE(st.replays, 16);
    const CudaGraphStats off = cuda_graph_stats(**eager);
    EXPECT_EQ(off.replays + off.captures + off.eager_segments, 0) << "graphs off must record nothing";
  }
}

// The engine end to end: a batch of three requests with n-gram speculation (verify passes of
// k + 1 rows per sequence, the batch shrinking as requests finish) gives the same tokens with
// graphs on and off, and replays graphs.
TEST_F(CudaGraphs, SpeculativeBatchOnTheDefaultModelGivesTheSameTokens) {
  const GgufFile& f = testing::default_gguf();
  const Tokenizer& tok = testing::default_tokenizer();
  const std::vector<std::string> prompts = {
      "List the numbers: one two three four, one two three four, one two three four, one two",
      "The capital of France is", "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"};
  auto run = [&](bool cuda_graphs, CudaGraphStats* stats) {
    CudaBackendOptions o;
    o.cuda_graphs = cuda_graphs;
    auto gpu = make_cuda_backend(0, o);
    EXPECT_TRUE(gpu.ok());
    auto m = Transformer::load(f, **gpu);
    EXPECT_TRUE(m.ok());
    EngineOptions eo;
    eo.max_num_seqs = 4;
    eo.max_model_len = 512;
    eo.num_speculative_tokens = 4;
    NgramProposer ngram(1, 4);
    auto e = Engine::create(**m, &tok, &ngram, eo);
    EXPECT_TRUE(e.ok()) << e.status().to_string();
    std::vector<std::vector<int32_t>> out(prompts.size());
    std::vector<int64_t> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerateParams p;
      p.prompt = tok.encode(prompts[i], true, false);
      p.max_tokens = 24 + 12 * static_cast<int32_t>(i);
      p.sampling.temperature = 0;
      p.sampling.ignore_eos = true;
      auto id = (*e)->add_request(p);
      EXPECT_TRUE(id.ok());
      ids.push_back(*id);
    }
    std::vector<SeqEvent> evs;
    while ((*e)->has_work()) {
      evs.clear();
      EXPECT_TRUE((*e)->step(&evs).ok());
      for (auto& ev : evs) {
        for (size_t i = 0; i < ids.size(); ++i) {
          if (ev.seq_id == ids[i]) out[i].insert(out[i].end(), ev.tokens.begin(), ev.tokens.end());
        }
      }
    }
    *stats = cuda_graph_stats(**gpu);
    return out;
  };
  CudaGraphStats off_stats, on_stats;
  const auto eager = run(false, &off_stats);
  const auto graphs = run(true, &on_stats);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(graphs[i], eager[i]) << "request " << i << ": tokens with graphs differ from eager";
    EXPECT_EQ(static_cast<int32_t>(eager[i].size()), 24 + 12 * static_cast<int32_t>(i));
  }
  std::printf("[ info ] cuda graphs, engine with n-gram speculation: %lld replays, %lld captures, %lld eager segments\n",
              static_cast<long long>(on_stats.replays), static_cast<long long>(on_stats.captures),
              static_cast<long long>(on_stats.eager_segments));
  EXPECT_EQ(on_stats.failed_captures, 0);
  EXPECT_GT(on_stats.replays, 0);
}

}  // namespace
}  // namespace specserve
