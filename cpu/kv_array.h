// specserve cpu: the memory behind the CPU backend's KV cache.
#pragma once

#include <cstdint>
#include <memory>

namespace specserve {

/// A zeroed fp32 array of `floats` elements (>= 0) for the KV cache. An array of at least
/// kHugeBytes is aligned to 2 MiB and advised for transparent huge pages (madvise(MADV_HUGEPAGE);
/// where the kernel has THP off or declines, 4 KiB pages with the same alignment); a smaller one
/// (a draft head's cache, tests) is aligned to a 4 KiB page and not advised, so that it does not
/// cost a whole huge page.
/// NOTE: the alignment is for the attention kernel (cpu/attention.h): it reads one KV head's
/// 64-float key and value rows of every cached position, scattered over the pool's slots. A
/// std::vector's block starts 16 bytes into a page, so every such row straddled five cache lines
/// instead of four, and decode attention over a long prefix ran about 20% longer; huge pages spare
/// the TLB the scattered slots (bench/results/rev_1631a35_vs_e7d327f_2026-12-05-vnni.md, whose
/// B build also had the vnni kernel's broadcast change).
/// Throws std::bad_alloc when the memory cannot be had (CpuBackend::create_kv_storage reports it
/// as kResourceExhausted); a negative size is a bug (aborts).
class KvArray {
 public:
  /// Arrays of at least this many bytes get 2 MiB alignment and the huge-page advice.
  static constexpr int64_t kHugeBytes = int64_t{2} << 20;

  explicit KvArray(int64_t floats);
  float* data() const { return data_.get(); }
  int64_t size() const { return size_; }
  /// The alignment data() has: kHugeBytes or 4096.
  int64_t alignment() const { return alignment_; }

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::unique_ptr<float, Free> data_;
  int64_t size_ = 0;
  int64_t alignment_ = 0;
};

}  // namespace specserve
