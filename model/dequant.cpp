// NOTE: no floating-point contraction in this file: the oracle (gguf-py, numpy) rounds after
// each multiply and each add, and a fused multiply-add would differ in the last bit.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "model/dequant.h"

#include <cstring>
#include <string>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "model/gguf.h"

namespace specserve {
namespace {

constexpr int kQk = 32;    // elements per block of the legacy formats (Q4_0 ... Q8_0)
constexpr int kQkK = 256;  // elements per super-block of the K formats

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);  // GGUF is little-endian, like every host we build for
  return v;
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// IEEE half -> float, exact for every finite value, infinities and NaN payloads.
inline float fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise the mantissa.
    int e = -1;
    do {
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    bits = sign | (static_cast<uint32_t>(112 - e) << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

inline float load_fp16(const uint8_t* p) { return fp16_to_fp32(load_u16(p)); }

void dequant_f16(const uint8_t* src, int64_t n, float* dst) {
  int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = load_fp16(src + 2 * i);
}

void dequant_bf16(const uint8_t* src, int64_t n, float* dst) {
  // bf16 is the top half of an fp32: a shift is exact, NaN payloads included.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(load_u16(src + 2 * i)) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}

// block_q4_0: fp16 d; uint8 qs[16]. Low nibbles are elements 0..15, high nibbles 16..31.
void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < kQk / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0f) - 8);
    y[j + kQk / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// block_q4_1: fp16 d, fp16 m; uint8 qs[16]. y = d * q + m.
void dequant_q4_1(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float m = load_fp16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < kQk / 2; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0f) + m;
    y[j + kQk / 2] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// block_q5_0: fp16 d; uint32 qh (bit j = 5th bit of element j); uint8 qs[16].
void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const uint32_t qh = load_u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < kQk / 2; ++j) {
    const int x0 = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int x1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(x0 - 16);
    y[j + kQk / 2] = d * static_cast<float>(x1 - 16);
  }
}

// block_q5_1: fp16 d, fp16 m; uint32 qh; uint8 qs[16]. y = d * q + m.
void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float m = load_fp16(b + 2);
  const uint32_t qh = load_u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < kQk / 2; ++j) {
    const int x0 = (qs[j] & 0x0f) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int x1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(x0) + m;
    y[j + kQk / 2] = d * static_cast<float>(x1) + m;
  }
}

// block_q8_0: fp16 d; int8 qs[32].
void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < kQk; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

// block_q2_K: uint8 scales[16] (low nibble scale, high nibble min, per 16 elements);
// uint8 qs[64] (2-bit quants); fp16 d; fp16 dmin. Each 128-element half reads 32 bytes of qs
// four times, at bit shifts 0, 2, 4, 6. y = (d * scale) * q - (dmin * min).
void dequant_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = load_fp16(b + 80);
  const float dmin = load_fp16(b + 82);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = qs + 32 * half;
    for (int shift = 0; shift < 4; ++shift) {
      for (int g = 0; g < 2; ++g) {  // two groups of 16 elements share one scale byte
        const int e0 = 128 * half + 32 * shift + 16 * g;
        const uint8_t sc = scales[e0 / 16];
        const float dl = d * static_cast<float>(sc & 0x0f);
        const float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          y[e0 + l] = dl * static_cast<float>((q[16 * g + l] >> (2 * shift)) & 3) - ml;
        }
      }
    }
  }
}

// block_q3_K: uint8 hmask[32] (3rd bit, inverted: a set bit means no -4 offset); uint8 qs[64]
// (low 2 bits, laid out as in Q2_K); uint8 scales[12] (sixteen 6-bit scales, biased by 32);
// fp16 d. y = (d * (scale - 32)) * (q_low - 4 * !hbit).
void dequant_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* sc = b + 96;
  const float d = load_fp16(b + 108);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int lo = (i < 8) ? (sc[i] & 0x0f) : (sc[i - 8] >> 4);
    const int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
    dl[i] = d * static_cast<float>(static_cast<int8_t>(lo | (hi << 4)) - 32);
  }
  for (int half = 0; half < 2; ++half) {
    const uint8_t* q = qs + 32 * half;
    for (int shift = 0; shift < 4; ++shift) {
      const int bit = 4 * half + shift;
      const int e0 = 128 * half + 32 * shift;
      for (int l = 0; l < 32; ++l) {
        const int low = (q[l] >> (2 * shift)) & 3;
        const int sub = ((hmask[l] >> bit) & 1) ? 0 : 4;
        y[e0 + l] = dl[(e0 + l) / 16] * static_cast<float>(low - sub);
      }
    }
  }
}

// The 12-byte scale/min packing shared by Q4_K and Q5_K: eight 6-bit scales and eight 6-bit
// mins (ggml-quants.c get_scale_min_k4).
inline void unpack_scale_min_k4(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = static_cast<uint8_t>((s[j + 8] & 0x0f) | ((s[j] >> 6) << 4));
    mn[j + 4] = static_cast<uint8_t>((s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4));
  }
}

