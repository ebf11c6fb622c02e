// Shared by the CPU kernel tests (tests/cpu/*_test.cpp): random data, bit comparison, the matmul
// lane widths this CPU runs, and a one-thread CpuBackend fixture with host <-> buffer helpers.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#include "model/backend.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "tests/test_util.h"

namespace specserve::testing {

inline std::vector<float> random_vec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Random Q4_1 / Q8_0 blocks [rows, cols] with moderate fp16 scales (exponent 8..15) and random
// quants: a usable weight (the AMX and vnni kernel tests).
inline std::vector<uint8_t> random_q_blocks(WeightFormat format, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(static_cast<size_t>(rows * weight_row_bytes(format, cols)));
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  const size_t block = format == WeightFormat::kQ4_1 ? 20 : 34;
  for (size_t o = 0; o < b.size(); o += block) {
    for (size_t s = 0; s < (format == WeightFormat::kQ4_1 ? 2u : 1u); ++s) {
      uint16_t h = static_cast<uint16_t>(rng());
      h = static_cast<uint16_t>((h & 0x83ff) | ((8 + rng() % 8) << 10));
      std::memcpy(&b[o + 2 * s], &h, 2);
    }
  }
  return b;
}

// The fp32 values of random_q_blocks' weight (model/dequant.h).
inline std::vector<float> dequantised(WeightFormat format, const std::vector<uint8_t>& blocks, int64_t rows, int64_t cols) {
  std::vector<float> w(static_cast<size_t>(rows * cols));
  EXPECT_TRUE(dequantize(format == WeightFormat::kQ4_1 ? GgmlType::Q4_1 : GgmlType::Q8_0, blocks.data(), rows * cols, w.data()).ok());
  return w;
}

inline bool bit_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The matmul lane widths this CPU runs (cpu/matmul.h): AVX2 always, AVX-512 where CPUID has it.
// Says once per process which kernels the looped tests cover, so a log from a CPU without
// AVX-512 shows that only AVX2 ran.
inline std::vector<MatmulIsa> matmul_isas() {
  std::vector<MatmulIsa> isas{MatmulIsa::kAvx2};
  if (__builtin_cpu_supports("avx512f")) isas.push_back(MatmulIsa::kAvx512);
  static const bool said = [&] {
    std::printf("[matmul kernels tested here: %s]\n", isas.size() == 2 ? "avx2 and avx512" : "avx2 only (this CPU has no avx512f)");
    return true;
  }();
  (void)said;
  return isas;
}

// Runs the enclosing test body once per lane width, then restores the process's own.
class IsaScope {
 public:
  explicit IsaScope(MatmulIsa isa) : saved_(matmul_isa()), ok_(set_matmul_isa(isa)) {}
  ~IsaScope() { set_matmul_isa(saved_); }
  /// False when this CPU lacks the width (nothing was changed).
  bool ok() const { return ok_; }

 private:
  MatmulIsa saved_;
  bool ok_;
};

// Sets the OpenMP thread count for a scope, restoring it after (also when an ASSERT returns).
class ThreadsScope {
 public:
  explicit ThreadsScope(int threads) : saved_(omp_get_max_threads()) { omp_set_num_threads(threads); }
  ~ThreadsScope() { omp_set_num_threads(saved_); }
  void set(int threads) { omp_set_num_threads(threads); }

 private:
  int saved_;
};

// One test's backend (one thread: ctest runs test processes in parallel on few cores) plus
// helpers that move host vectors through backend buffers, as the transformer does.
class BackendOps : public ::testing::Test {
 protected:
  void SetUp() override { be_ = make_cpu_backend(1); }

  // A weight [rows, cols] from fp32 host data (a GGUF F32 tensor; a vector when rows == 0).
  std::unique_ptr<Weight> weight(const std::vector<float>& data, int64_t rows, int64_t cols) {
    auto w = be_->load_weight(f32_tensor(data, rows, cols));
    EXPECT_TRUE(w.ok()) << w.status().to_string();
    return std::move(*w);
  }
  template <typename T>
  std::unique_ptr<Buffer> buf(const std::vector<T>& host) {
    auto b = be_->alloc(static_cast<int64_t>(host.size() * sizeof(T)));
    be_->upload(*b, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
    return b;
  }
  std::unique_ptr<Buffer> buf_f32(size_t n) { return be_->alloc(static_cast<int64_t>(n * sizeof(float))); }
  std::vector<float> get(Buffer& b, size_t n) {
    std::vector<float> v(n);
    be_->synchronize();
    be_->download(v.data(), b, static_cast<int64_t>(n * sizeof(float)));
    return v;
  }
  std::vector<float> matmul(const Weight& w, const std::vector<float>& x, int64_t n, const Weight* bias = nullptr) {
    auto xb = buf(x);
    auto yb = buf_f32(static_cast<size_t>(n * w.rows()));
    be_->matmul(w, xb->f32(), n, yb->f32(), bias);
    return get(*yb, static_cast<size_t>(n * w.rows()));
  }

  std::unique_ptr<Backend> be_;
};

}  // namespace specserve::testing
