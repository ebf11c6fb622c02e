// specserve model: the compute interface the transformer is written against.
//
// One Backend per device. The transformer (model/transformer.h) calls only these ops, so the
// CPU reference (cpu/) and the CUDA backend (gpu/) run the same model code. Activations are
// fp32, row-major, in buffers the backend allocates (host memory on the CPU, device memory on
// a GPU). Weights keep whatever storage the backend chooses: `load_weight` sees the GGUF
// tensor (its quantised blocks) and may dequantise at load (CUDA does) or keep the blocks and
// dequantise inside its matmul (the CPU does for Q4_1 / Q8_0, to the same floats).
//
// Determinism contract (the speculative engine relies on it): every op computes each output
// row from that row's inputs alone, with a fixed reduction order, so a row's result does not
// depend on how many other rows or sequences share the call. Greedy speculative decoding is
// then token-for-token identical to plain decoding.
// Thread-safety: a Backend is used by one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/gguf.h"

namespace specserve {

/// A weight resident on a backend. Shape is [rows, cols] with cols contiguous: for a matmul
/// weight rows = output features, cols = input features (GGUF shape [cols, rows]).
class Weight {
 public:
  virtual ~Weight() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }

 protected:
  Weight(int64_t rows, int64_t cols) : rows_(rows), cols_(cols) {}
  int64_t rows_, cols_;
};

/// A backend-resident buffer of fp32 or int32 values.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual void* data() = 0;
  int64_t bytes() const { return bytes_; }
  float* f32() { return static_cast<float*>(data()); }
  int32_t* i32() { return static_cast<int32_t*>(data()); }

 protected:
  explicit Buffer(int64_t bytes) : bytes_(bytes) {}
  int64_t bytes_;
};

/// Paged KV storage of one model: per layer, K and V for `num_blocks * block_size` slots of
/// `kv_dim` floats. Slot s of logical position p in a sequence is
/// block_table[p / block_size] * block_size + p % block_size.
class KvStorage {
 public:
  virtual ~KvStorage() = default;
  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_dim() const { return kv_dim_; }

 protected:
  KvStorage(int64_t layers, int64_t blocks, int64_t block_size, int64_t kv_dim)
      : num_layers_(layers), num_blocks_(blocks), block_size_(block_size), kv_dim_(kv_dim) {}
  int64_t num_layers_, num_blocks_, block_size_, kv_dim_;
};

/// Bytes of one block in the packed layout of Backend::kv_export_blocks: layers in
/// [layer_begin, layer_end), K and V, block_size slots of kv_dim fp32 each.
inline int64_t kv_block_bytes(const KvStorage& kv, int64_t layer_begin, int64_t layer_end) {
  return (layer_end - layer_begin) * 2 * kv.block_size() * kv.kv_dim() * static_cast<int64_t>(sizeof(float));
}

/// RoPE parameters (llama.cpp's rope with yarn; see ModelConfig).
struct RopeParams {
  int64_t head_dim = 0;   ///< floats per head
  int64_t rope_dim = 0;   ///< leading dims rotated (<= head_dim)
  float theta = 10000.0f; ///< freq_base
  bool neox = false;      ///< pairing style: false = (2i, 2i+1), true = (i, i + rope_dim/2)
  float freq_scale = 1.0f;
  float ext_factor = 0.0f;   ///< yarn extrapolation mix (0 = off)
  float attn_factor = 1.0f;
  float beta_fast = 32.0f, beta_slow = 1.0f;
  int64_t original_context = 0;
};

/// Which keys each query row of an attention call sees, for one sequence.
/// Rows [row_begin, row_begin + num_rows) of the call belong to it. Its cached prefix has
/// `num_cached` tokens; row j is stored at logical slot num_cached + j. Without `parents`
/// row j sees logical slots [0, num_cached + j] (causal). With `parents` (one per row; -1 = the
/// row hangs off the prefix, else an earlier row index), row j sees the prefix and its own
/// ancestors and itself only — the tree attention mask of SpecInfer / Medusa.
struct AttentionSeq {
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t num_cached = 0;
  const int32_t* block_table = nullptr;  ///< host pointer, ceil((num_cached+num_rows)/block_size) ids
  int32_t num_blocks = 0;
  const int32_t* parents = nullptr;      ///< host pointer or nullptr (chain)
};