// block_q4_K: fp16 d, fp16 dmin; uint8 scales[12]; uint8 qs[128]. Sub-block j (32 elements)
// reads byte 32*(j/2)+l, low nibble for even j, high for odd. y = (d*sc) * q - (dmin*m).
void dequant_q4_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float dmin = load_fp16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_scale_min_k4(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    const float dl = d * static_cast<float>(sc[j]);
    const float ml = dmin * static_cast<float>(mn[j]);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>((q[l] >> shift) & 0x0f) - ml;
  }
}

// block_q5_K: fp16 d, fp16 dmin; uint8 scales[12]; uint8 qh[32] (bit j of byte l = 5th bit of
// element 32*j+l); uint8 qs[128] as in Q4_K.
void dequant_q5_k(const uint8_t* b, float* y) {
  const float d = load_fp16(b);
  const float dmin = load_fp16(b + 2);
  uint8_t sc[8], mn[8];
  unpack_scale_min_k4(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    const float dl = d * static_cast<float>(sc[j]);
    const float ml = dmin * static_cast<float>(mn[j]);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) {
      const int v = ((q[l] >> shift) & 0x0f) | (((qh[l] >> j) & 1) << 4);
      y[32 * j + l] = dl * static_cast<float>(v) - ml;
    }
  }
}

// block_q6_K: uint8 ql[128] (low 4 bits); uint8 qh[64] (high 2 bits); int8 scales[16]; fp16 d.
// In each 128-element half: element 64*h+l (l < 64) takes nibble h of ql[64*half+l]; element
// 32*s+l (l < 32) takes bits 2s..2s+1 of qh[32*half+l]. y = (d * scale) * (q - 32).
void dequant_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = load_fp16(b + 208);
  float dl[16];
  for (int i = 0; i < 16; ++i) dl[i] = d * static_cast<float>(scales[i]);
  for (int half = 0; half < 2; ++half) {
    const uint8_t* l4 = ql + 64 * half;
    const uint8_t* h2 = qh + 32 * half;
    float* out = y + 128 * half;
    const float* dh = dl + 8 * half;
    for (int l = 0; l < 32; ++l) {
      const int q0 = (l4[l] & 0x0f) | (((h2[l] >> 0) & 3) << 4);
      const int q1 = (l4[l + 32] & 0x0f) | (((h2[l] >> 2) & 3) << 4);
      const int q2 = (l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4);
      const int q3 = (l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4);
      out[l] = dh[l / 16] * static_cast<float>(q0 - 32);
      out[l + 32] = dh[2 + l / 16] * static_cast<float>(q1 - 32);
      out[l + 64] = dh[4 + l / 16] * static_cast<float>(q2 - 32);
      out[l + 96] = dh[6 + l / 16] * static_cast<float>(q3 - 32);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_0: return dequant_q4_0;
    case GgmlType::Q4_1: return dequant_q4_1;
    case GgmlType::Q5_0: return dequant_q5_0;
    case GgmlType::Q5_1: return dequant_q5_1;
    case GgmlType::Q8_0: return dequant_q8_0;
    case GgmlType::Q2_K: return dequant_q2_k;
    case GgmlType::Q3_K: return dequant_q3_k;
    case GgmlType::Q4_K: return dequant_q4_k;
    case GgmlType::Q5_K: return dequant_q5_k;
    case GgmlType::Q6_K: return dequant_q6_k;
    default: return nullptr;
  }
}

}  // namespace

bool dequant_supported(GgmlType type) {
  return type == GgmlType::F32 || type == GgmlType::F16 || type == GgmlType::BF16 ||
         block_fn(type) != nullptr;
}

Status dequantize(GgmlType type, const uint8_t* src, int64_t num_elements, float* dst) {
  const uint32_t raw = static_cast<uint32_t>(type);
  const auto traits = ggml_type_traits(raw);
  if (!traits || !dequant_supported(type)) {
    return unsupported("dequantize: type " + ggml_type_name(raw) + " (" + std::to_string(raw) +
                       ") is not supported");
  }
  if (num_elements < 0 || num_elements % traits->block_size != 0) {
    return invalid_argument("dequantize: type " + std::string(traits->name) + ": num_elements " +
                            std::to_string(num_elements) + " is not a non-negative multiple of the block size " +
                            std::to_string(traits->block_size));
  }
  if (num_elements == 0) return Status();
  if (src == nullptr || dst == nullptr) {
    return invalid_argument("dequantize: type " + std::string(traits->name) + ": null " +
                            (src == nullptr ? "src" : "dst") + " for " + std::to_string(num_elements) +
                            " elements");
  }
  switch (type) {
    case GgmlType::F32: std::memcpy(dst, src, static_cast<size_t>(num_elements) * sizeof(float)); return Status();
    case GgmlType::F16: dequant_f16(src, num_elements, dst); return Status();
    case GgmlType::BF16: dequant_bf16(src, num_elements, dst); return Status();
    default: break;
  }
  const BlockFn fn = block_fn(type);
  const int64_t num_blocks = num_elements / traits->block_size;
  for (int64_t i = 0; i < num_blocks; ++i) {
    fn(src + i * traits->type_size, dst + i * traits->block_size);
  }
  return Status();
}

