#include "cpu/kv_array.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "core/status.h"

namespace specserve {

KvArray::KvArray(int64_t floats) : size_(floats) {
  SPECSERVE_CHECK(floats >= 0, "KvArray: " + std::to_string(floats) + " floats");
  constexpr size_t kPage = 4096, kHuge = static_cast<size_t>(kHugeBytes);
  if (static_cast<uint64_t>(floats) > (SIZE_MAX - kHuge) / sizeof(float)) throw std::bad_alloc();
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  const bool huge = bytes >= kHuge;
  const size_t align = huge ? kHuge : kPage;
  alignment_ = static_cast<int64_t>(align);
  // aligned_alloc wants a multiple of the alignment; one unit at least, so that an empty array
  // still has a valid pointer.
  const size_t padded = std::max<size_t>(1, (bytes + align - 1) / align) * align;
  data_.reset(static_cast<float*>(std::aligned_alloc(align, padded)));
  if (data_ == nullptr) throw std::bad_alloc();
  // Advice only, before the first touch (the memset): where it fails the pages stay 4 KiB.
  if (huge) madvise(data_.get(), padded, MADV_HUGEPAGE);
  std::memset(data_.get(), 0, bytes);
}

void KvArray::Free::operator()(float* p) const { std::free(p); }

}  // namespace specserve
