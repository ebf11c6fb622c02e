// specserve gpu: RoPE's per-pair math (llama.cpp's rope with yarn, as CpuBackend::rope computes
// it), shared by rope_kernel and host code: the tests run it on the CPU against the CPU backend.
// No CUDA header (SPECSERVE_HOST_DEVICE marks what nvcc also compiles for the device).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SPECSERVE_ROPE_HD __host__ __device__
#else
#define SPECSERVE_ROPE_HD
#include "model/backend.h"
#endif

namespace specserve::gpu {

/// RoPE's constants for the kernel. `theta_scale` = theta^(-2/rope_dim); `mscale` = attn_factor,
/// times (1 + 0.1 ln(1/freq_scale)) when ext_factor != 0; corr_lo/hi the yarn correction dims
/// (unused when ext_factor == 0).
struct RopeKernelParams {
  int32_t head_dim, rope_dim;
  int32_t neox;
  float theta_scale, freq_scale, ext_factor, mscale, corr_lo, corr_hi;
};

SPECSERVE_ROPE_HD inline float rope_yarn_ramp(float low, float high, int i0) {
  const float y = (static_cast<float>(i0) / 2 - low) / (high - low > 0.001f ? high - low : 0.001f);
  const float c = y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
  return 1 - c;
}

/// The rotation angle of pair `pr` (dims 2pr, 2pr+1 of the table) at `position`: theta
/// multiplied up pair by pair from the position, as CpuBackend::rope does.
SPECSERVE_ROPE_HD inline float rope_angle(int32_t position, int pr, const RopeKernelParams& p) {
  float theta_extrap = static_cast<float>(position);
  for (int s = 0; s < pr; ++s) theta_extrap *= p.theta_scale;
  const float theta_interp = p.freq_scale * theta_extrap;
  if (p.ext_factor == 0.0f) return theta_interp;
  const float ramp_mix = rope_yarn_ramp(p.corr_lo, p.corr_hi, 2 * pr) * p.ext_factor;
  return theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
}

/// The two dims pair `pr` rotates: (2pr, 2pr+1), or neox's (pr, pr + rope_dim/2).
SPECSERVE_ROPE_HD inline void rope_pair_dims(int pr, const RopeKernelParams& p, int* a, int* b) {
  *a = p.neox ? pr : 2 * pr;
  *b = p.neox ? pr + p.rope_dim / 2 : 2 * pr + 1;
}

#ifndef __CUDACC__
/// The kernel's constants for `p`, computed on the host exactly as CpuBackend::rope does.
RopeKernelParams make_rope_kernel_params(const RopeParams& p);
#endif

}  // namespace specserve::gpu
