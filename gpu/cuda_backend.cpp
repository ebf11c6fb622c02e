#include "gpu/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu/attention_meta.h"
#include "gpu/kernels.h"
#include "model/dequant.h"

namespace specserve {
namespace {

// A failed CUDA call inside an op is a bug or a dead device: abort naming the call (Backend ops
// have no error channel, as on the CPU).
#define SPECSERVE_CUDA_CHECK(expr)                                                              \
  do {                                                                                          \
    const cudaError_t cuda_rc_ = (expr);                                                            \
    SPECSERVE_CHECK(cuda_rc_ == cudaSuccess, std::string(#expr) + ": " + cudaGetErrorString(cuda_rc_)); \
  } while (0)
#define SPECSERVE_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                                \
    const cublasStatus_t st_ = (expr);                                                                \
    SPECSERVE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, std::string(#expr) + ": status " + std::to_string(static_cast<int>(st_))); \
  } while (0)
// After a kernel launch: configuration errors surface here, execution errors at the next sync.
#define SPECSERVE_CUDA_LAUNCHED() SPECSERVE_CUDA_CHECK(cudaGetLastError())

using gpu::WeightType;

// NOTE: cuBLAS is opened with dlopen when the first CudaBackend is made, not linked: loading
// libcublas + libcublasLt costs ~0.25 s at every process start (measured here), which every
// `specserve` run and test process would pay on a CUDA build even on the CPU.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  std::string error;  // why it could not be loaded; empty when loaded
};

const CublasApi& cublas_api() {
  static const CublasApi api = [] {
    CublasApi a;
    void* lib = nullptr;
    std::string tried;
    for (const char* name : {SPECSERVE_CUBLAS_PATH, "libcublas.so.13", "libcublas.so"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib) break;
      const char* e = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
    }
    if (!lib) {
      a.error = "cannot load cuBLAS: " + tried;
      return a;
    }
    auto sym = [&](const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (!*fn && a.error.empty()) a.error = std::string("cuBLAS lacks ") + name;
    };
    sym("cublasCreate_v2", &a.create);
    sym("cublasDestroy_v2", &a.destroy);
    sym("cublasSetStream_v2", &a.set_stream);
    sym("cublasSetMathMode", &a.set_math_mode);
    sym("cublasGemmEx", &a.gemm_ex);
    return a;
  }();
  return api;
}

// fp32 -> bf16 bits, round to nearest even (as __float2bfloat16_rn); NaN stays a quiet NaN.
uint16_t f32_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// fp32 -> fp16 bits, round to nearest even, with cuda_fp16.h's host conversion.
uint16_t f32_to_f16_bits(float f) {
  const __half_raw r = __float2half_rn(f);
  return r.x;
}

void* device_alloc_or_die(int64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
  SPECSERVE_CHECK(e == cudaSuccess, std::string("cudaMalloc of ") + std::to_string(bytes) + " bytes for " + what + ": " +
                                        cudaGetErrorString(e));
  return p;
}

class CudaWeight final : public Weight {
 public:
  // `counter`: the backend's weight_bytes(), which this weight's `bytes` are in while it lives
  // (shared: a weight may outlive its backend).
  CudaWeight(int64_t rows, int64_t cols, WeightType type, void* data, int64_t bytes,
             std::shared_ptr<std::atomic<int64_t>> counter)
      : Weight(rows, cols), type_(type), data_(data), bytes_(bytes), counter_(std::move(counter)) {
    *counter_ += bytes_;
  }
  ~CudaWeight() override {
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
};

class CudaBuffer final : public Buffer {
 public:
  explicit CudaBuffer(int64_t bytes) : Buffer(bytes), ptr_(device_alloc_or_die(bytes, "an activation buffer")) {}
  ~CudaBuffer() override { cudaFree(ptr_); }
  void* data() override { return ptr_; }

 private:
  void* ptr_;
};

class CudaKvStorage final : public KvStorage {
 public:
  CudaKvStorage(int64_t layers, int64_t blocks, int64_t bs, int64_t kv_dim, float* k, float* v)
      : KvStorage(layers, blocks, bs, kv_dim), k_(k), v_(v) {}
  ~CudaKvStorage() override {
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

 private:
  void* ptr_ = nullptr;
  int64_t cap_ = 0;
};

const CudaWeight& cw(const Weight& w) { return static_cast<const CudaWeight&>(w); }

void check_block_range(const KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n) {
  SPECSERVE_CHECK(layer_begin >= 0 && layer_begin < layer_end && layer_end <= kv.num_layers(),
                  "kv layer range [" + std::to_string(layer_begin) + ", " + std::to_string(layer_end) + ") of " +
                      std::to_string(kv.num_layers()));
  for (int64_t i = 0; i < n; ++i)
    SPECSERVE_CHECK(blocks[i] >= 0 && blocks[i] < kv.num_blocks(),
                    "kv block id " + std::to_string(blocks[i]) + " of " + std::to_string(kv.num_blocks()));
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, CudaBackendOptions opts) : device_(device), opts_(opts) {}

  Status init() {
    cudaError_t e = cudaSetDevice(device_);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) return internal_error("cuda:" + std::to_string(device_) + ": " + cudaGetErrorString(e));
    const CublasApi& api = cublas_api();
    if (!api.error.empty()) return internal_error("cuda:" + std::to_string(device_) + ": " + api.error);
    if (const cublasStatus_t st = api.create(&cublas_); st != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      return internal_error("cuda:" + std::to_string(device_) + ": cublasCreate failed with status " +
                            std::to_string(static_cast<int>(st)));
    }
    SPECSERVE_CUBLAS_CHECK(api.set_stream(cublas_, stream_));
    // NOTE: the default math mode (no TF32: the fp32 path stays fp32; bf16 inputs accumulate in fp32).
    SPECSERVE_CUBLAS_CHECK(api.set_math_mode(cublas_, CUBLAS_DEFAULT_MATH));
    err_ = static_cast<int32_t*>(device_alloc_or_die(sizeof(int32_t), "the error word"));
    SPECSERVE_CUDA_CHECK(cudaMemsetAsync(err_, 0, sizeof(int32_t), stream_));
    return Status();
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (cublas_) cublas_api().destroy(cublas_);
    cudaFree(err_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  bool supports_weight_type(GgmlType t) const override { return dequant_supported(t); }
  bool keeps_quantized() const override { return false; }
  int64_t weight_bytes() const override { return weight_bytes_->load(); }

  Expected<std::unique_ptr<Weight>> load_weight(const GgufTensorInfo& t) override {
    if (t.shape.empty() || t.shape.size() > 2) {
      return corrupt_data("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) + " dims; a weight has 1 or 2");
    }
    if (!supports_weight_type(t.type())) {
      return unsupported("tensor '" + t.name + "': type " + ggml_type_name(t.raw_type) +
                         " is not supported by the cuda backend");
    }
    ctx();
    const int64_t cols = t.shape[0];
    const int64_t rows = t.shape.size() == 2 ? t.shape[1] : 1;
    // NOTE: vectors (norm weights, biases) stay fp32: they are tiny and scale every activation;
    // matrices become bf16 (or fp16), half the bytes a decode step reads (unless kF32).
    const bool keep_f32 = t.shape.size() == 1 || opts_.weights == CudaWeights::kF32;
    const int64_t count = rows * cols;
    if (!keep_f32 && opts_.weights == CudaWeights::kBF16 && t.type() == GgmlType::BF16) {
      // Already bf16: upload the GGUF bytes as they are (no host round trip through fp32).
      if (t.data == nullptr || static_cast<int64_t>(t.num_bytes) != count * 2) {
        return corrupt_data("tensor '" + t.name + "': " + std::to_string(t.num_bytes) + " bytes for " +
                            std::to_string(count) + " bf16 values");
      }
      return upload_weight(rows, cols, WeightType::kBF16, t.data, count * 2);
    }
    auto data = dequantize_tensor(t);
    if (!data.ok()) return data.status();
    if (keep_f32) return upload_weight(rows, cols, WeightType::kF32, data->data(), count * 4);
    std::vector<uint16_t> half(static_cast<size_t>(count));
    if (opts_.weights == CudaWeights::kF16) {
      for (int64_t i = 0; i < count; ++i) half[static_cast<size_t>(i)] = f32_to_f16_bits((*data)[static_cast<size_t>(i)]);
      return upload_weight(rows, cols, WeightType::kF16, half.data(), count * 2);
    }
    for (int64_t i = 0; i < count; ++i) half[static_cast<size_t>(i)] = f32_to_bf16_bits((*data)[static_cast<size_t>(i)]);
    return upload_weight(rows, cols, WeightType::kBF16, half.data(), count * 2);
  }

  std::unique_ptr<Buffer> alloc(int64_t bytes) override {
    ctx();
    return std::make_unique<CudaBuffer>(bytes);
  }
  // NOTE: host -> device copies are queued on the stream; from pageable memory (every caller's
  // std::vector) cudaMemcpyAsync returns once the source has been staged, so the caller may
  // reuse it at once, as with the CPU's memcpy.
  void upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset) override {
    ctx();
    if (bytes <= 0) return;
    SPECSERVE_CHECK(offset >= 0 && offset + bytes <= dst.bytes(), "upload past the buffer's end");
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + offset, src, static_cast<size_t>(bytes),
                                         cudaMemcpyHostToDevice, stream_));
  }
  void download(void* dst, Buffer& src, int64_t bytes, int64_t offset) override {
    ctx();
    if (bytes <= 0) return;
    SPECSERVE_CHECK(offset >= 0 && offset + bytes <= src.bytes(), "download past the buffer's end");
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<char*>(src.data()) + offset, static_cast<size_t>(bytes),
                                         cudaMemcpyDeviceToHost, stream_));
    SPECSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Expected<std::unique_ptr<KvStorage>> create_kv_storage(int64_t layers, int64_t blocks, int64_t bs,
                                                         int64_t kv_dim) override {
    const std::string what = "kv cache of " + std::to_string(blocks) + " blocks x " + std::to_string(bs) +
                             " tokens x " + std::to_string(layers) + " layers x " + std::to_string(kv_dim) + " floats";
    if (layers <= 0 || blocks <= 0 || bs <= 0 || kv_dim <= 0) return resource_exhausted(what + " is not allocatable");
    ctx();
    const size_t half = static_cast<size_t>(layers * blocks * bs * kv_dim) * sizeof(float);
    void* k = nullptr;
    void* v = nullptr;
    cudaError_t e = cudaMalloc(&k, half);
    if (e == cudaSuccess) e = cudaMalloc(&v, half);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      cudaFree(k);
      size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      return resource_exhausted(what + " (" + std::to_string(2 * half >> 20) + " MiB) does not fit on " + name() + " (" +
                                std::to_string(free_b >> 20) + " MiB free): " + cudaGetErrorString(e));
    }
    // Zeroed like the CPU's storage, so exporting a block never written gives the same bytes.
    SPECSERVE_CUDA_CHECK(cudaMemsetAsync(k, 0, half, stream_));
    SPECSERVE_CUDA_CHECK(cudaMemsetAsync(v, 0, half, stream_));
    return std::unique_ptr<KvStorage>(
        new CudaKvStorage(layers, blocks, bs, kv_dim, static_cast<float*>(k), static_cast<float*>(v)));
  }

