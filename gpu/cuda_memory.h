// specserve gpu: CudaBackend's device memory objects (internal to gpu/): its weights, buffers,
// KV storage and scratch areas. Each frees its device memory only after the ops recorded for a
// CUDA graph segment (gpu/cuda_graphs.h) that may still use it have run.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_graphs.h"
#include "gpu/kernels.h"
#include "model/backend.h"

namespace specserve::gpu {

inline void* device_alloc_or_die(int64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
  SPECSERVE_CHECK(e == cudaSuccess, std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what + ": " +
                                        cudaGetErrorString(e));
  return p;
}

// Device memory is freed only after the ops recorded for a graph segment (which may use it) ran.
inline void flush_pending(const std::weak_ptr<GraphRecorder>& rec) {
  if (auto r = rec.lock(); r && r->pending()) r->flush();
}

class CudaWeight final : public Weight {
 public:
  // `counter`: the backend's weight_bytes(), which this weight's `bytes` are in while it lives
  // (shared: a weight may outlive its backend).
  CudaWeight(int64_t rows, int64_t cols, WeightType type, void* data, int64_t bytes,
             std::shared_ptr<std::atomic<int64_t>> counter, std::weak_ptr<GraphRecorder> rec)
      : Weight(rows, cols), type_(type), data_(data), bytes_(bytes), counter_(std::move(counter)), rec_(std::move(rec)) {
    *counter_ += bytes_;
  }
  ~CudaWeight() override {
    flush_pending(rec_);
    cudaFree(data_);
    *counter_ -= bytes_;
  }
  WeightType type() const { return type_; }
  const void* data() const { return data_; }

 private:
  WeightType type_;
  void* data_;  // device [rows, cols], bf16 or fp32
  int64_t bytes_;
  std::shared_ptr<std::atomic<int64_t>> counter_;
  std::weak_ptr<GraphRecorder> rec_;
};

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(int64_t bytes, std::weak_ptr<GraphRecorder> rec)
      : Buffer(bytes), ptr_(device_alloc_or_die(bytes, "an activation buffer")), rec_(std::move(rec)) {}
  ~CudaBuffer() override {
    flush_pending(rec_);
    cudaFree(ptr_);
  }
  void* data() override { return ptr_; }

 private:
  void* ptr_;
  std::weak_ptr<GraphRecorder> rec_;
};

class CudaKvStorage final : public KvStorage {
 public:
  CudaKvStorage(int64_t layers, int64_t blocks, int64_t bs, int64_t kv_dim, float* k, float* v,
                std::weak_ptr<GraphRecorder> rec)
      : KvStorage(layers, blocks, bs, kv_dim), k_(k), v_(v), rec_(std::move(rec)) {}
  ~CudaKvStorage() override {
    flush_pending(rec_);
    cudaFree(k_);
    cudaFree(v_);
  }
  // Same layout as CpuKvStorage: [layers, blocks * block_size, kv_dim] for K and for V.
  gpu::KvView view() {
    return gpu::KvView{k_, v_, num_layers_, num_blocks_ * block_size_, block_size_, kv_dim_};
  }

 private:
  float* k_;
  float* v_;
  std::weak_ptr<GraphRecorder> rec_;
};

// A device scratch area that grows on demand (never shrinks).
class DeviceScratch {
 public:
  ~DeviceScratch() { cudaFree(ptr_); }
  // Grows to at least `bytes`. Waits for `stream` first: queued kernels may still read the old area.
  void* get(int64_t bytes, cudaStream_t stream, const char* what) {
    if (bytes > cap_) {
      SPECSERVE_CUDA_CHECK(cudaStreamSynchronize(stream));
      cudaFree(ptr_);
      cap_ = std::max<int64_t>(bytes + bytes / 2, 4096);
      ptr_ = device_alloc_or_die(cap_, what);
    }
    return ptr_;
  }
  bool fits(int64_t bytes) const { return bytes <= cap_; }

 private:
  void* ptr_ = nullptr;
  int64_t cap_ = 0;
};

}  // namespace specserve::gpu
