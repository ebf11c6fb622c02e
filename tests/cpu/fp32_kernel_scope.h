// A scope in which matmuls run an fp32 kernel (cpu/matmul.h), for tests whose bounds are
// properties of the fp32 kernels and that must hold when a run sets SPECSERVE_CPU_MATMUL=vnni or
// amx for the whole suite.
#pragma once

#include "cpu/matmul.h"

namespace specserve::testing {

/// While alive, the process's matmul kernel is an fp32 one: its own where it already is one
/// (AVX-512 or AVX2), else AVX-512, else AVX2; restored on destruction. The kernel is chosen at
/// each matmul, so results do not depend on whether the weights loaded inside the scope (under
/// vnni they are also packed for the int8 kernel as they load; the fp32 kernels ignore that copy).
class Fp32MatmulScope {
 public:
  Fp32MatmulScope() {
    if (saved_ != MatmulIsa::kAvx512 && saved_ != MatmulIsa::kAvx2 && !set_matmul_isa(MatmulIsa::kAvx512)) {
      set_matmul_isa(MatmulIsa::kAvx2);
    }
  }
  ~Fp32MatmulScope() { set_matmul_isa(saved_); }
  Fp32MatmulScope(const Fp32MatmulScope&) = delete;
  Fp32MatmulScope& operator=(const Fp32MatmulScope&) = delete;

 private:
  MatmulIsa saved_ = matmul_isa();
};

}  // namespace specserve::testing
