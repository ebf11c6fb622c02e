#include "gpu/rope_math.h"

#include <algorithm>
#include <cmath>

namespace specserve::gpu {
namespace {

// As cpu/cpu_backend.cpp: llama.cpp's ggml_rope_yarn_corr_dims.
float yarn_corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return n_dims * std::log(n_ctx_orig / (n_rot * 2 * static_cast<float>(M_PI))) / (2 * std::log(base));
}

}  // namespace

RopeKernelParams make_rope_kernel_params(const RopeParams& p) {
  RopeKernelParams k{};
  k.head_dim = static_cast<int32_t>(p.head_dim);
  k.rope_dim = static_cast<int32_t>(p.rope_dim);
  k.neox = p.neox ? 1 : 0;
  k.theta_scale = std::pow(p.theta, -2.0f / static_cast<float>(p.rope_dim));
  k.freq_scale = p.freq_scale;
  k.ext_factor = p.ext_factor;
  k.mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    k.corr_lo = std::max(0.0f, std::floor(yarn_corr_dim(p.rope_dim, p.original_context, p.beta_fast, p.theta)));
    k.corr_hi = std::min(static_cast<float>(p.rope_dim - 1),
                         std::ceil(yarn_corr_dim(p.rope_dim, p.original_context, p.beta_slow, p.theta)));
    k.mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  return k;
}

}  // namespace specserve::gpu
