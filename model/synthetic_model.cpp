#include "model/synthetic_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "model/gguf_writer.h"

namespace specserve {
namespace {

// SplitMix64 (Steele et al. 2014): spreads (seed, name) into independent stream seeds.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t stream_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the tensor name
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(seed ^ splitmix64(h));
}

// Standard normals by Box-Muller over mt19937_64 bits. NOTE: not std::normal_distribution,
// whose algorithm differs between standard libraries; the same seed must write the same file
// everywhere.
class Gaussian {
 public:
  explicit Gaussian(uint64_t seed) : rng_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 0;
    while (u1 <= 0) u1 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2 * M_PI * u2);
  }

 private:
  std::mt19937_64 rng_;
  double spare_ = 0;
  bool has_spare_ = false;
};

// IEEE fp32 -> fp16, round to nearest even (ggml's GGML_FP32_TO_FP16 on F16C hosts).
uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mant = x & 0x7fffffu;
  const int32_t exp = static_cast<int32_t>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int32_t e = exp - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e <= 0) {  // subnormal half (or zero)
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000u;
    const int shift = 14 - e;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // a carry rounds up to inf: correct
  return static_cast<uint16_t>(sign | half);
}

void put_fp16(uint8_t* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, sizeof h);
}

// ggml's reference quantisers (ggml-quants.c quantize_row_q8_0_ref / quantize_row_q4_1_ref).
std::vector<uint8_t> quantize_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 34);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = x.data() + b * 32;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * 34;
    put_fp16(blk, d);
    for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v[j] * id)));
  }
  return out;
}

