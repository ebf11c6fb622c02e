// specserve cpu: a tensor-parallel model whose ranks are threads of this process.
//
// Rank 0 lives in the caller's thread and is an ordinary Transformer to its users (the Engine,
// proposers, the CLI); ranks 1..tp-1 each run on a thread of their own, with their own
// CpuBackend (the CPU threads split evenly between ranks), their own shard of the weights
// (model/transformer.h, TensorParallelShard) and a Gloo communicator over loopback TCP
// (cpu/gloo_communicator.h) rendezvousing through an InProcessStore. Rank 0's Transformer
// drives the others through TensorParallelPeers: create_kv, forward and kv_copy_slots on rank 0
// run the same on every rank, and the ranks meet in each layer's all-reduces.
// Thread-safety: as a Transformer: one caller at a time (on any one thread, but always the same
// thread when OpenMP thread counts matter: the rank-0 backend set them on the creating thread).
#pragma once

#include <memory>
#include <vector>

#include "core/status.h"
#include "cpu/gloo_communicator.h"
#include "model/gguf.h"
#include "model/transformer.h"

namespace specserve {

struct ThreadedTensorParallelOptions {
  int tp_size = 2;           ///< ranks (vLLM's tensor_parallel_size), 1 <= tp_size <= num_kv_heads
  int num_threads = 0;       ///< CPU threads of all ranks together (<= 0: every core); each rank gets max(1, n / tp_size)
  int64_t max_layers = 0;    ///< LoadOptions::max_layers
  GlooOptions gloo;          ///< the prefix is made unique per group
};

class ThreadedTensorParallel final : public TensorParallelPeers {
 public:
  /// Loads every rank's shard of `file` (which must outlive the group) and connects the ranks.
  /// Errors: those of tensor_parallel_shard (kInvalidArgument naming tensor_parallel_size and
  /// its value) before any thread starts; those of make_gloo_communicator and
  /// Transformer::load, naming the rank.
  static Expected<std::unique_ptr<ThreadedTensorParallel>> create(const GgufFile& file,
                                                                  const ThreadedTensorParallelOptions& options);
  /// Stops and joins the rank threads (after any forward in flight).
  ~ThreadedTensorParallel() override;

  /// Rank 0's model: use it as any Transformer (its create_kv, forward and kv_copy_slots
  /// involve every rank).
  Transformer& model() { return *model_; }
  /// Hands rank 0's model to a caller that wants to own it (LoadedModel): the group must still
  /// outlive every use of it, and the caller destroys it before or after the group (neither
  /// touches the other on destruction). model() is invalid afterwards.
  std::unique_ptr<Transformer> take_model() { return std::move(model_); }
  /// Rank 0's backend (the replicated embedding and head live there, for draft heads).
  Backend& backend() { return *backend_; }
  int tp_size() const { return static_cast<int>(peers_.size()) + 1; }

  // TensorParallelPeers (called by rank 0's Transformer).
  Status create_kv(int32_t kv_id, int64_t num_blocks, int64_t block_size, int64_t num_layers) override;
  void start_forward(int32_t kv_id, const ForwardBatch& batch) override;
  Status finish_forward() override;
  Status kv_copy_slots(int32_t kv_id, const int32_t* src, const int32_t* dst, int64_t n) override;

 private:
  struct Peer;
  ThreadedTensorParallel() = default;
  Status wait_peers();

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Transformer> model_;
  std::vector<std::unique_ptr<Peer>> peers_;
};

}  // namespace specserve
