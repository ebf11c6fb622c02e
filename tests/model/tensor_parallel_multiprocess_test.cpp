// Tensor parallelism with the ranks as processes (model/communicator.h's FileStore for the
// rendezvous, Gloo over loopback TCP): two forked ranks each load their shard of a synthetic
// model, prefill and decode greedily in lock step (rank 0 picks each token and broadcasts it),
// rank 0 writes its logits to a file; this process compares them with a one-rank run and
// checks the greedy tokens are identical. Several processes: labelled "multiprocess".
// NOTE: the ranks are forked before this process runs any OpenMP code (a forked child cannot
// use a parent's OpenMP thread pool).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/gloo_communicator.h"
#include "model/communicator.h"
#include "model/gguf.h"
#include "model/synthetic_model.h"
#include "model/transformer.h"

namespace specserve {
namespace {

constexpr int kDecode = 8;

SyntheticModelSpec spec() {
  SyntheticModelSpec s;
  s.num_layers = 3;
  s.hidden_size = 96;
  s.num_heads = 6;
  s.num_kv_heads = 3;
  s.ffn_size = 160;
  s.vocab_size = 300;
  s.storage = GgmlType::Q8_0;
  s.seed = 21;
  return s;
}

// Prefill (every row's logits) then kDecode greedy steps; with comm, rank 0's token choice is
// broadcast so every rank feeds the same tokens. Returns logits (rank 0) and the tokens.
Status run(Transformer& m, Communicator* comm, std::vector<float>* logits, std::vector<int32_t>* tokens) {
  const int64_t vocab = m.config().vocab_size;
  auto kv = m.create_kv(8, 16);
  if (!kv.ok()) return kv.status();
  ForwardBatch b;
  SequenceInput s;
  s.tokens = {5, 17, 2, 99, 250, 3, 3, 41, 8, 60, 1, 77};
  s.block_table = {0, 1, 2};
  s.logit_rows.resize(s.tokens.size());
  std::iota(s.logit_rows.begin(), s.logit_rows.end(), 0);
  b.seqs.push_back(s);
  ForwardOutput out;
  int32_t cached = 0;
  for (int step = 0; step <= kDecode; ++step) {
    SPECSERVE_RETURN_IF_ERROR(m.forward(b, **kv, &out));
    logits->insert(logits->end(), out.logits.begin(), out.logits.end());
    int32_t next = 0;
    if (!comm || comm->rank() == 0) {
      const float* row = out.logits.data() + (out.logits.size() / vocab - 1) * vocab;
      next = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
    if (comm) SPECSERVE_RETURN_IF_ERROR(comm->broadcast(&next, sizeof(next), 0));
    tokens->push_back(next);
    cached += static_cast<int32_t>(b.seqs[0].tokens.size());
    b.seqs[0].num_cached = cached;
    b.seqs[0].tokens = {next};
    b.seqs[0].logit_rows.clear();
  }
  return Status();
}

// One rank, in a forked child: returns the exit code (0 ok).
int rank_main(int rank, const std::string& model_path, const std::string& store_dir, const std::string& out_path) {
  auto backend = make_cpu_backend(1);
  auto file = GgufFile::open(model_path);
  if (!file.ok()) return 10;
  GlooOptions go;
  go.prefix = "mp";
  go.timeout = std::chrono::milliseconds(30000);
  auto comm = make_gloo_communicator(rank, 2, std::make_shared<FileStore>(store_dir), go);
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, comm.status().to_string().c_str());
    return 11;
  }
  LoadOptions lo;
  lo.tp_rank = rank;
  lo.tp_size = 2;
  lo.communicator = comm->get();
  auto m = Transformer::load(*file, *backend, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, m.status().to_string().c_str());
    return 12;
  }
  std::vector<float> logits;
  std::vector<int32_t> tokens;
  Status st = run(**m, comm->get(), &logits, &tokens);
  if (!st.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, st.to_string().c_str());
    return 13;
  }
  if (rank != 0) return logits.empty() ? 0 : 14;  // only rank 0 computes the head
  std::ofstream f(out_path, std::ios::binary);
  const uint64_t n = logits.size(), t = tokens.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(n * 4));
  f.write(reinterpret_cast<const char*>(&t), 8);
  f.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(t * 4));
  return f ? 0 : 15;
}

TEST(TensorParallelMultiprocess, TwoProcessRanksMatchOneRank) {
  const std::string dir = ::testing::TempDir() + "/specserve_tp_mp_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string model = dir + "/model.gguf", out = dir + "/rank0.bin";
  ASSERT_TRUE(write_synthetic_llama(spec(), model).ok());
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(rank_main(r, model, dir + "/store", out));
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  std::vector<int> codes(2, -1);
  for (int r = 0; r < 2; ++r) {
    int status = 0;
    while (::waitpid(pids[r], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ::waitpid(pids[r], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ASSERT_EQ(codes[0], 0) << "rank 0 failed (see its stderr)";
  ASSERT_EQ(codes[1], 0) << "rank 1 failed (see its stderr)";
  std::ifstream f(out, std::ios::binary);
  uint64_t n = 0, t = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::vector<float> logits(n);
  f.read(reinterpret_cast<char*>(logits.data()), static_cast<std::streamsize>(n * 4));
  f.read(reinterpret_cast<char*>(&t), 8);
  std::vector<int32_t> tokens(t);
  f.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(t * 4));
  ASSERT_TRUE(f);
  // The one-rank reference, in this process (after the forks).
  auto file = GgufFile::open(model);
  ASSERT_TRUE(file.ok());
  auto backend = make_cpu_backend(1);
  auto m = Transformer::load(*file, *backend);
  ASSERT_TRUE(m.ok());
  std::vector<float> ref;
  std::vector<int32_t> ref_tokens;
  ASSERT_TRUE(run(**m, nullptr, &ref, &ref_tokens).ok());
  ASSERT_EQ(logits.size(), ref.size());
  double max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) max_abs = std::max(max_abs, std::fabs(static_cast<double>(logits[i]) - ref[i]));
  std::printf("[ tp       ] two processes, TP=2 vs TP=1: max |logit diff| %.3g over %zu logits\n", max_abs, ref.size());
  EXPECT_LT(max_abs, 1e-3);
  EXPECT_EQ(tokens, ref_tokens);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve
