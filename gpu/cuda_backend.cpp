#include "gpu/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu/attention_meta.h"
#include "gpu/cublas_api.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_graphs.h"
#include "gpu/cuda_memory.h"
#include "gpu/kernels.h"
#include "model/dequant.h"

namespace specserve {
namespace {

#define SPECSERVE_CUBLAS_CHECK(expr)                                                                  \
  do {                                                                                                \
    const cublasStatus_t st_ = (expr);                                                                \
    SPECSERVE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, std::string(#expr) + ": status " + std::to_string(static_cast<int>(st_))); \
  } while (0)

using gpu::WeightType;

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

using gpu::CudaBuffer;
using gpu::CudaKvStorage;
using gpu::CudaWeight;
using gpu::DeviceScratch;
using gpu::device_alloc_or_die;

const CudaWeight& cw(const Weight& w) { return static_cast<const CudaWeight&>(w); }

template <class T>
uint64_t W_(T v) {
  return gpu::sig_word(v);
}

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
    // NOTE: cuBLAS gets its workspace from us, with graphs on or off (the workspace can steer
    // its choice of algorithm, so both modes must see the same one): inside a stream capture it
    // may not allocate its own. 32 MiB is what NVIDIA's cuBLAS guide advises for Hopper.
    workspace_ = device_alloc_or_die(kCublasWorkspace, "the cuBLAS workspace");
    SPECSERVE_CUBLAS_CHECK(api.set_workspace(cublas_, workspace_, kCublasWorkspace));
    if (opts_.cuda_graphs) rec_ = std::make_shared<gpu::GraphRecorder>(device_, stream_);
    int sms = 0;
    SPECSERVE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
    num_sms_ = sms;
    return Status();
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    rec_.reset();  // drops ops never flushed (nothing waits for them) and the graphs
    if (stream_) cudaStreamSynchronize(stream_);
    if (cublas_) cublas_api().destroy(cublas_);
    cudaFree(workspace_);
    cudaFree(err_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  const gpu::GraphRecorder* recorder() const { return rec_.get(); }
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
    flush();
    return std::make_unique<CudaBuffer>(bytes, rec_);
  }
  // NOTE: host -> device copies are queued on the stream; from pageable memory (every caller's
  // std::vector) cudaMemcpyAsync returns once the source has been staged, so the caller may
  // reuse it at once, as with the CPU's memcpy.
  void upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset) override {
    ctx();
    if (bytes <= 0) return;
    SPECSERVE_CHECK(offset >= 0 && offset + bytes <= dst.bytes(), "upload past the buffer's end");
    upload_to(static_cast<char*>(dst.data()) + offset, src, bytes, bytes);
  }
  void download(void* dst, Buffer& src, int64_t bytes, int64_t offset) override {
    ctx();
    if (bytes <= 0) return;
    SPECSERVE_CHECK(offset >= 0 && offset + bytes <= src.bytes(), "download past the buffer's end");
    flush();
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
    flush();
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
        new CudaKvStorage(layers, blocks, bs, kv_dim, static_cast<float*>(k), static_cast<float*>(v), rec_));
  }

