#include "cpu/kv_array.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/status.h"

namespace specserve {

KvArray::KvArray(int64_t floats) : size_(floats) {
  SPECSERVE_CHECK(floats >= 0, "KvArray: " + std::to_string(floats) + " floats");
  const size_t align = static_cast<size_t>(kAlignment);
  const size_t bytes = static_cast<size_t>(floats) * sizeof(float);
  // aligned_alloc wants a multiple of the alignment; one page-sized unit at least, so that an
  // empty array still has a valid pointer.
  const size_t padded = std::max<size_t>(1, (bytes + align - 1) / align) * align;
  data_.reset(static_cast<float*>(std::aligned_alloc(align, padded)));
  SPECSERVE_CHECK(data_ != nullptr, "KV cache: cannot allocate " + std::to_string(padded) + " bytes");
  // Advice only, before the first touch (the memset): where it fails the pages stay 4 KiB.
  madvise(data_.get(), padded, MADV_HUGEPAGE);
  std::memset(data_.get(), 0, bytes);
}

void KvArray::Free::operator()(float* p) const { std::free(p); }

}  // namespace specserve