std::vector<uint8_t> quantize_q4_1(const std::vector<float>& x) {
  std::vector<uint8_t> out(x.size() / 32 * 20);
  for (size_t b = 0; b < x.size() / 32; ++b) {
    const float* v = x.data() + b * 32;
    float mn = v[0], mx = v[0];
    for (int j = 1; j < 32; ++j) mn = std::min(mn, v[j]), mx = std::max(mx, v[j]);
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = out.data() + b * 20;
    put_fp16(blk, d);
    put_fp16(blk + 2, mn);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>((v[j] - mn) * id + 0.5f));
      const int q1 = std::min(15, static_cast<int>((v[j + 16] - mn) * id + 0.5f));
      blk[4 + j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
  return out;
}

// GPT-2's byte -> printable code point table (bytes_to_unicode), as UTF-8 strings.
std::vector<std::string> gpt2_byte_texts() {
  std::vector<int> cpt(256, -1);
  for (int b = 33; b <= 126; ++b) cpt[b] = b;
  for (int b = 161; b <= 172; ++b) cpt[b] = b;
  for (int b = 174; b <= 255; ++b) cpt[b] = b;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (cpt[b] < 0) cpt[b] = 256 + n++;
  std::vector<std::string> out(256);
  for (int b = 0; b < 256; ++b) {
    const uint32_t c = static_cast<uint32_t>(cpt[b]);
    std::string& s = out[b];
    if (c < 0x80) {
      s.push_back(static_cast<char>(c));
    } else {  // every entry is < 0x800: two bytes
      s.push_back(static_cast<char>(0xC0 | (c >> 6)));
      s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// One tensor to write: its init distribution (mean + std * N(0, 1)).
struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;  // GGUF order
  float mean, std;
  bool quantisable;
};

Status write_model(const SyntheticModelSpec& s, int64_t num_layers, float noise, uint64_t noise_seed,
                   int64_t context_length, const std::string& path) {
  SPECSERVE_RETURN_IF_ERROR(validate_synthetic_spec(s));
  const int64_t d = s.hidden_size, hd = s.hidden_size / s.num_heads, qd = s.num_heads * hd, kvd = s.num_kv_heads * hd;
  const int64_t ff = s.ffn_size, V = s.vocab_size;
  const float inv_d = 1.0f / std::sqrt(static_cast<float>(d));

  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", s.name);
  // llama_ftype numbers: ALL_F32 = 0, MOSTLY_Q4_1 = 3, MOSTLY_Q8_0 = 7.
  w.add_u32("general.file_type", s.storage == GgmlType::Q8_0 ? 7u : s.storage == GgmlType::Q4_1 ? 3u : 0u);
  w.add_u32("llama.block_count", static_cast<uint32_t>(num_layers));
  w.add_u32("llama.context_length", static_cast<uint32_t>(context_length));
  w.add_u32("llama.embedding_length", static_cast<uint32_t>(d));
  w.add_u32("llama.feed_forward_length", static_cast<uint32_t>(ff));
  w.add_u32("llama.attention.head_count", static_cast<uint32_t>(s.num_heads));
  w.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(s.num_kv_heads));
  w.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(hd));
  w.add_f32("llama.rope.freq_base", s.rope_theta);
  w.add_f32("llama.attention.layer_norm_rms_epsilon", s.norm_eps);
  w.add_u32("llama.vocab_size", static_cast<uint32_t>(V));

  const std::vector<std::string> vocab = synthetic_vocab(V);
  // GGUF token types: 1 normal, 3 control.
  std::vector<int32_t> types(static_cast<size_t>(V), 1);
  types[kSyntheticEosId] = 3;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_string_array("tokenizer.ggml.tokens", vocab);
  w.add_i32_array("tokenizer.ggml.token_type", types);
  w.add_string_array("tokenizer.ggml.merges", {});
  w.add_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(kSyntheticEosId));
  w.add_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(kSyntheticEosId));
  w.add_bool("tokenizer.ggml.add_bos_token", false);

  std::vector<TensorPlan> plan;
  plan.push_back({"token_embd.weight", {d, V}, 0.0f, 1.0f, true});
  plan.push_back({"output_norm.weight", {d}, 1.0f, 0.1f, false});
  if (!s.tied_output) plan.push_back({"output.weight", {d, V}, 0.0f, s.logit_scale * inv_d, true});
  for (int64_t l = 0; l < num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    plan.push_back({p + "attn_norm.weight", {d}, 1.0f, 0.1f, false});
    plan.push_back({p + "attn_q.weight", {d, qd}, 0.0f, inv_d, true});
    plan.push_back({p + "attn_k.weight", {d, kvd}, 0.0f, inv_d, true});
    plan.push_back({p + "attn_v.weight", {d, kvd}, 0.0f, inv_d, true});
    plan.push_back({p + "attn_output.weight", {qd, d}, 0.0f, s.residual_scale / std::sqrt(static_cast<float>(qd)), true});
    plan.push_back({p + "ffn_norm.weight", {d}, 1.0f, 0.1f, false});
    plan.push_back({p + "ffn_gate.weight", {d, ff}, 0.0f, inv_d, true});
    plan.push_back({p + "ffn_up.weight", {d, ff}, 0.0f, inv_d, true});
    plan.push_back({p + "ffn_down.weight", {ff, d}, 0.0f, s.residual_scale / std::sqrt(static_cast<float>(ff)), true});
  }
  for (const TensorPlan& t : plan) {
    int64_t n = 1;
    for (int64_t x : t.shape) n *= x;
    std::vector<float> v(static_cast<size_t>(n));
    Gaussian g(stream_seed(s.seed, t.name));
    for (float& x : v) x = t.mean + t.std * static_cast<float>(g.next());
    if (noise > 0.0f) {
      Gaussian gn(stream_seed(noise_seed ^ 0x5EED5EEDull, t.name));
      for (float& x : v) x += noise * t.std * static_cast<float>(gn.next());
    }
    Status st;
    if (!t.quantisable || s.storage == GgmlType::F32) {
      st = w.add_tensor_f32(t.name, t.shape, v);
    } else {
      const std::vector<uint8_t> q = s.storage == GgmlType::Q8_0 ? quantize_q8_0(v) : quantize_q4_1(v);
      st = w.add_tensor(t.name, t.shape, s.storage, q.data(), q.size());
    }
    SPECSERVE_RETURN_IF_ERROR(st);
  }
  return w.write_file(path);
}

}  // namespace

