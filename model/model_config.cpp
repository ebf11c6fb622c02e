#include "model/model_config.h"

#include <set>

namespace specserve {
namespace {

Status check_shape(const GgufFile& f, const std::string& name, std::vector<int64_t> want, bool required = true) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (!t) {
    if (!required) return Status();
    return corrupt_data(f.path() + ": tensor '" + name + "' is missing");
  }
  if (t->shape != want) {
    auto fmt = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
      return r + "]";
    };
    return corrupt_data(f.path() + ": tensor '" + name + "' has shape " + fmt(t->shape) +
                        " but the architecture needs " + fmt(want));
  }
  return Status();
}

}  // namespace

Expected<ModelConfig> ModelConfig::from_gguf(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch.ok()) return arch.status();
  c.arch = *arch;
  static const std::set<std::string> kSupported = {"llama", "qwen2", "smollm", "mistral"};
  if (!kSupported.count(c.arch)) {
    return unsupported(f.path() + ": general.architecture '" + c.arch +
                       "' is not supported (llama, qwen2, smollm, mistral are)");
  }
  c.name = f.get_string("general.name").ok() ? *f.get_string("general.name") : c.arch;
  const std::string a = c.arch + ".";
  auto need_int = [&](const std::string& key, int64_t* out) -> Status {
    auto v = f.get_int(key);
    if (!v.ok()) return corrupt_data(v.status().message());
    if (*v <= 0 || *v > (int64_t(1) << 24)) {
      return corrupt_data(f.path() + ": " + key + " = " + std::to_string(*v) + " is out of range");
    }
    *out = *v;
    return Status();
  };
  SPECSERVE_RETURN_IF_ERROR(need_int(a + "block_count", &c.num_layers));
  SPECSERVE_RETURN_IF_ERROR(need_int(a + "embedding_length", &c.hidden_size));
  SPECSERVE_RETURN_IF_ERROR(need_int(a + "feed_forward_length", &c.ffn_size));
  SPECSERVE_RETURN_IF_ERROR(need_int(a + "attention.head_count", &c.num_heads));
  SPECSERVE_RETURN_IF_ERROR(need_int(a + "context_length", &c.context_length));
  c.num_kv_heads = c.num_heads;
  if (f.has(a + "attention.head_count_kv")) SPECSERVE_RETURN_IF_ERROR(need_int(a + "attention.head_count_kv", &c.num_kv_heads));
  if (c.num_heads % c.num_kv_heads != 0) {
    return corrupt_data(f.path() + ": " + a + "attention.head_count " + std::to_string(c.num_heads) +
                        " is not a multiple of head_count_kv " + std::to_string(c.num_kv_heads));
  }
  c.head_dim = c.hidden_size / c.num_heads;
  if (f.has(a + "attention.key_length")) SPECSERVE_RETURN_IF_ERROR(need_int(a + "attention.key_length", &c.head_dim));
  c.rope_dim = c.head_dim;
  if (f.has(a + "rope.dimension_count")) SPECSERVE_RETURN_IF_ERROR(need_int(a + "rope.dimension_count", &c.rope_dim));
  if (c.rope_dim > c.head_dim || c.rope_dim % 2 != 0) {
    return corrupt_data(f.path() + ": " + a + "rope.dimension_count " + std::to_string(c.rope_dim) + " does not fit head_dim " +
                        std::to_string(c.head_dim));
  }
  auto theta = f.get_float_or(a + "rope.freq_base", 10000.0);
  if (!theta.ok()) return theta.status();
  c.rope_theta = static_cast<float>(*theta);
  auto eps = f.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5);
  if (!eps.ok()) return eps.status();
  c.norm_eps = static_cast<float>(*eps);
  if (!(c.rope_theta > 0) || !(c.norm_eps > 0)) return corrupt_data(f.path() + ": rope.freq_base and layer_norm_rms_epsilon must be positive");
  c.rope_style = c.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kNorm;

  if (f.has(a + "rope.scaling.type")) {
    auto t = f.get_string(a + "rope.scaling.type");
    if (!t.ok()) return t.status();
    c.rope_scaling.type = *t;
    if (c.rope_scaling.type != "none" && c.rope_scaling.type != "linear" && c.rope_scaling.type != "yarn") {
      return unsupported(f.path() + ": " + a + "rope.scaling.type '" + *t + "' is not supported (none, linear, yarn are)");
    }
    auto factor = f.get_float_or(a + "rope.scaling.factor", 1.0);
    if (!factor.ok()) return factor.status();
    c.rope_scaling.factor = static_cast<float>(*factor);
    if (!(c.rope_scaling.factor >= 1.0f)) return corrupt_data(f.path() + ": " + a + "rope.scaling.factor must be >= 1");
    auto orig = f.get_int_or(a + "rope.scaling.original_context_length", c.context_length);
    if (!orig.ok()) return orig.status();
    c.rope_scaling.original_context = *orig;
    auto af = f.get_float_or(a + "rope.scaling.attn_factor", 1.0);
    if (!af.ok()) return af.status();
    c.rope_scaling.attn_factor = static_cast<float>(*af);
  } else if (f.has(a + "rope.scale_linear")) {
    auto s = f.get_float(a + "rope.scale_linear");
    if (!s.ok()) return s.status();
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = static_cast<float>(*s);
  }

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd) return corrupt_data(f.path() + ": tensor 'token_embd.weight' is missing");
  if (embd->shape.size() != 2 || embd->shape[0] != c.hidden_size) {
    return corrupt_data(f.path() + ": tensor 'token_embd.weight' must be [" + std::to_string(c.hidden_size) + ", vocab]");
  }
  c.vocab_size = embd->shape[1];
  if (f.has(a + "vocab_size")) {
    auto vs = f.get_int(a + "vocab_size");
    if (vs.ok() && *vs != c.vocab_size) {
      return corrupt_data(f.path() + ": " + a + "vocab_size " + std::to_string(*vs) + " differs from token_embd rows " +
                          std::to_string(c.vocab_size));
    }
  }
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  c.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;

  const int64_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.ffn_size;
  SPECSERVE_RETURN_IF_ERROR(check_shape(f, "output_norm.weight", {d}));
  SPECSERVE_RETURN_IF_ERROR(check_shape(f, "output.weight", {d, c.vocab_size}, false));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_norm.weight", {d}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_q.weight", {d, qd}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_k.weight", {d, kvd}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_v.weight", {d, kvd}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_output.weight", {qd, d}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "ffn_norm.weight", {d}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "ffn_gate.weight", {d, ff}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "ffn_up.weight", {d, ff}));
    SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "ffn_down.weight", {ff, d}));
    if (c.has_qkv_bias) {
      SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_q.bias", {qd}));
      SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_k.bias", {kvd}));
      SPECSERVE_RETURN_IF_ERROR(check_shape(f, p + "attn_v.bias", {kvd}));
    }
  }
  return c;
}

}  // namespace specserve
