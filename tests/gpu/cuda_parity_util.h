// Shared by the CUDA parity tests (tests/gpu/cuda_*_test.cpp): the error measure, random
// inputs and the visible skip without a device. The bounds each test uses and why are in
// tests/gpu/cuda_backend_test.cpp's file comment.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/cuda_backend.h"

namespace specserve::testing {

/// Normalised mean squared error: sum (got - want)^2 / sum want^2 (the plain sum of squares
/// when want is all zeros). Sizes: want.size() elements of both.
inline double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

/// n normal(0, scale) floats from mt19937(seed).
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

}  // namespace specserve::testing

// Skips the calling test, visibly, when there is no usable device.
#define SKIP_WITHOUT_CUDA()                                                    \
  do {                                                                         \
    auto info_ = cuda_device_info(0);                                          \
    if (!info_.ok()) GTEST_SKIP() << "no CUDA device: " << info_.status().to_string(); \
  } while (0)
