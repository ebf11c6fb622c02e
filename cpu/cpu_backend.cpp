#include "cpu/cpu_backend.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/logging.h"
#include "cpu/attention.h"
#include "cpu/kv_array.h"
#include "cpu/matmul.h"
#include "model/dequant.h"
#include "model/sampling.h"


namespace specserve {
namespace {

class CpuWeight final : public Weight {
 public:
  CpuWeight(int64_t rows, int64_t cols, std::vector<float> data) : Weight(rows, cols), data_(std::move(data)) {}
  CpuWeight(int64_t rows, int64_t cols, WeightFormat format, std::vector<uint8_t> blocks)
      : Weight(rows, cols), format_(format), blocks_(std::move(blocks)) {}
  /// fp32 rows; only for weights kept as fp32 (vectors always are).
  const float* data() const {
    SPECSERVE_CHECK(format_ == WeightFormat::kF32, "fp32 view of a weight kept in blocks");
    return data_.data();
  }
  /// The weight as matmul_weight reads it. `for_matmul`: under the vnni kernel the blocks are
  /// also repacked for it, once (load_weight does it as the weight loads; otherwise the first
  /// matmul, e.g. after a switch of kernel; cpu/matmul.h); an embedding lookup reads the blocks
  /// and packs nothing.
  MatmulWeight view(bool for_matmul = true) const {
    MatmulWeight v{format_, format_ == WeightFormat::kF32 ? static_cast<const void*>(data_.data()) : blocks_.data(), rows(), cols()};
    if (for_matmul && format_ != WeightFormat::kF32 && matmul_isa() == MatmulIsa::kVnni) {
      std::call_once(packed_once_, [&] { packed_q8_ = pack_weight_q8(v); });
      v.packed_q8 = packed_q8_.data();
    }
    return v;
  }

 private:
  WeightFormat format_ = WeightFormat::kF32;
  std::vector<float> data_;     // [rows, cols] when kF32
  std::vector<uint8_t> blocks_;  // [rows, weight_row_bytes] otherwise
  mutable std::once_flag packed_once_;
  mutable std::vector<uint8_t> packed_q8_;  // pack_weight_q8(blocks_), under the vnni kernel
};

// SPECSERVE_CPU_WEIGHTS: "blocks" (default) keeps Q4_1 / Q8_0 matmul weights as their GGUF blocks
// and dequantises per tile inside matmul; "f32" dequantises every weight at load. The results are
// the same bits; blocks take 128 / 20 = 6.4x (Q4_1) and 128 / 34 = 3.8x (Q8_0) fewer bytes, in
// memory and per decode step (the default model: 100 MB per step against 542 MB).
bool keep_blocks() {
  static const bool keep = [] {
    const std::string v = cpu_kernel_env("SPECSERVE_CPU_WEIGHTS");
    if (!v.empty() && v != "blocks" && v != "f32") {
      get_logger("cpu")->warn("SPECSERVE_CPU_WEIGHTS = '{}' is not one of blocks, f32; keeping blocks", std::getenv("SPECSERVE_CPU_WEIGHTS"));
    }
    return v != "f32";
  }();
  return keep;
}

class CpuBuffer final : public Buffer {
 public:
  explicit CpuBuffer(int64_t bytes) : Buffer(bytes) {
    // 64-byte aligned for SIMD loads; at least one line so empty buffers are valid pointers.
    size_t sz = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
    ptr_ = std::aligned_alloc(64, sz);
  }
  ~CpuBuffer() override { std::free(ptr_); }
  void* data() override { return ptr_; }

 private:
  void* ptr_;
};

class CpuKvStorage final : public KvStorage {
 public:
  CpuKvStorage(int64_t layers, int64_t blocks, int64_t bs, int64_t kv_dim)
      : KvStorage(layers, blocks, bs, kv_dim), k_(layers * blocks * bs * kv_dim), v_(layers * blocks * bs * kv_dim) {}
  float* k(int64_t layer, int64_t slot) { return k_.data() + (layer * num_blocks_ * block_size_ + slot) * kv_dim_; }
  float* v(int64_t layer, int64_t slot) { return v_.data() + (layer * num_blocks_ * block_size_ + slot) * kv_dim_; }