std::vector<std::string> synthetic_vocab(int64_t vocab_size) {
  std::vector<std::string> out;
  if (vocab_size <= 0) return out;
  out.reserve(static_cast<size_t>(vocab_size));
  out.push_back("<|endoftext|>");
  const std::vector<std::string> bytes = gpt2_byte_texts();
  // Byte order: lower-case letters, space, upper case, digits, other printable ASCII, the rest.
  std::vector<int> order;
  for (int b = 'a'; b <= 'z'; ++b) order.push_back(b);
  order.push_back(' ');
  for (int b = 'A'; b <= 'Z'; ++b) order.push_back(b);
  for (int b = '0'; b <= '9'; ++b) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (std::find(order.begin(), order.end(), b) == order.end() && b > 32 && b < 127) order.push_back(b);
  for (int b = 0; b < 256; ++b)
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  for (int b : order) {
    if (static_cast<int64_t>(out.size()) == vocab_size) return out;
    out.push_back(bytes[static_cast<size_t>(b)]);
  }
  // Words of >= 2 lower-case letters, every other one with a leading space (GPT-2 'Ġ').
  for (int64_t i = 0; static_cast<int64_t>(out.size()) < vocab_size; ++i) {
    int64_t j = i / 2, len = 2, span = 26 * 26;
    while (j >= span) j -= span, ++len, span *= 26;
    std::string word(static_cast<size_t>(len), 'a');
    for (int64_t p = len - 1; p >= 0; --p, j /= 26) word[static_cast<size_t>(p)] = static_cast<char>('a' + j % 26);
    out.push_back((i % 2 ? bytes[' '] : std::string()) + word);
  }
  return out;
}

Status validate_synthetic_spec(const SyntheticModelSpec& s) {
  auto bad = [](const char* field, int64_t v, const char* rule) {
    return invalid_argument(std::string("synthetic model: ") + field + " = " + std::to_string(v) + ": " + rule);
  };
  if (s.num_layers < 1 || s.num_layers > 256) return bad("num_layers", s.num_layers, "must be in 1..256");
  if (s.hidden_size < 8 || s.hidden_size % 8 != 0) return bad("hidden_size", s.hidden_size, "must be a positive multiple of 8");
  if (s.num_heads < 1 || s.hidden_size % s.num_heads != 0) return bad("num_heads", s.num_heads, "must divide hidden_size");
  if ((s.hidden_size / s.num_heads) % 2 != 0) return bad("num_heads", s.num_heads, "head_dim must be even");
  if (s.num_kv_heads < 1 || s.num_heads % s.num_kv_heads != 0) return bad("num_kv_heads", s.num_kv_heads, "must divide num_heads");
  if (s.ffn_size < 8 || s.ffn_size % 8 != 0) return bad("ffn_size", s.ffn_size, "must be a positive multiple of 8");
  if (s.vocab_size < 2 || s.vocab_size > (int64_t(1) << 24)) return bad("vocab_size", s.vocab_size, "must be in 2..2^24");
  if (s.context_length < 2 || s.context_length > (int64_t(1) << 24)) return bad("context_length", s.context_length, "must be in 2..2^24");
  if (s.storage != GgmlType::F32 && s.storage != GgmlType::Q8_0 && s.storage != GgmlType::Q4_1) {
    return unsupported("synthetic model: storage " + ggml_type_name(static_cast<uint32_t>(s.storage)) +
                       " is not supported (F32, Q8_0, Q4_1 are)");
  }
  if (s.storage != GgmlType::F32) {
    if (s.hidden_size % 32 != 0) return bad("hidden_size", s.hidden_size, "must be a multiple of 32 for quantised storage");
    if (s.ffn_size % 32 != 0) return bad("ffn_size", s.ffn_size, "must be a multiple of 32 for quantised storage");
  }
  if (!(s.residual_scale >= 0) || !(s.logit_scale > 0) || !(s.rope_theta > 0) || !(s.norm_eps > 0)) {
    return invalid_argument("synthetic model: residual_scale must be >= 0; logit_scale, rope_theta, norm_eps > 0");
  }
  return Status();
}

Status write_synthetic_llama(const SyntheticModelSpec& spec, const std::string& path) {
  return write_model(spec, spec.num_layers, 0.0f, 0, spec.context_length, path);
}

Status write_synthetic_draft(const SyntheticModelSpec& target, const SyntheticDraftSpec& draft, const std::string& path) {
  if (draft.num_layers < 1 || draft.num_layers > target.num_layers) {
    return invalid_argument("synthetic draft: num_layers = " + std::to_string(draft.num_layers) + ": must be in 1.." +
                            std::to_string(target.num_layers));
  }
  if (!(draft.noise >= 0)) return invalid_argument("synthetic draft: noise must be >= 0");
  if (draft.context_length < 0 || draft.context_length == 1) {
    return invalid_argument("synthetic draft: context_length = " + std::to_string(draft.context_length) + ": must be 0 or >= 2");
  }
  const int64_t ctx = draft.context_length > 0 ? draft.context_length : target.context_length;
  return write_model(target, draft.num_layers, draft.noise, draft.noise_seed, ctx, path);
}

}  // namespace specserve