  // ---- ops ----
  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) override {
    ctx();
    const auto& w = cw(table);
    gpu::launch_embedding(w.data(), w.type(), w.rows(), w.cols(), ids, n, out, err_, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void rms_norm(const float* x, const Weight& w, float eps, int64_t n, int64_t d, float* out) override {
    ctx();
    SPECSERVE_CHECK(cw(w).rows() * cw(w).cols() >= d, "rms_norm weight shorter than the row");
    gpu::launch_rms_norm(x, cw(w).data(), cw(w).type(), eps, n, d, out, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  // NOTE: determinism. cuBLAS picks its GEMM algorithm (tile shape, split-K) from the problem
  // shape, and the number of rows n is part of it: the same row may be summed in another order
  // in a batch of 5 than alone, so the Backend determinism contract (a row's result independent
  // of the batch) is NOT guaranteed by the kCublas path; it is bit-reproducible run to run for a
  // given shape (cuBLAS's documented guarantee on one GPU model). CUBLAS_GEMM_DEFAULT with the
  // default math mode; no algorithm is pinned (an algorithm valid for every n could only be
  // chosen and checked on a GPU). The kBatchInvariant path (own kernel, reduction order fixed by
  // the shape) keeps the contract; tests/gpu/cuda_backend_test.cpp asserts it for that path and
  // measures the kCublas path's deviation. Which one is the serving default is open until it is
  // measured on a GPU (tools/gpu-check.sh reports both).
  void matmul(const Weight& w, const float* x, int64_t n, float* y, const Weight* bias) override {
    ctx();
    const auto& W = cw(w);
    if (n <= 0) return;
    if (opts_.matmul == CudaMatmul::kBatchInvariant) {
      gpu::launch_matmul_rowwise(W.data(), W.type(), W.rows(), W.cols(), x, n, y, stream_);
      SPECSERVE_CUDA_LAUNCHED();
    } else {
      // Column-major view: Y^T [rows, n] = W [rows, cols] (row-major = col-major W^T, so op T)
      // times X^T [cols, n] (row-major X is col-major X^T).
      const float alpha = 1.0f, beta = 0.0f;
      const int m_ = static_cast<int>(W.rows()), n_ = static_cast<int>(n), k_ = static_cast<int>(W.cols());
      if (W.type() != WeightType::kF32) {
        // The activations in the weights' 16-bit type (cuBLAS multiplies like types).
        const cudaDataType dt = W.type() == WeightType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
        auto* xb = static_cast<uint16_t*>(act_half_.get(n * W.cols() * 2, stream_, "16-bit activations"));
        gpu::launch_f32_to_half(x, xb, W.type(), n * W.cols(), stream_);
        SPECSERVE_CUDA_LAUNCHED();
        SPECSERVE_CUBLAS_CHECK(cublas_api().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, W.data(), dt,
                                            k_, xb, dt, k_, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
      } else {
        SPECSERVE_CUBLAS_CHECK(cublas_api().gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, W.data(), CUDA_R_32F,
                                            k_, x, CUDA_R_32F, k_, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT));
      }
    }
    if (bias) {
      SPECSERVE_CHECK(cw(*bias).rows() * cw(*bias).cols() == W.rows(), "matmul bias length differs from the output width");
      gpu::launch_add_bias(y, cw(*bias).data(), cw(*bias).type(), n, W.rows(), stream_);
      SPECSERVE_CUDA_LAUNCHED();
    }
  }

  void rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeParams& p) override {
    ctx();
    SPECSERVE_CHECK(p.rope_dim % 2 == 0 && p.rope_dim <= p.head_dim, "rope_dim must be even and <= head_dim");
    const gpu::RopeKernelParams k = gpu::make_rope_kernel_params(p);
    gpu::launch_rope(x, positions, n, num_heads, k, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void kv_write(KvStorage& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    ctx();
    SPECSERVE_CHECK(layer >= 0 && layer < kv.num_layers(), "kv_write layer out of range");
    gpu::launch_kv_write(static_cast<CudaKvStorage&>(kv).view(), layer, k, v, slots, n, err_, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void attention(KvStorage& kv, int64_t layer, const float* q, const std::vector<AttentionSeq>& seqs, int64_t num_heads,
                 int64_t num_kv_heads, int64_t head_dim, float* out) override {
    ctx();
    SPECSERVE_CHECK(head_dim > 0 && head_dim <= 256, "cuda attention supports head_dim <= 256, got " + std::to_string(head_dim));
    SPECSERVE_CHECK(num_kv_heads > 0 && num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
    SPECSERVE_CHECK(layer >= 0 && layer < kv.num_layers(), "attention layer out of range");
    int32_t num_items = 0, seqs_offset = 0;
    gpu::build_attention_meta(seqs, kv.block_size(), &meta_, &num_items, &seqs_offset);
    if (num_items == 0) return;
    const int64_t bytes = static_cast<int64_t>(meta_.size() * sizeof(int32_t));
    auto* dmeta = static_cast<int32_t*>(meta_dev_.get(bytes, stream_, "attention metadata"));
    // NOTE: every layer of a forward pass sends the same sequences; the metadata goes up once.
    // Besides the copy, this saves a wait: a copy from pageable memory first waits for the
    // stream, which would stall the host once per layer.
    if (meta_ != meta_on_device_ || dmeta != meta_dev_ptr_) {
      SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(dmeta, meta_.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
      meta_on_device_ = meta_;
      meta_dev_ptr_ = dmeta;
    }
    gpu::AttentionMeta m{dmeta, num_items, seqs_offset};
    gpu::launch_attention(static_cast<CudaKvStorage&>(kv).view(), layer, q, m, num_heads, num_kv_heads, head_dim, out,
                          err_, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) override {
    ctx();
    gpu::launch_swiglu(gate, up, n, out, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void add(float* x, const float* y, int64_t n) override {
    ctx();
    gpu::launch_add(x, y, n, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out) override {
    ctx();
    if (m <= 0) return;
    const int32_t* d = upload_indices(idx, m, nullptr, 0);
    gpu::launch_gather_rows(x, d, m, cols, out, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    ctx();
    if (n <= 0) return;
    const int32_t* d = upload_indices(src, n, dst, n);
    gpu::launch_kv_copy_slots(static_cast<CudaKvStorage&>(kv).view(), d, d + n, n, err_, stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  void kv_export_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                        void* dst) override {
    ctx();
    check_block_range(kv, layer_begin, layer_end, blocks, n);
    if (n <= 0) return;
    const int64_t bytes = n * kv_block_bytes(kv, layer_begin, layer_end);
    const int32_t* d = upload_indices(blocks, n, nullptr, 0);
    auto* packed = static_cast<float*>(pack_.get(bytes, stream_, "kv block packing"));
    gpu::launch_kv_pack_blocks(static_cast<CudaKvStorage&>(kv).view(), layer_begin, layer_end, d, n, packed, true, stream_);
    SPECSERVE_CUDA_LAUNCHED();
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, packed, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    SPECSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void kv_import_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                        const void* src) override {
    ctx();
    check_block_range(kv, layer_begin, layer_end, blocks, n);
    if (n <= 0) return;
    const int64_t bytes = n * kv_block_bytes(kv, layer_begin, layer_end);
    const int32_t* d = upload_indices(blocks, n, nullptr, 0);
    auto* packed = static_cast<float*>(pack_.get(bytes, stream_, "kv block packing"));
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(packed, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    gpu::launch_kv_pack_blocks(static_cast<CudaKvStorage&>(kv).view(), layer_begin, layer_end, d, n, packed, false,
                               stream_);
    SPECSERVE_CUDA_LAUNCHED();
  }

  // Waits for the stream, then aborts if a kernel flagged a bad index (a bug: the transformer
  // validates ids, block tables and slots before it calls the ops).
  void synchronize() override {
    ctx();
    int32_t err = 0;
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(&err, err_, sizeof(err), cudaMemcpyDeviceToHost, stream_));
    SPECSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    SPECSERVE_CHECK(err == 0, name() + ": a kernel saw " +
                                  std::string((err & gpu::kErrTokenId) ? "a token id outside the embedding table " : "") +
                                  std::string((err & gpu::kErrKvSlot) ? "a kv slot outside the kv storage" : ""));
  }

 private:
  // Every entry point makes this backend's device current: the CUDA current device is
  // per host thread, and a backend may be driven from another thread than the one that made it.
  void ctx() const { SPECSERVE_CUDA_CHECK(cudaSetDevice(device_)); }

  Expected<std::unique_ptr<Weight>> upload_weight(int64_t rows, int64_t cols, WeightType type, const void* host,
                                                  int64_t bytes) {
    void* d = nullptr;
    const cudaError_t e = cudaMalloc(&d, static_cast<size_t>(std::max<int64_t>(bytes, 256)));
    if (e != cudaSuccess) {
      cudaGetLastError();
      return resource_exhausted("weight of " + std::to_string(bytes >> 20) + " MiB does not fit on " + name() + ": " +
                                cudaGetErrorString(e));
    }
    // On this backend's stream, then waited for: a plain cudaMemcpy runs on the legacy default
    // stream, which a non-blocking stream does not wait for, and from pageable memory it may
    // return before the data has landed.
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(d, host, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    SPECSERVE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::unique_ptr<Weight>(new CudaWeight(rows, cols, type, d, std::max<int64_t>(bytes, 256), weight_bytes_));
  }

  // Uploads a (+ b) host index arrays into the index scratch, a then b; returns its device pointer.
  const int32_t* upload_indices(const int32_t* a, int64_t na, const int32_t* b, int64_t nb) {
    idx_host_.assign(a, a + na);
    if (b) idx_host_.insert(idx_host_.end(), b, b + nb);
    const int64_t bytes = static_cast<int64_t>(idx_host_.size() * sizeof(int32_t));
    auto* d = static_cast<int32_t*>(idx_dev_.get(bytes, stream_, "index arrays"));
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(d, idx_host_.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    return d;
  }

  int device_;
  CudaBackendOptions opts_;
  std::shared_ptr<std::atomic<int64_t>> weight_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int32_t* err_ = nullptr;  // device error word (gpu::ErrorBit)
  DeviceScratch act_half_, meta_dev_, idx_dev_, pack_;
  std::vector<int32_t> meta_, idx_host_;
  std::vector<int32_t> meta_on_device_;  // what meta_dev_ holds (at meta_dev_ptr_)
  const void* meta_dev_ptr_ = nullptr;
};

}  // namespace

Expected<CudaMatmul> parse_cuda_matmul(const std::string& text) {
  if (text == "cublas") return CudaMatmul::kCublas;
  if (text == "batch_invariant") return CudaMatmul::kBatchInvariant;
  return invalid_argument("cuda matmul '" + text + "': expected cublas or batch_invariant");
}

const char* cuda_matmul_name(CudaMatmul m) { return m == CudaMatmul::kCublas ? "cublas" : "batch_invariant"; }

Expected<CudaWeights> parse_cuda_weights(const std::string& text) {
  if (text == "bf16") return CudaWeights::kBF16;
  if (text == "fp16") return CudaWeights::kF16;
  if (text == "fp32") return CudaWeights::kF32;
  return invalid_argument("cuda weights '" + text + "': expected bf16, fp16 or fp32");
}

const char* cuda_weights_name(CudaWeights w) {
  return w == CudaWeights::kBF16 ? "bf16" : w == CudaWeights::kF16 ? "fp16" : "fp32";
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: not an error for the caller
    return 0;
  }
  return n;
}

Expected<CudaDeviceInfo> cuda_device_info(int device) {
  const int count = cuda_device_count();
  if (count == 0) {
    int driver = 0;
    const cudaError_t e = cudaDriverGetVersion(&driver);
    return unavailable(std::string("no CUDA device is present (") +
                       (e == cudaSuccess && driver == 0 ? "no NVIDIA driver" : "cudaGetDeviceCount found none") + ")");
  }
  if (device < 0 || device >= count) {
    return invalid_argument("cuda device " + std::to_string(device) + " does not exist: " + std::to_string(count) +
                            " device(s), ordinals 0.." + std::to_string(count - 1));
  }
  cudaDeviceProp p{};
  cudaError_t e = cudaGetDeviceProperties(&p, device);
  if (e != cudaSuccess) return internal_error("cudaGetDeviceProperties(" + std::to_string(device) + "): " + cudaGetErrorString(e));
  CudaDeviceInfo info;
  info.name = p.name;
  info.cc_major = p.major;
  info.cc_minor = p.minor;
  info.total_bytes = static_cast<int64_t>(p.totalGlobalMem);
  info.num_sms = p.multiProcessorCount;
  int clock_khz = 0, bus_bits = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device);
  cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device);
  info.peak_bandwidth_gb_s = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  int prev = 0;
  cudaGetDevice(&prev);
  if (cudaSetDevice(device) == cudaSuccess) {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) info.free_bytes = static_cast<int64_t>(free_b);
    cudaSetDevice(prev);
  }
  cudaGetLastError();
  return info;
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(int device, CudaBackendOptions options) {
  auto info = cuda_device_info(device);
  if (!info.ok()) return info.status();
  auto b = std::make_unique<CudaBackend>(device, options);
  SPECSERVE_RETURN_IF_ERROR(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace specserve
