// KvArray (cpu/kv_array.h): the KV cache's memory is zeroed, writable over its whole length and
// aligned to 2 MiB (4 KiB below 2 MiB), so a 64-float key row at any slot starts on a cache line;
// a size it cannot have is std::bad_alloc, which the backend reports as a value.
#include "cpu/kv_array.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>

namespace specserve {
namespace {

TEST(KvArray, IsZeroedAlignedAndWritable) {
  for (int64_t floats : {int64_t{1}, int64_t{1000}, int64_t{3} * 1024 * 1024 + 7}) {
    KvArray a(floats);
    ASSERT_NE(a.data(), nullptr);
    EXPECT_EQ(a.size(), floats);
    const int64_t want_align = floats * 4 >= KvArray::kHugeBytes ? KvArray::kHugeBytes : 4096;
    EXPECT_EQ(a.alignment(), want_align) << floats;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % static_cast<uintptr_t>(want_align), 0u) << floats;
    bool zero = true;
    for (int64_t i = 0; i < floats; ++i) zero = zero && a.data()[i] == 0.0f;
    EXPECT_TRUE(zero) << floats;
    a.data()[0] = 1.0f;
    a.data()[floats - 1] = 2.0f;
    EXPECT_EQ(a.data()[floats - 1], 2.0f);
    if (floats > 1) EXPECT_EQ(a.data()[0], 1.0f);
  }
}

TEST(KvArray, AnEmptyArrayHasAPointer) {
  KvArray a(0);
  EXPECT_NE(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0);
}

TEST(KvArray, ASizeItCannotHaveIsBadAlloc) {
  EXPECT_THROW(KvArray(int64_t{1} << 62), std::bad_alloc);  // past the address space
}

TEST(KvArrayDeathTest, RefusesANegativeSize) {
  EXPECT_DEATH(KvArray(-1), "KvArray: -1 floats");
}

}  // namespace
}  // namespace specserve