  // ---- ops ----
  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) override {
    ctx();
    const void* wd = cw(table).data();
    const WeightType wt = cw(table).type();
    const int64_t rows = cw(table).rows(), cols = cw(table).cols();
    launch({kOpEmbedding, W_(wd), W_(wt), W_(rows), W_(cols), W_(ids), W_(n), W_(out)},
           [=, err = err_, s = stream_] { gpu::launch_embedding(wd, wt, rows, cols, ids, n, out, err, s); });
  }

  void rms_norm(const float* x, const Weight& w, float eps, int64_t n, int64_t d, float* out) override {
    ctx();
    SPECSERVE_CHECK(cw(w).rows() * cw(w).cols() >= d, "rms_norm weight shorter than the row");
    const void* wd = cw(w).data();
    const WeightType wt = cw(w).type();
    launch({kOpRmsNorm, W_(x), W_(wd), W_(wt), W_(eps), W_(n), W_(d), W_(out)},
           [=, s = stream_] { gpu::launch_rms_norm(x, wd, wt, eps, n, d, out, s); });
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
      const void* wd = W.data();
      const WeightType wt = W.type();
      const int64_t rows = W.rows(), cols = W.cols();
      launch({kOpMatmulRowwise, W_(wd), W_(wt), W_(rows), W_(cols), W_(x), W_(n), W_(y)},
             [=, s = stream_] { gpu::launch_matmul_rowwise(wd, wt, rows, cols, x, n, y, s); });
    } else {
      // Column-major view: Y^T [rows, n] = W [rows, cols] (row-major = col-major W^T, so op T)
      // times X^T [cols, n] (row-major X is col-major X^T).
      const int m_ = static_cast<int>(W.rows()), n_ = static_cast<int>(n), k_ = static_cast<int>(W.cols());
      if (W.type() != WeightType::kF32) {
        // The activations in the weights' 16-bit type (cuBLAS multiplies like types).
        const cudaDataType dt = W.type() == WeightType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
        auto* xb = static_cast<uint16_t*>(scratch(act_half_, n * W.cols() * 2, "16-bit activations"));
        const WeightType wt = W.type();
        const int64_t count = n * W.cols();
        launch({kOpToHalf, W_(x), W_(xb), W_(wt), W_(count)},
               [=, s = stream_] { gpu::launch_f32_to_half(x, xb, wt, count, s); });
        const void* wd = W.data();
        cublasHandle_t h = cublas_;
        launch({kOpGemm, W_(wd), W_(dt), W_(xb), W_(y), W_(m_), W_(n_), W_(k_)}, [=] {
          const float alpha = 1.0f, beta = 0.0f;
          SPECSERVE_CUBLAS_CHECK(cublas_api().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, wd, dt, k_, xb, dt,
                                                      k_, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        });
      } else {
        const void* wd = W.data();
        cublasHandle_t h = cublas_;
        launch({kOpGemm, W_(wd), W_(CUDA_R_32F), W_(x), W_(y), W_(m_), W_(n_), W_(k_)}, [=] {
          const float alpha = 1.0f, beta = 0.0f;
          SPECSERVE_CUBLAS_CHECK(cublas_api().gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, m_, n_, k_, &alpha, wd, CUDA_R_32F, k_, x,
                                                      CUDA_R_32F, k_, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT));
        });
      }
    }
    if (bias) {
      SPECSERVE_CHECK(cw(*bias).rows() * cw(*bias).cols() == W.rows(), "matmul bias length differs from the output width");
      const void* bd = cw(*bias).data();
      const WeightType bt = cw(*bias).type();
      const int64_t rows = W.rows();
      launch({kOpAddBias, W_(y), W_(bd), W_(bt), W_(n), W_(rows)},
             [=, s = stream_] { gpu::launch_add_bias(y, bd, bt, n, rows, s); });
    }
  }

  void rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeParams& p) override {
    ctx();
    SPECSERVE_CHECK(p.rope_dim % 2 == 0 && p.rope_dim <= p.head_dim, "rope_dim must be even and <= head_dim");
    const gpu::RopeKernelParams k = gpu::make_rope_kernel_params(p);
    launch({kOpRope, W_(x), W_(positions), W_(n), W_(num_heads), W_(p.head_dim), W_(p.rope_dim), W_(p.theta), W_(p.neox),
            W_(p.freq_scale), W_(p.ext_factor), W_(p.attn_factor), W_(p.beta_fast), W_(p.beta_slow), W_(p.original_context)},
           [=, s = stream_] { gpu::launch_rope(x, positions, n, num_heads, k, s); });
  }

  void kv_write(KvStorage& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    ctx();
    SPECSERVE_CHECK(layer >= 0 && layer < kv.num_layers(), "kv_write layer out of range");
    const gpu::KvView view = static_cast<CudaKvStorage&>(kv).view();
    launch({kOpKvWrite, W_(view.k), W_(view.v), W_(view.num_layers), W_(view.num_slots), W_(view.block_size), W_(view.kv_dim), W_(layer), W_(k), W_(v), W_(slots), W_(n)},
           [=, err = err_, s = stream_] { gpu::launch_kv_write(view, layer, k, v, slots, n, err, s); });
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
    // With graphs, the metadata's device copy is sized by powers of two, and a graph copies the
    // whole power: block tables grow every step, the segment's signature does not.
    int64_t captured = bytes;
    if (rec_) {
      captured = 16384;
      while (captured < bytes) captured *= 2;
    }
    auto* dmeta = static_cast<int32_t*>(scratch(meta_dev_, captured, "attention metadata"));
    // NOTE: every layer of a forward pass sends the same sequences; the metadata goes up once.
    // Besides the copy, this saves a wait: a copy from pageable memory first waits for the
    // stream, which would stall the host once per layer.
    if (meta_ != meta_on_device_ || dmeta != meta_dev_ptr_) {
      upload_to(dmeta, meta_.data(), bytes, captured);
      meta_on_device_ = meta_;
      meta_dev_ptr_ = dmeta;
    }
    const gpu::AttentionMeta m{dmeta, num_items, seqs_offset};
    const gpu::KvView view = static_cast<CudaKvStorage&>(kv).view();
    // Split over the keys when the (row, head) blocks alone would leave most multiprocessors
    // idle (decode, verify) and a row sees more than one chunk; the chunk count is rounded up to
    // a power of two so that a graph's signature holds while the context grows.
    int64_t chunks = 0;
    float* ws = nullptr;
    // NOTE: the chunk states are at most kMaxAttentionWorkspace bytes (beyond, the one-block
    // kernel runs: the same bits), so the workspace stays inside the 1 GiB reserve that GPU
    // memory planning keeps (actors/gpu_memory_plan.h).
    if (opts_.attention_split && num_items * num_heads < 2 * num_sms_) {
      int64_t max_keys = 0;
      for (const AttentionSeq& a : seqs) max_keys = std::max<int64_t>(max_keys, a.num_cached + a.num_rows);
      const int64_t need = gpu::attention_chunks(max_keys);
      if (need > 1) {
        int64_t z = 1;
        while (z < need) z *= 2;
        const int64_t ws_bytes = num_items * num_heads * z * (head_dim + 2) * static_cast<int64_t>(sizeof(float));
        if (ws_bytes <= kMaxAttentionWorkspace) {
          chunks = z;
          ws = static_cast<float*>(scratch(attn_ws_, ws_bytes, "attention chunk states"));
        }
      }
    }
    launch({kOpAttention, W_(view.k), W_(view.v), W_(view.num_layers), W_(view.num_slots), W_(view.block_size), W_(view.kv_dim), W_(layer), W_(q), W_(dmeta), W_(num_items),
            W_(seqs_offset), W_(num_heads), W_(num_kv_heads), W_(head_dim), W_(out), W_(ws), W_(chunks)},
           [=, err = err_, s = stream_] {
             gpu::launch_attention(view, layer, q, m, num_heads, num_kv_heads, head_dim, out, ws, chunks, err, s);
           });
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) override {
    ctx();
    launch({kOpSwiglu, W_(gate), W_(up), W_(n), W_(out)}, [=, s = stream_] { gpu::launch_swiglu(gate, up, n, out, s); });
  }

  void add(float* x, const float* y, int64_t n) override {
    ctx();
    launch({kOpAdd, W_(x), W_(y), W_(n)}, [=, s = stream_] { gpu::launch_add(x, y, n, s); });
  }

  void gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out) override {
    ctx();
    if (m <= 0) return;
    const int32_t* d = upload_indices(idx, m, nullptr, 0);
    launch({kOpGatherRows, W_(x), W_(d), W_(m), W_(cols), W_(out)},
           [=, s = stream_] { gpu::launch_gather_rows(x, d, m, cols, out, s); });
  }

  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* token, float* logprob) override {
    ctx();
    SPECSERVE_CHECK(cols > 0 && cols <= (int64_t{1} << 20), "argmax_rows: cols = " + std::to_string(cols) + " outside 1..2^20");
    if (rows <= 0) return;
    launch({kOpArgmaxRows, W_(x), W_(rows), W_(cols), W_(token), W_(logprob)},
           [=, s = stream_] { gpu::launch_argmax_rows(x, rows, cols, token, logprob, s); });
  }

  void sample_rows(const float* x, int64_t rows, int64_t cols, const float* temperature, const double* uniform,
                   int32_t* token, float* logprob) override {
    ctx();
    SPECSERVE_CHECK(cols > 0 && cols <= (int64_t{1} << 20), "sample_rows: cols = " + std::to_string(cols) + " outside 1..2^20");
    if (rows <= 0) return;
    launch({kOpSampleRows, W_(x), W_(rows), W_(cols), W_(temperature), W_(uniform), W_(token), W_(logprob)},
           [=, s = stream_] { gpu::launch_sample_rows(x, rows, cols, temperature, uniform, token, logprob, s); });
  }

  void kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    ctx();
    if (n <= 0) return;
    const int32_t* d = upload_indices(src, n, dst, n);
    const gpu::KvView view = static_cast<CudaKvStorage&>(kv).view();
    launch({kOpKvCopySlots, W_(view.k), W_(view.v), W_(view.num_layers), W_(view.num_slots), W_(view.block_size), W_(view.kv_dim), W_(d), W_(n)},
           [=, err = err_, s = stream_] { gpu::launch_kv_copy_slots(view, d, d + n, n, err, s); });
  }

  void kv_export_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                        void* dst) override {
    ctx();
    check_block_range(kv, layer_begin, layer_end, blocks, n);
    if (n <= 0) return;
    flush();  // then op by op: the host waits for the bytes anyway
    const int64_t bytes = n * kv_block_bytes(kv, layer_begin, layer_end);
    const int32_t* d = upload_indices_now(blocks, n);
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
    flush();
    const int64_t bytes = n * kv_block_bytes(kv, layer_begin, layer_end);
    const int32_t* d = upload_indices_now(blocks, n);
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
    flush();
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
    flush();
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
    return std::unique_ptr<Weight>(new CudaWeight(rows, cols, type, d, std::max<int64_t>(bytes, 256), weight_bytes_, rec_));
  }

  // Uploads a (+ b) host index arrays into the index scratch, a then b; returns its device pointer.
  // (recorded with graphs on, like the ops that read them).
  const int32_t* upload_indices(const int32_t* a, int64_t na, const int32_t* b, int64_t nb) {
    idx_host_.assign(a, a + na);
    if (b) idx_host_.insert(idx_host_.end(), b, b + nb);
    const int64_t bytes = static_cast<int64_t>(idx_host_.size() * sizeof(int32_t));
    auto* d = static_cast<int32_t*>(scratch(idx_dev_, bytes, "index arrays"));
    upload_to(d, idx_host_.data(), bytes, bytes);
    return d;
  }
  // The same, queued at once (after flush()): for ops that run outside graph segments.
  const int32_t* upload_indices_now(const int32_t* a, int64_t n) {
    const int64_t bytes = n * static_cast<int64_t>(sizeof(int32_t));
    auto* d = static_cast<int32_t*>(idx_dev_.get(bytes, stream_, "index arrays"));
    SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(d, a, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    return d;
  }

  // ---- CUDA graphs (gpu/cuda_graphs.h): with rec_, ops are recorded, else launched at once ----
  enum Op : uint64_t {
    kOpUpload = 1, kOpEmbedding, kOpRmsNorm, kOpMatmulRowwise, kOpToHalf, kOpGemm, kOpAddBias, kOpRope, kOpKvWrite,
    kOpAttention, kOpSwiglu, kOpAdd, kOpGatherRows, kOpKvCopySlots, kOpArgmaxRows, kOpSampleRows,
  };
  // `sig` must name every pointer, size and scalar `f` uses (a graph is replayed for an equal
  // signature only).
  template <class F>
  void launch(std::initializer_list<uint64_t> sig, F f) {
    if (!rec_) {
      f();
      SPECSERVE_CUDA_LAUNCHED();
      return;
    }
    rec_->add(sig, [f = std::move(f)](const gpu::OpContext&) {
      f();
      SPECSERVE_CUDA_LAUNCHED();
    });
  }
  // Host -> device copy of `bytes`; a graph copies `captured` (>= bytes) from its staging.
  void upload_to(void* dst, const void* src, int64_t bytes, int64_t captured) {
    if (!rec_) {
      SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
      return;
    }
    const int32_t slot = rec_->stage(src, bytes, captured);
    rec_->add({kOpUpload, W_(dst), W_(captured)}, [=, s = stream_](const gpu::OpContext& c) {
      SPECSERVE_CUDA_CHECK(cudaMemcpyAsync(dst, c.upload(slot), static_cast<size_t>(c.capturing ? captured : bytes),
                                           cudaMemcpyHostToDevice, s));
    });
  }
  // A backend scratch area of at least `bytes`; recorded ops that use the old area run first.
  void* scratch(DeviceScratch& area, int64_t bytes, const char* what) {
    if (rec_ && !area.fits(bytes)) rec_->flush();
    return area.get(bytes, stream_, what);
  }
  void flush() {
    if (rec_) rec_->flush();
  }

  int device_;
  CudaBackendOptions opts_;
  std::shared_ptr<std::atomic<int64_t>> weight_bytes_ = std::make_shared<std::atomic<int64_t>>(0);
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int32_t* err_ = nullptr;  // device error word (gpu::ErrorBit)
  static constexpr size_t kCublasWorkspace = size_t{32} << 20;
  static constexpr int64_t kMaxAttentionWorkspace = int64_t{64} << 20;
  void* workspace_ = nullptr;
  std::shared_ptr<gpu::GraphRecorder> rec_;  // null: graphs off
  DeviceScratch act_half_, meta_dev_, idx_dev_, pack_, attn_ws_;
  int64_t num_sms_ = 0;
  std::vector<int32_t> meta_, idx_host_;
  std::vector<int32_t> meta_on_device_;  // what meta_dev_ holds (at meta_dev_ptr_)
  const void* meta_dev_ptr_ = nullptr;
};

}  // namespace

CudaGraphStats cuda_graph_stats(const Backend& backend) {
  const auto* b = dynamic_cast<const CudaBackend*>(&backend);
  if (b == nullptr || b->recorder() == nullptr) return {};
  return b->recorder()->counters();
}

Expected<std::unique_ptr<Backend>> make_cuda_backend(int device, CudaBackendOptions options) {
  auto info = cuda_device_info(device);
  if (!info.ok()) return info.status();
  auto b = std::make_unique<CudaBackend>(device, options);
  SPECSERVE_RETURN_IF_ERROR(b->init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace specserve