 private:
  KvArray k_, v_;  // [layers, blocks * block_size, kv_dim]
};

void check_block_range(const KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n) {
  SPECSERVE_CHECK(layer_begin >= 0 && layer_begin < layer_end && layer_end <= kv.num_layers(),
                  "kv layer range [" + std::to_string(layer_begin) + ", " + std::to_string(layer_end) + ") of " +
                      std::to_string(kv.num_layers()));
  for (int64_t i = 0; i < n; ++i)
    SPECSERVE_CHECK(blocks[i] >= 0 && blocks[i] < kv.num_blocks(),
                    "kv block id " + std::to_string(blocks[i]) + " of " + std::to_string(kv.num_blocks()));
}

const CpuWeight& cw(const Weight& w) { return static_cast<const CpuWeight&>(w); }

float rope_yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0) / 2 - low) / std::max(0.001f, high - low);
  return 1 - std::min(1.0f, std::max(0.0f, y));
}

// Dimension where the rotation count over the original context equals n_rot (llama.cpp's
// ggml_rope_yarn_corr_dims).
float yarn_corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) {
    threads_ = num_threads > 0 ? num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(threads_);
    // Once per process: the kernel decides the last bits of every result (cpu/matmul.h), so a
    // sequence moved between processes continues bit for bit only where both run the same one.
    static std::once_flag said;
    std::call_once(said, [] {
      // vnni multiplies only Q4_1 / Q8_0 blocks: with every weight dequantised at load there is
      // nothing for it, and the process runs (and says, and records) the AVX-512 fp32 kernel.
      const bool vnni_without_blocks = matmul_isa() == MatmulIsa::kVnni && !keep_blocks();
      if (vnni_without_blocks) {
        set_matmul_isa(MatmulIsa::kAvx512, "SPECSERVE_CPU_MATMUL=vnni, but SPECSERVE_CPU_WEIGHTS=f32 leaves it no Q4_1/Q8_0 blocks");
      }
      get_logger("cpu")->info("matmul kernel {} ({}); processes that continue each other's sequences should use the same one "
                              "(--dtype float32|bfloat16, SPECSERVE_CPU_MATMUL=avx2|avx512|amx|vnni); attention {} (SPECSERVE_CPU_ATTENTION=tiled|rowwise, same bits); "
                              "Q4_1/Q8_0 weights {} (SPECSERVE_CPU_WEIGHTS=blocks|f32, same bits under the fp32 kernels){}",
                              matmul_isa_name(matmul_isa()), matmul_isa_source(), attention_kernel_name(),
                              keep_blocks() ? "kept as blocks" : "dequantised at load",
                              !keep_blocks() ? ""
                              : matmul_isa() == MatmulIsa::kVnni ? ", repacked for the int8 kernel as they load"
                              : fused_block_matmul() ? ", dequantised in registers for decode rows (SPECSERVE_CPU_FUSED_DEQUANT=1|0, same bits)"
                                                     : ", dequantised through a buffer for every matmul (SPECSERVE_CPU_FUSED_DEQUANT=0)");
      if (vnni_without_blocks) {
        get_logger("cpu")->warn("SPECSERVE_CPU_MATMUL=vnni with SPECSERVE_CPU_WEIGHTS=f32: no weight stays in Q4_1/Q8_0 blocks, so "
                                "every matmul runs the avx512 fp32 kernel");
      }
    });
  }

  std::string name() const override { return "cpu"; }
  bool supports_weight_type(GgmlType t) const override {
    return ggml_type_traits(static_cast<uint32_t>(t)).has_value() && t != GgmlType::Q8_1 && t != GgmlType::Q8_K;
  }
  // NOTE: false although Q4_1 / Q8_0 weights stay in blocks (keep_blocks): this backend copies the
  // blocks it keeps, so the caller need not keep the tensor's bytes alive (model/backend.h).
  bool keeps_quantized() const override { return false; }

  Expected<std::unique_ptr<Weight>> load_weight(const GgufTensorInfo& t) override {
    if (t.shape.empty() || t.shape.size() > 2) {
      return corrupt_data("tensor '" + t.name + "' has " + std::to_string(t.shape.size()) + " dims; a weight has 1 or 2");
    }
    if (!supports_weight_type(t.type())) {
      return unsupported("tensor '" + t.name + "': type " + ggml_type_name(t.raw_type) + " is not supported by the cpu backend");
    }
    const int64_t cols = t.shape[0];
    const int64_t rows = t.shape.size() == 2 ? t.shape[1] : 1;
    const WeightFormat format = t.type() == GgmlType::Q4_1 ? WeightFormat::kQ4_1
                                : t.type() == GgmlType::Q8_0 ? WeightFormat::kQ8_0
                                                             : WeightFormat::kF32;
    if (format != WeightFormat::kF32 && keep_blocks() && t.shape.size() == 2 && cols % 32 == 0) {
      const uint64_t want = static_cast<uint64_t>(rows * weight_row_bytes(format, cols));
      if (t.num_bytes != want || t.data == nullptr) {
        return corrupt_data("tensor '" + t.name + "': " + std::to_string(t.num_bytes) + " bytes of " + ggml_type_name(t.raw_type) +
                            " for " + std::to_string(rows) + " x " + std::to_string(cols) + " (want " + std::to_string(want) + ")");
      }
      auto w = std::make_unique<CpuWeight>(rows, cols, format, std::vector<uint8_t>(t.data, t.data + t.num_bytes));
      // Under vnni, packed now: the first request should not wait for it (view() packs once).
      // Not the token embedding: an untied model only looks rows up in it, and a tensor-parallel
      // rank other than the first never multiplies it; where it is the output head, its first
      // matmul packs it.
      if (matmul_isa() == MatmulIsa::kVnni && t.name != "token_embd.weight") (void)w->view();
      return std::unique_ptr<Weight>(std::move(w));
    }
    auto data = dequantize_tensor(t);
    if (!data.ok()) return data.status();
    return std::unique_ptr<Weight>(new CpuWeight(rows, cols, std::move(*data)));
  }

  std::unique_ptr<Buffer> alloc(int64_t bytes) override { return std::make_unique<CpuBuffer>(bytes); }
  void upload(Buffer& dst, const void* src, int64_t bytes, int64_t offset) override {
    std::memcpy(static_cast<char*>(dst.data()) + offset, src, static_cast<size_t>(bytes));
  }
  void download(void* dst, Buffer& src, int64_t bytes, int64_t offset) override {
    std::memcpy(dst, static_cast<char*>(src.data()) + offset, static_cast<size_t>(bytes));
  }

  Expected<std::unique_ptr<KvStorage>> create_kv_storage(int64_t layers, int64_t blocks, int64_t bs, int64_t kv_dim) override {
    const double bytes = 2.0 * 4.0 * static_cast<double>(layers) * blocks * bs * kv_dim;
    if (layers <= 0 || blocks <= 0 || bs <= 0 || kv_dim <= 0 || bytes > 64.0 * (1ull << 30)) {
      return resource_exhausted("kv cache of " + std::to_string(blocks) + " blocks x " + std::to_string(bs) +
                                " tokens x " + std::to_string(layers) + " layers x " + std::to_string(kv_dim) +
                                " floats is not allocatable");
    }
    try {
      return std::unique_ptr<KvStorage>(new CpuKvStorage(layers, blocks, bs, kv_dim));
    } catch (const std::bad_alloc&) {
      return resource_exhausted("kv cache allocation of " + std::to_string(bytes / (1 << 20)) + " MiB failed");
    }
  }

  void embedding(const Weight& table, const int32_t* ids, int64_t n, float* out) override {
    const auto& w = cw(table);
    for (int64_t i = 0; i < n; ++i) {
      SPECSERVE_CHECK(ids[i] >= 0 && ids[i] < w.rows(), "token id " + std::to_string(ids[i]) + " out of vocabulary");
      dequantize_rows(w.view(/*for_matmul=*/false), ids[i], 1, out + i * w.cols());
    }
  }

  void rms_norm(const float* x, const Weight& w, float eps, int64_t n, int64_t d, float* out) override {
    const float* g = cw(w).data();
#pragma omp parallel for if (n > 4)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * d;
      float* oi = out + i * d;
      double ss = 0;  // llama.cpp sums in double (ggml_compute_forward_rms_norm_f32)
      for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(xi[j]) * xi[j];
      const float scale = 1.0f / std::sqrt(static_cast<float>(ss / d) + eps);
      for (int64_t j = 0; j < d; ++j) oi[j] = xi[j] * scale * g[j];
    }
  }

  void matmul(const Weight& w, const float* x, int64_t n, float* y, const Weight* bias) override {
    const auto& cwt = cw(w);
    // NOTE: our own kernel rather than sgemm: its per-element reduction order is fixed, so a
    // row's result does not depend on the batch (see cpu/matmul.h); it also shares the OpenMP
    // thread team instead of fighting a BLAS thread pool for the same cores.
    matmul_weight(x, cwt.view(), y, n);
    add_bias(w, bias, n, y);
  }

  // y[n, w.rows] += bias[w.rows] (nothing when bias is null).
  static void add_bias(const Weight& w, const Weight* bias, int64_t n, float* y) {
    if (!bias) return;
    const float* b = cw(*bias).data();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < w.rows(); ++j) y[i * w.rows() + j] += b[j];
  }

  void matmul_multi(const MatmulOutput* outs, int64_t count, const float* x, int64_t n) override {
    // (A layer calls this twice per step with 3 and 2 weights: no heap for those.)
    constexpr int64_t kInline = 4;
    if (count > kInline) {
      for (int64_t i0 = 0; i0 < count; i0 += kInline) matmul_multi(outs + i0, std::min(kInline, count - i0), x, n);
      return;
    }
    MatmulWeight ws[kInline];
    float* ys[kInline] = {};
    for (int64_t i = 0; i < count; ++i) {
      ws[i] = cw(*outs[i].w).view();
      ys[i] = outs[i].y;
    }
    matmul_weights(x, ws, ys, count, n);
    for (int64_t i = 0; i < count; ++i) add_bias(*outs[i].w, outs[i].bias, n, outs[i].y);
  }

  void rope(float* x, const int32_t* positions, int64_t n, int64_t num_heads, const RopeParams& p) override {
    const int64_t hd = p.head_dim, nr = p.rope_dim;
    const float theta_scale = std::pow(p.theta, -2.0f / static_cast<float>(nr));
    float corr_lo = 0, corr_hi = 0;
    if (p.ext_factor != 0.0f) {
      corr_lo = std::max(0.0f, std::floor(yarn_corr_dim(nr, p.original_context, p.beta_fast, p.theta)));
      corr_hi = std::min(static_cast<float>(nr - 1), std::ceil(yarn_corr_dim(nr, p.original_context, p.beta_slow, p.theta)));
    }
#pragma omp parallel if (n > 4)
    {
    // cos/sin per pair, one buffer per thread (this runs twice per layer per step).
    std::vector<float> cs(static_cast<size_t>(nr));
#pragma omp for
    for (int64_t i = 0; i < n; ++i) {
      // Computed as llama.cpp does (theta multiplied up pair by pair).
      float theta_extrap = static_cast<float>(positions[i]);
      for (int64_t i0 = 0; i0 < nr; i0 += 2) {
        float theta_interp = p.freq_scale * theta_extrap;
        float theta = theta_interp;
        float mscale = p.attn_factor;
        if (p.ext_factor != 0.0f) {
          float ramp_mix = rope_yarn_ramp(corr_lo, corr_hi, static_cast<int>(i0)) * p.ext_factor;
          theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
          mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
        }
        cs[i0] = std::cos(theta) * mscale;
        cs[i0 + 1] = std::sin(theta) * mscale;
        theta_extrap *= theta_scale;
      }
      for (int64_t h = 0; h < num_heads; ++h) {
        float* v = x + (i * num_heads + h) * hd;
        for (int64_t i0 = 0; i0 < nr; i0 += 2) {
          const float c = cs[i0], s = cs[i0 + 1];
          int64_t a = p.neox ? i0 / 2 : i0;
          int64_t b = p.neox ? i0 / 2 + nr / 2 : i0 + 1;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * c - x1 * s;
          v[b] = x0 * s + x1 * c;
        }
      }
    }
    }
  }

  void kv_write(KvStorage& kv, int64_t layer, const float* k, const float* v, const int32_t* slots, int64_t n) override {
    auto& s = static_cast<CpuKvStorage&>(kv);
    const int64_t d = kv.kv_dim();
    for (int64_t i = 0; i < n; ++i) {
      SPECSERVE_CHECK(slots[i] >= 0 && slots[i] < kv.num_blocks() * kv.block_size(), "kv slot out of range");
      std::memcpy(s.k(layer, slots[i]), k + i * d, d * sizeof(float));
      std::memcpy(s.v(layer, slots[i]), v + i * d, d * sizeof(float));
    }
  }

  void attention(KvStorage& kv, int64_t layer, const float* q, const std::vector<AttentionSeq>& seqs, int64_t num_heads,
                 int64_t num_kv_heads, int64_t head_dim, float* out) override {
    auto& s = static_cast<CpuKvStorage&>(kv);
    const AttentionCache cache{s.k(layer, 0), s.v(layer, 0), kv.kv_dim(), kv.block_size()};
    attention_f32(cache, q, seqs, num_heads, num_kv_heads, head_dim, out);
  }

  void swiglu(const float* gate, const float* up, int64_t n, float* out) override {
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  }

  void add(float* x, const float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  void gather_rows(const float* x, const int32_t* idx, int64_t m, int64_t cols, float* out) override {
    for (int64_t i = 0; i < m; ++i) std::memcpy(out + i * cols, x + static_cast<int64_t>(idx[i]) * cols, cols * sizeof(float));
  }

  void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* token, float* logprob) override {
    SPECSERVE_CHECK(cols > 0 && cols <= (int64_t{1} << 20), "argmax_rows: cols = " + std::to_string(cols) + " outside 1..2^20");
#pragma omp parallel for if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const RowPick p = greedy_pick(x + r * cols, static_cast<int32_t>(cols));
      token[r] = p.token;
      logprob[r] = p.logprob;
    }
  }

  void sample_rows(const float* x, int64_t rows, int64_t cols, const float* temperature, const double* uniform,
                   int32_t* token, float* logprob) override {
    SPECSERVE_CHECK(cols > 0 && cols <= (int64_t{1} << 20), "sample_rows: cols = " + std::to_string(cols) + " outside 1..2^20");
#pragma omp parallel for if (rows > 1)
    for (int64_t r = 0; r < rows; ++r) {
      const RowPick p = temperature_pick(x + r * cols, static_cast<int32_t>(cols), temperature[r], uniform[r]);
      token[r] = p.token;
      logprob[r] = p.logprob;
    }
  }

  void kv_copy_slots(KvStorage& kv, const int32_t* src, const int32_t* dst, int64_t n) override {
    auto& s = static_cast<CpuKvStorage&>(kv);
    const int64_t d = kv.kv_dim();
    for (int64_t l = 0; l < kv.num_layers(); ++l)
      for (int64_t i = 0; i < n; ++i) {
        if (src[i] == dst[i]) continue;
        std::memmove(s.k(l, dst[i]), s.k(l, src[i]), d * sizeof(float));
        std::memmove(s.v(l, dst[i]), s.v(l, src[i]), d * sizeof(float));
      }
  }

  void kv_export_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                        void* dst) override {
    check_block_range(kv, layer_begin, layer_end, blocks, n);
    auto& s = static_cast<CpuKvStorage&>(kv);
    // A block's slots are consecutive in CpuKvStorage, so each (block, layer, K|V) is one memcpy.
    const size_t part = static_cast<size_t>(kv.block_size() * kv.kv_dim()) * sizeof(float);
    char* out = static_cast<char*>(dst);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t l = layer_begin; l < layer_end; ++l) {
        const int64_t slot = static_cast<int64_t>(blocks[i]) * kv.block_size();
        std::memcpy(out, s.k(l, slot), part);
        std::memcpy(out + part, s.v(l, slot), part);
        out += 2 * part;
      }
  }

  void kv_import_blocks(KvStorage& kv, int64_t layer_begin, int64_t layer_end, const int32_t* blocks, int64_t n,
                        const void* src) override {
    check_block_range(kv, layer_begin, layer_end, blocks, n);
    auto& s = static_cast<CpuKvStorage&>(kv);
    const size_t part = static_cast<size_t>(kv.block_size() * kv.kv_dim()) * sizeof(float);
    const char* in = static_cast<const char*>(src);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t l = layer_begin; l < layer_end; ++l) {
        const int64_t slot = static_cast<int64_t>(blocks[i]) * kv.block_size();
        std::memcpy(s.k(l, slot), in, part);
        std::memcpy(s.v(l, slot), in + part, part);
        in += 2 * part;
      }
  }

  void synchronize() override {}

 private:
  int threads_ = 1;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads) { return std::make_unique<CpuBackend>(num_threads); }

const char* cpu_weight_storage() { return keep_blocks() ? "blocks" : "f32"; }

}  // namespace specserve