Status check_block_scales(const GgufTensorInfo& t) {
  // Offsets of the fp16 scales in one block, and the block's size (ggml-common.h).
  struct Scales {
    int64_t bytes;
    int offsets[2];
    int count;
    const char* names[2];
  };
  Scales s{};
  switch (t.type()) {
    case GgmlType::Q4_0: s = {18, {0, 0}, 1, {"d", ""}}; break;
    case GgmlType::Q4_1: s = {20, {0, 2}, 2, {"d", "m"}}; break;
    case GgmlType::Q5_0: s = {22, {0, 0}, 1, {"d", ""}}; break;
    case GgmlType::Q5_1: s = {24, {0, 2}, 2, {"d", "m"}}; break;
    case GgmlType::Q8_0: s = {34, {0, 0}, 1, {"d", ""}}; break;
    case GgmlType::Q2_K: s = {84, {80, 82}, 2, {"d", "dmin"}}; break;
    case GgmlType::Q3_K: s = {110, {108, 0}, 1, {"d", ""}}; break;
    case GgmlType::Q4_K: s = {144, {0, 2}, 2, {"d", "dmin"}}; break;
    case GgmlType::Q5_K: s = {176, {0, 2}, 2, {"d", "dmin"}}; break;
    case GgmlType::Q6_K: s = {210, {208, 0}, 1, {"d", ""}}; break;
    default: return Status();
  }
  const int64_t per_block = t.type() >= GgmlType::Q2_K && t.type() <= GgmlType::Q6_K ? kQkK : kQk;
  const int64_t blocks = t.num_elements / per_block;
  if (t.data == nullptr || t.num_elements % per_block != 0 || static_cast<int64_t>(t.num_bytes) != blocks * s.bytes) {
    return corrupt_data("tensor '" + t.name + "': " + std::to_string(t.num_bytes) + " bytes of " + ggml_type_name(t.raw_type) +
                        " for " + std::to_string(t.num_elements) + " values");
  }
  for (int64_t b = 0; b < blocks; ++b) {
    for (int i = 0; i < s.count; ++i) {
      const uint16_t h = load_u16(t.data + b * s.bytes + s.offsets[i]);
      if ((h & 0x7c00u) == 0x7c00u) {  // exponent all ones: infinity or NaN
        // Where: row and columns of a matrix (GGUF shape[0] values per row), else values.
        const int64_t v = b * per_block, w = t.shape.size() >= 2 ? t.shape[0] : 0;
        const std::string where = w > 0 && w % per_block == 0
                                      ? "row " + std::to_string(v / w) + ", columns " + std::to_string(v % w) + ".." +
                                            std::to_string(v % w + per_block - 1)
                                      : "values " + std::to_string(v) + ".." + std::to_string(v + per_block - 1);
        return corrupt_data("tensor '" + t.name + "' (" + ggml_type_name(t.raw_type) + "): block " + std::to_string(b) + " of " +
                            std::to_string(blocks) + " (" + where + ") has scale " + s.names[i] + " = " +
                            std::to_string(fp16_to_fp32(h)) + ": the file is corrupt");
      }
    }
  }
  return Status();
}

Expected<std::vector<float>> dequantize_tensor(const GgufTensorInfo& t) {
  const std::string type_name = ggml_type_name(t.raw_type);
  const auto traits = ggml_type_traits(t.raw_type);
  if (!traits || !dequant_supported(t.type())) {
    return unsupported("dequantize tensor '" + t.name + "': type " + type_name + " is not supported");
  }
  const int64_t need = ggml_row_bytes(t.type(), t.num_elements);
  if (need < 0) {
    return invalid_argument("dequantize tensor '" + t.name + "': type " + type_name + ": num_elements " +
                            std::to_string(t.num_elements) + " is not a non-negative multiple of the block size " +
                            std::to_string(traits->block_size));
  }
  if (static_cast<uint64_t>(need) != t.num_bytes) {
    return corrupt_data("dequantize tensor '" + t.name + "': type " + type_name + " with " +
                        std::to_string(t.num_elements) + " elements needs " + std::to_string(need) +
                        " bytes, tensor has " + std::to_string(t.num_bytes));
  }
  if (t.data == nullptr && t.num_elements > 0) {
    return corrupt_data("dequantize tensor '" + t.name + "': no data");
  }
  std::vector<float> out(static_cast<size_t>(t.num_elements));
  Status st = dequantize(t.type(), t.data, t.num_elements, out.data());
  if (!st.ok()) return Status(st.code(), "tensor '" + t.name + "': " + st.message());
  return out;
}

}  // namespace specserve
