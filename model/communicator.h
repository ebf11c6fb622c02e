// specserve model: collective communication between the shards of a tensor-parallel model.
//
// A tensor-parallel group of `size` ranks splits a model's attention heads and MLP columns
// (model/transformer.h, Megatron-LM's split: Shoeybi et al. 2019); after each block's
// row-parallel matmul every rank holds a partial sum of the residual update, and
// `all_reduce_sum` turns the partials into the full sum on every rank. The CPU implementation
// runs Gloo over loopback TCP (cpu/gloo_communicator.h); the CUDA one runs NCCL
// (gpu/nccl_communicator.h, CUDA builds only; compiles, untested on a GPU so far).
//
// Ranks find each other through a RendezvousStore: a small key-value store every rank can
// reach (Gloo's rendezvous, NCCL's unique-id exchange). Implementations: InProcessStore below
// (ranks as threads of one process), a file store (ranks as processes on one host,
// cpu/gloo_communicator.h), and later an actor-backed one (keys travel as CAF messages).
// The interfaces here carry no third-party types, so model/ and actors/ can hold them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

/// A key-value store for rendezvous. Keys are written once (a second set of a key overwrites);
/// readers wait for keys that are not there yet.
/// Thread-safety: implementations are safe to call from several threads at once.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  /// Stores `value` under `key`. Errors: kUnavailable when the store cannot be reached.
  virtual Status set(const std::string& key, const std::vector<char>& value) = 0;
  /// The value of `key`, waiting up to `timeout` for it to appear.
  /// Errors: kDeadlineExceeded naming the key when it did not appear in time; kUnavailable.
  virtual Expected<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
};

/// A RendezvousStore in memory, for ranks that are threads of one process: share one instance.
class InProcessStore final : public RendezvousStore {
 public:
  Status set(const std::string& key, const std::vector<char>& value) override;
  Expected<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> values_;
};

/// A RendezvousStore in a folder, for ranks that are processes on one host (or hosts sharing a
/// file system): share the folder. A key is a file written atomically (temporary file, then
/// rename); get polls for it every few milliseconds. The folder is created when missing; files
/// are left in place (the caller removes the folder when the group is done).
class FileStore final : public RendezvousStore {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  /// Errors: kUnavailable naming the path when the folder or file cannot be written.
  Status set(const std::string& key, const std::vector<char>& value) override;
  Expected<std::vector<char>> get(const std::string& key, std::chrono::milliseconds timeout) override;

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

/// One rank's handle on a tensor-parallel group.
/// Collectives are blocking and must be called by every rank of the group in the same order
/// (as with NCCL and Gloo); a rank that stops calling makes the others fail with
/// kDeadlineExceeded / kUnavailable after the communicator's timeout. After a failed
/// collective the communicator is broken: later calls fail too.
/// Thread-safety: one thread at a time per communicator.
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank, in [0, size()).
  virtual int rank() const = 0;
  /// Ranks in the group (>= 1).
  virtual int size() const = 0;
  /// In place: data[i] = sum over ranks r of data_r[i], for i < n. `data` is a buffer of the
  /// rank's backend (Buffer::f32(); host memory on the CPU). Deterministic: every rank ends with
  /// the same bits, summed in rank order ((d_0 + d_1) + d_2) + ..., whatever the transport.
  /// Errors: kUnavailable / kDeadlineExceeded when a peer fails or times out; kInvalidArgument
  /// for n < 0.
  virtual Status all_reduce_sum(float* data, int64_t n) = 0;
  /// Copies `bytes` bytes at `data` of rank `root` into `data` of every other rank (host memory;
  /// the NCCL communicator also takes device memory).
  /// Errors: as all_reduce_sum; kInvalidArgument for a root outside the group.
  virtual Status broadcast(void* data, int64_t bytes, int root = 0) = 0;
  /// Returns when every rank has called barrier. Errors: as all_reduce_sum.
  virtual Status barrier() = 0;
};

/// A communicator of one rank (size 1): every collective is a no-op. For code paths that take
/// a Communicator whether or not the model is split.
class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status all_reduce_sum(float*, int64_t n) override {
    return n < 0 ? invalid_argument("all_reduce_sum: n = " + std::to_string(n) + " < 0") : Status();
  }
  Status broadcast(void*, int64_t, int root) override {
    return root == 0 ? Status() : invalid_argument("broadcast: root " + std::to_string(root) + " is not in a group of 1");
  }
  Status barrier() override { return Status(); }
};

}  // namespace specserve
