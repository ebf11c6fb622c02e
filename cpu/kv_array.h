// specserve cpu: the memory behind the CPU backend's KV cache.
#pragma once

#include <cstdint>
#include <memory>

namespace specserve {

/// A zeroed fp32 array of `floats` elements (>= 0) for the KV cache: aligned to 2 MiB and
/// advised for transparent huge pages (madvise(MADV_HUGEPAGE); where the kernel has THP off or
/// declines, 4 KiB pages, with the same alignment).
/// NOTE: the alignment is for the attention kernel (cpu/attention.h): it reads one KV head's
/// 64-float key and value rows of every cached position, scattered over the pool's slots. A
/// std::vector's block starts 16 bytes into a page, so every such row straddled five cache lines
/// instead of four; huge pages spare the TLB the scattered slots
/// (bench/results/cpu_kv_array_2026-12-05.md). Throws (SPECSERVE_CHECK) when the allocation fails.
class KvArray {
 public:
  /// Bytes the array is aligned to.
  static constexpr int64_t kAlignment = int64_t{2} << 20;

  explicit KvArray(int64_t floats);
  float* data() const { return data_.get(); }
  int64_t size() const { return size_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> data_;
  int64_t size_ = 0;
};

}  // namespace specserve
