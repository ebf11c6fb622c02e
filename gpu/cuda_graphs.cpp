#include "gpu/cuda_graphs.h"

#include <xxhash.h>

#include <cstring>
#include <string>

#include "core/logging.h"
#include "core/status.h"
#include "gpu/cuda_check.h"

namespace specserve::gpu {
namespace {

// Staging offsets are 256-byte aligned (the copy engine's preference; any alignment is correct).
int64_t align_up(int64_t v) { return (v + 255) & ~int64_t{255}; }

// The seen-counts map is cleared when it grows past this (prefills of ever new lengths).
constexpr size_t kMaxSeen = 4096;

}  // namespace

const void* OpContext::upload(int32_t slot) const {
  const size_t i = static_cast<size_t>(slot);
  if (capturing) return staging + (*staging_offsets)[i];
  return arena->data() + (*arena_offsets)[i];
}

GraphRecorder::~GraphRecorder() {
  // Pending ops are dropped (the backend is going away); graphs and staging are released.
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  for (auto& [key, g] : graphs_) destroy(g);
}

int32_t GraphRecorder::stage(const void* src, int64_t bytes, int64_t captured_bytes) {
  const int64_t at = static_cast<int64_t>(arena_.size());
  arena_.resize(static_cast<size_t>(at + bytes));
  if (bytes > 0) std::memcpy(arena_.data() + at, src, static_cast<size_t>(bytes));
  arena_offsets_.push_back(at);
  slot_bytes_.push_back(bytes);
  slot_captured_.push_back(captured_bytes);
  return static_cast<int32_t>(arena_offsets_.size() - 1);
}

void GraphRecorder::add(std::initializer_list<uint64_t> sig, DeferredOp run) {
  sig_.push_back(sig.size());
  sig_.insert(sig_.end(), sig.begin(), sig.end());
  ops_.push_back(std::move(run));
}

void GraphRecorder::flush() {
  if (ops_.empty()) {
    clear_segment();
    return;
  }
  // The segment may end in a destructor called while another device is current.
  SPECSERVE_CUDA_CHECK(cudaSetDevice(device_));
  const uint64_t key = XXH3_64bits(sig_.data(), sig_.size() * sizeof(uint64_t));
  auto it = graphs_.find(key);
  if (it != graphs_.end() && it->second.sig == sig_) {
    replay(it->second);
  } else if (it == graphs_.end() && ops_.size() >= kMinGraphOps) {
    if (seen_.size() > kMaxSeen) seen_.clear();
    int32_t& seen = seen_[key];
    if (seen >= 1 && capture(key)) {
      seen_.erase(key);
    } else {
      if (seen >= 0) ++seen;
      run_eager();
    }
  } else {
    run_eager();  // short, or a hash shared with another segment's graph (kept)
  }
  clear_segment();
}

void GraphRecorder::run_eager() {
  OpContext c;
  c.arena = &arena_;
  c.arena_offsets = &arena_offsets_;
  for (auto& op : ops_) op(c);
  ++counters_.eager_segments;
}

bool GraphRecorder::capture(uint64_t key) {
  Graph g;
  g.sig = sig_;
  int64_t total = 0;
  for (size_t i = 0; i < slot_captured_.size(); ++i) {
    g.staging_offsets.push_back(total);
    total = align_up(total + slot_captured_[i]);
  }
  if (total > 0) {
    void* p = nullptr;
    if (cudaHostAlloc(&p, static_cast<size_t>(total), cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      ++counters_.failed_captures;
      seen_[key] = -1;
      return false;
    }
    g.staging = static_cast<char*>(p);
    // Bytes past a slot's actual size (up to its captured size) are copied but never read.
    std::memset(g.staging, 0, static_cast<size_t>(total));
  }
  for (size_t i = 0; i < slot_bytes_.size(); ++i) {
    if (slot_bytes_[i] > 0) {
      std::memcpy(g.staging + g.staging_offsets[i], arena_.data() + arena_offsets_[i], static_cast<size_t>(slot_bytes_[i]));
    }
  }
  OpContext c;
  c.capturing = true;
  c.staging = g.staging;
  c.staging_offsets = &g.staging_offsets;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    for (auto& op : ops_) op(c);
    e = cudaStreamEndCapture(stream_, &graph);
  }
  if (e == cudaSuccess) e = cudaGraphInstantiate(&g.exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g.done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    cudaGetLastError();
    get_logger("gpu")->warn("cuda graph capture of a {}-op segment failed ({}): it runs op by op", ops_.size(),
                            cudaGetErrorString(e));
    destroy(g);
    ++counters_.failed_captures;
    seen_[key] = -1;
    return false;
  }
  if (graphs_.size() >= kMaxGraphs) {
    auto lru = graphs_.begin();
    for (auto i = graphs_.begin(); i != graphs_.end(); ++i) {
      if (i->second.last_used < lru->second.last_used) lru = i;
    }
    destroy(lru->second);
    graphs_.erase(lru);
  }
  ++counters_.captures;
  Graph& held = graphs_[key] = std::move(g);
  counters_.graphs_held = static_cast<int64_t>(graphs_.size());
  // The capture recorded the work without running it: run it now (staging already holds the bytes).
  held.last_used = ++tick_;
  SPECSERVE_CUDA_CHECK(cudaGraphLaunch(held.exec, stream_));
  SPECSERVE_CUDA_CHECK(cudaEventRecord(held.done, stream_));
  return true;
}

void GraphRecorder::replay(Graph& g) {
  // The previous launch of this graph may still be copying from its staging.
  SPECSERVE_CUDA_CHECK(cudaEventSynchronize(g.done));
  for (size_t i = 0; i < slot_bytes_.size(); ++i) {
    if (slot_bytes_[i] > 0) {
      std::memcpy(g.staging + g.staging_offsets[i], arena_.data() + arena_offsets_[i], static_cast<size_t>(slot_bytes_[i]));
    }
  }
  g.last_used = ++tick_;
  SPECSERVE_CUDA_CHECK(cudaGraphLaunch(g.exec, stream_));
  SPECSERVE_CUDA_CHECK(cudaEventRecord(g.done, stream_));
  ++counters_.replays;
}

void GraphRecorder::destroy(Graph& g) {
  if (g.done) cudaEventSynchronize(g.done);
  if (g.exec) cudaGraphExecDestroy(g.exec);
  if (g.done) cudaEventDestroy(g.done);
  if (g.staging) cudaFreeHost(g.staging);
  g.exec = nullptr;
  g.done = nullptr;
  g.staging = nullptr;
}

void GraphRecorder::clear_segment() {
  ops_.clear();
  sig_.clear();
  arena_.clear();
  arena_offsets_.clear();
  slot_bytes_.clear();
  slot_captured_.clear();
}

}  // namespace specserve::gpu