/// The compute interface. All pointers to activations are backend buffers (`Buffer::data()`
/// of this backend); row-major fp32 unless said otherwise. Errors in shapes are bugs (abort).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  /// Capability: whether load_weight accepts this GGUF storage type.
  virtual bool supports_weight_type(GgmlType type) const = 0;
  /// Capability: true when weights stay quantised in memory (dequantised inside matmul) in the
  /// bytes `load_weight` was given, which the caller must then keep alive; a backend that copies
  /// the blocks it keeps (the CPU's) says false.
  virtual bool keeps_quantized() const = 0;
  /// Bytes of device memory held now by the weights loaded on this backend (destroyed ones no
  /// longer count): what a worker's weights take, for GPU memory planning
  /// (actors/gpu_memory_plan.h). 0 where memory is not planned (the CPU).
  virtual int64_t weight_bytes() const { return 0; }

  /// Uploads a GGUF tensor of 1 or 2 dims as a weight ([rows, cols] = [shape[1], shape[0]];
  /// a vector is [1, shape[0]]). Errors: kUnsupported type, kCorruptData shape.
  virtual Expected<std::unique_ptr<Weight>> load_weight(const GgufTensorInfo& tensor) = 0;

  /// Allocates `bytes` of activation memory (uninitialised).
  virtual std::unique_ptr<Buffer> alloc(int64_t bytes) = 0;
  /// Copies host -> backend buffer and back. `offset` and `bytes` in bytes.
  virtual void upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset = 0) = 0;
  virtual void download(void* dst, Buffer& src, int64_t bytes, int64_t offset = 0) = 0;

  /// Paged KV storage; errors with kResourceExhausted when it cannot be allocated.
  virtual Expected<std::unique_ptr<KvStorage>> create_kv_storage(int64_t num_layers, int64_t num_blocks,
                                                                 int64_t block_size, int64_t kv_dim) = 0;

  // ---- ops ----
  /// out[n, cols] = table row ids[i] (ids: backend int32 buffer of n entries).
  virtual void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) = 0;
  /// out[n, d] = x / sqrt(mean(x^2) + eps) * w   (RMSNorm, Zhang & Sennrich 2019).
  virtual void rms_norm(const float* x, const Weight& w, float eps, int64_t n, int64_t d, float* out) = 0;
  /// y[n, w.rows] = x[n, w.cols] * w^T, optionally + bias[w.rows].
  virtual void matmul(const Weight& w, const float* x, int64_t n, float* y, const Weight* bias = nullptr) = 0;
  /// One product of matmul_multi: y[n, w->rows] = x * w^T, + bias[w->rows] when bias is set.
  struct MatmulOutput {
    const Weight* w = nullptr;
    float* y = nullptr;
    const Weight* bias = nullptr;
  };
  /// The products of several weights with one x[n, cols] (a layer's Q, K and V projections; its
  /// gate and up projections), each y bit for bit what matmul() gives it; the ys must not alias
  /// x or each other. A backend may run them as one job (the CPU: one parallel loop over all
  /// their rows, and under its vnni kernel x quantised once; cpu/matmul.h matmul_weights).
  /// Default: matmul() per output.
  virtual void matmul_multi(const MatmulOutput* outs, int64_t count, const float* x, int64_t n) {
    for (int64_t i = 0; i < count; ++i) matmul(*outs[i].w, x, n, outs[i].y, outs[i].bias);
  }
  /// In place: x[n, num_heads, head_dim] rotated by RoPE (Su et al. 2021) at positions[n]
  /// (backend int32 buffer).
  virtual void rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeParams& p) = 0;
  /// Stores k, v [n, kv_dim] of `layer` into slots[n] (backend int32 buffer).
  virtual void kv_write(KvStorage& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n) = 0;
  /// out[rows, num_heads * head_dim] = softmax(q k^T / sqrt(head_dim)) v over the keys each row
  /// sees (see AttentionSeq), grouped-query: query head h reads kv head h / (num_heads / num_kv_heads).
  virtual void attention(KvStorage& kv, int64_t layer, const float* q, const std::vector<AttentionSeq>& seqs,
                         int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, float* out) = 0;
  /// out[i] = silu(gate[i]) * up[i] for i < n  (SwiGLU, Shazeer 2020).
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  /// x[i] += y[i] for i < n.
  virtual void add(float* x, const float* y, int64_t n) = 0;
  /// out[m, cols] = x rows idx[m] (idx: host pointer).
  virtual void gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out) = 0;
  /// Greedy decoding's reduction of logit rows, so that a greedy step moves two numbers per row
  /// to the host instead of the whole row. For each row r of x[rows, cols] (fp32; cols <= 2^20):
  /// token[r] = its argmax (ties: the lowest index) and logprob[r] = x[r, token] -
  /// log_sum_exp(x[r, :]), both exactly greedy_pick's (model/sampling.h: the same vectorised exp,
  /// lanes and double sums, so the CPU and the GPU give the same token and, up to the last bits
  /// of the final log, the same logprob); token -1 and logprob 0 for a row that cannot be
  /// sampled (a NaN or +inf, or no finite value). `token`, `logprob`: backend buffers of `rows`.
  virtual void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* token, float* logprob) = 0;
  /// As argmax_rows, but row r's token is drawn at temperature[r] with the uniform uniform[r] in
  /// [0, 1): temperature_pick (model/sampling.h), i.e. softmax(x / T) and draw_inverse_cdf's
  /// chunked inverse CDF, the same steps on every backend, so the CPU and the GPU draw the same
  /// token; temperature[r] < 1e-5 takes argmax_rows' pick. `temperature` [rows] fp32 and
  /// `uniform` [rows] fp64 are backend buffers. Sampling on the device for requests with only a
  /// temperature (no top-k, top-p, min-p, penalties).
  virtual void sample_rows(const float* x, int64_t rows, int64_t cols, const float* temperature, const double* uniform,
                           int32_t* token, float* logprob) = 0;
  /// KV of slots src[i] copied to slots dst[i] in every layer (host pointers); used to compact
  /// an accepted tree path into consecutive slots.
  virtual void kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n) = 0;
  /// KV of whole blocks as host bytes, for moving a sequence's cache between workers
  /// (kv/transfer.h). Packed layout (kv/transfer.h's KvLayout::kBlockLayerKV), fp32:
  ///   for each block i < n (in the order of `blocks`), for each layer l in [layer_begin, layer_end):
  ///     K [block_size, kv_dim] of block blocks[i] in layer l, then V [block_size, kv_dim]
  /// so each block's bytes are contiguous: kv_block_bytes(kv, layer_begin, layer_end) each,
  /// block i at offset i * that. `blocks` is a host pointer; `dst` / `src` are host memory of
  /// n * kv_block_bytes bytes. Block ids or layers out of range are bugs (abort).
  virtual void kv_export_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks,
                                int64_t n, void* dst) = 0;
  /// The inverse of kv_export_blocks: writes the packed bytes at `src` into blocks[i] (which may
  /// be other ids than the exporter's: the layout carries no block ids).
  virtual void kv_import_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks,
                                int64_t n, const void* src) = 0;
  /// Waits for queued work.
  virtual void synchronize() = 0;
};

}  // namespace specserve
