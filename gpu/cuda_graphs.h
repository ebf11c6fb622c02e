// specserve gpu: CUDA graphs for repeated segments of ops (decode and verify steps), behind the
// Backend interface, so the transformer and the proposers stay as they are.
//
// With graphs on, CudaBackend does not launch an op when it is called: it appends the op (a
// closure) and its signature (op kind, every device pointer, size and scalar it uses) to the
// current segment. A segment ends where the host must see results or memory changes hands
// (download, synchronize, alloc, weight or KV allocation and release, KV export/import). Then:
//   - a segment whose signature has a captured graph is replayed: the bytes its uploads carry
//     (token ids, positions, slots, attention metadata, index arrays) are written to the graph's
//     pinned staging area, and one cudaGraphLaunch does every copy and kernel;
//   - a segment seen once before is captured (cudaStreamBeginCapture, its ops, EndCapture,
//     instantiate) and launched;
//   - any other segment (first sight, prefill of a new length, fewer than kMinGraphOps ops) runs
//     its ops one by one, as without graphs.
// A graph is replayed only for a segment with the identical signature, so a replay does exactly
// what the eager ops would do (same kernels, same pointers, same cuBLAS calls): outputs are
// bit-identical with graphs on and off (tests/gpu/cuda_graphs_test.cpp asserts it).
// Source: CUDA C++ Programming Guide, "CUDA Graphs" (stream capture); vLLM and TensorRT-LLM
// capture decode steps per batch size the same way, keyed by shape.
// Thread-safety: one thread at a time (the Backend's contract).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "gpu/cuda_backend.h"

namespace specserve::gpu {

/// What a deferred op reads its uploaded bytes from when it runs.
struct OpContext {
  /// Host bytes of upload slot `slot`: the recorder's arena (eager) or the graph's pinned staging
  /// (capture).
  const void* upload(int32_t slot) const;
  /// True while a graph is being captured: uploads then copy their captured size.
  bool capturing = false;
  const std::vector<char>* arena = nullptr;
  const std::vector<int64_t>* arena_offsets = nullptr;
  const char* staging = nullptr;
  const std::vector<int64_t>* staging_offsets = nullptr;
};

using DeferredOp = std::function<void(const OpContext&)>;

/// Counters since the backend was made: the public CudaGraphStats (gpu/cuda_backend.h).
using GraphCounters = CudaGraphStats;

class GraphRecorder {
 public:
  /// Segments shorter than this many ops run eagerly (a graph saves launch overhead only).
  static constexpr size_t kMinGraphOps = 8;
  /// Instantiated graphs kept (least recently used dropped first).
  static constexpr size_t kMaxGraphs = 64;

  GraphRecorder(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~GraphRecorder();
  GraphRecorder(const GraphRecorder&) = delete;
  GraphRecorder& operator=(const GraphRecorder&) = delete;

  /// Copies `bytes` of host data for an upload op; returns its slot. A graph copies
  /// `captured_bytes` (>= bytes) from the slot: uploads whose size varies within a capacity (the
  /// attention metadata) keep one signature.
  int32_t stage(const void* src, int64_t bytes, int64_t captured_bytes);
  /// Appends an op: `sig` identifies it completely; `run` launches it on the stream.
  void add(std::initializer_list<uint64_t> sig, DeferredOp run);
  /// Runs the pending segment (replay, capture or eager; see the file comment) on the
  /// recorder's device. Aborts, naming the CUDA call, when CUDA fails outside a capture.
  void flush();
  bool pending() const { return !ops_.empty(); }
  const GraphCounters& counters() const { return counters_; }

 private:
  struct Graph {
    std::vector<uint64_t> sig;
    cudaGraphExec_t exec = nullptr;
    char* staging = nullptr;  // pinned host memory
    std::vector<int64_t> staging_offsets;
    cudaEvent_t done = nullptr;  // the last launch's end: staging is free again after it
    uint64_t last_used = 0;
  };
  void run_eager();
  bool capture(uint64_t key);
  void replay(Graph& g);
  void destroy(Graph& g);
  void clear_segment();

  int device_;
  cudaStream_t stream_;
  std::vector<DeferredOp> ops_;
  std::vector<uint64_t> sig_;
  std::vector<char> arena_;
  std::vector<int64_t> arena_offsets_, slot_bytes_, slot_captured_;
  std::unordered_map<uint64_t, Graph> graphs_;
  std::unordered_map<uint64_t, int32_t> seen_;  // signature hash -> segments seen (-1: never capture)
  uint64_t tick_ = 0;
  GraphCounters counters_;
};

/// Signature words of op arguments: pointers, integers, enums and floats (by their bits).
template <class T>
uint64_t sig_word(T v) {
  if constexpr (std::is_pointer_v<T>) {
    return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(v));
  } else if constexpr (std::is_floating_point_v<T>) {
    double d = static_cast<double>(v);
    uint64_t u;
    static_assert(sizeof(d) == sizeof(u));
    __builtin_memcpy(&u, &d, sizeof(u));
    return u;
  } else {
    return static_cast<uint64_t>(v);
  }
}

}  // namespace specserve::gpu
