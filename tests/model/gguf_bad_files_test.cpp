// GGUF reader: hostile files must give a Status naming the offset and the field, never a crash
// or a huge allocation. Round trips and the writer's errors are in gguf_test.cpp.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "model/gguf_writer.h"
#include "tests/model/gguf_test_util.h"

// ---- allocation tracking -------------------------------------------------------------------
// The reader promises never to allocate more than a small multiple of the file size. The test
// binary replaces the global operator new to record the largest single request while a
// tracking scope is active (single-threaded: gtest runs tests one at a time).
namespace {
bool g_tracking = false;
size_t g_largest_alloc = 0;
}  // namespace

void* operator new(size_t n) {
  if (g_tracking && n > g_largest_alloc) g_largest_alloc = n;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace specserve {
namespace {

using namespace gguf_testing;

constexpr uint64_t kHuge = uint64_t(1) << 60;

// Runs `fn` and returns the largest single allocation it made.
template <typename Fn>
size_t largest_allocation(Fn&& fn) {
  g_largest_alloc = 0;
  g_tracking = true;
  fn();
  g_tracking = false;
  return g_largest_alloc;
}

// Asserts that `r` failed with a message that names `offset` and contains `field`.
void expect_error(const Expected<GgufFile>& r, uint64_t offset, const std::string& field,
                  StatusCode code = StatusCode::kCorruptData) {
  ASSERT_FALSE(r.ok()) << "expected an error at offset " << offset << " (" << field << ")";
  const std::string msg = r.status().message();
  EXPECT_EQ(r.status().code(), code) << msg;
  EXPECT_NE(msg.find("offset " + std::to_string(offset)), std::string::npos) << msg;
  EXPECT_NE(msg.find(field), std::string::npos) << msg;
}

// ---- hostile files ------------------------------------------------------------------------

TEST(GgufBadFiles, EveryTruncationIsAnError) {
  auto bytes = full_writer().to_bytes();
  ASSERT_TRUE(bytes.ok());
  std::vector<uint8_t> storage;
  for (size_t len = 0; len < bytes->size(); ++len) {
    std::vector<uint8_t> prefix(bytes->begin(), bytes->begin() + static_cast<long>(len));
    size_t largest = largest_allocation([&] {
      auto f = parse(prefix, &storage);
      ASSERT_FALSE(f.ok()) << "prefix of " << len << " bytes parsed";
      EXPECT_NE(f.status().message().find("offset "), std::string::npos) << f.status().message();
      EXPECT_NE(f.status().message().find("mem.gguf"), std::string::npos) << f.status().message();
    });
    EXPECT_LE(largest, 64u * bytes->size()) << "prefix " << len;
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "stopping at prefix length " << len;
      break;
    }
  }
}

TEST(GgufBadFiles, NoFileAndEmptyFile) {
  auto r = GgufFile::open(temp_path("does_not_exist"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string path = temp_path("empty");
  std::FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  std::fclose(fp);
  expect_error(GgufFile::open(path), 0, "magic");
  std::remove(path.c_str());
}

TEST(GgufBadFiles, WrongMagic) {
  Bytes b;
  b.header(0, 0);
  b.b[0] = 'F';
  std::vector<uint8_t> s;
  expect_error(parse(b.b, &s), 0, "magic");
}

TEST(GgufBadFiles, UnsupportedVersions) {
  for (uint32_t version : {0u, 1u, 4u, 99u, 0x03000000u}) {
    Bytes b;
    b.header(0, 0, version);
    std::vector<uint8_t> s;
    auto r = parse(b.b, &s);
    expect_error(r, 4, "version", StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find(std::to_string(version)), std::string::npos) << r.status().message();
  }
  Bytes v2;
  v2.header(0, 0, 2);
  std::vector<uint8_t> s;
  EXPECT_TRUE(parse(v2.b, &s).ok());
}

TEST(GgufBadFiles, AbsurdCounts) {
  std::vector<uint8_t> s;
  {
    Bytes b;
    b.header(kHuge, 0).pad_to(256);
    expect_error(parse(b.b, &s), 8, "tensor_count");
  }
  {
    Bytes b;
    b.header(0, kHuge).pad_to(256);
    expect_error(parse(b.b, &s), 16, "metadata_kv_count");
  }
  {
    Bytes b;
    b.header(0, 1).put<uint64_t>(kHuge).pad_to(256);  // key length
    expect_error(parse(b.b, &s), 24, "metadata key #0");
  }
  {
    Bytes b;  // string value length
    b.header(0, 1).str("k").put<uint32_t>(uint32_t(GgufValueType::STRING)).put<uint64_t>(kHuge).pad_to(256);
    expect_error(parse(b.b, &s), 37, "k");
  }
  for (GgufValueType elem : {GgufValueType::UINT8, GgufValueType::UINT64, GgufValueType::STRING,
                             GgufValueType::BOOL, GgufValueType::ARRAY}) {
    Bytes b;  // array length
    b.header(0, 1).str("arr").put<uint32_t>(uint32_t(GgufValueType::ARRAY));
    b.put<uint32_t>(uint32_t(elem)).put<uint64_t>(kHuge).pad_to(256);
    size_t largest = largest_allocation([&] { expect_error(parse(b.b, &s), 39, "arr"); });
    EXPECT_LE(largest, 4096u);
  }
  {
    Bytes b;  // string inside an array
    b.header(0, 1).str("arr").put<uint32_t>(uint32_t(GgufValueType::ARRAY));
    b.put<uint32_t>(uint32_t(GgufValueType::STRING)).put<uint64_t>(2).str("ok").put<uint64_t>(kHuge).pad_to(256);
    expect_error(parse(b.b, &s), 61, "arr[1]");
  }
  {
    Bytes b;  // tensor name length
    b.header(1, 0).put<uint64_t>(kHuge).pad_to(256);
    expect_error(parse(b.b, &s), 24, "tensor #0 name");
  }
  for (uint32_t n_dims : {0u, 5u, 0xffffffffu}) {
    Bytes b;
    b.header(1, 0).str("t").put<uint32_t>(n_dims).pad_to(256);
    expect_error(parse(b.b, &s), 33, "n_dims");
  }
  for (uint64_t dim : {uint64_t(0), kHuge, ~uint64_t(0)}) {
    Bytes b;
    b.header(1, 0).str("t").put<uint32_t>(2).put<uint64_t>(4).put<uint64_t>(dim).pad_to(256);
    expect_error(parse(b.b, &s), 45, "dim 1");
  }
}

// Shapes whose element count fits in int64 but whose byte count does not fit in uint64 must be
// refused, not wrapped around to a small number.
TEST(GgufBadFiles, ByteCountOverflow) {
  Bytes b;
  b.header(1, 0).str("t").put<uint32_t>(2).put<uint64_t>(uint64_t(1) << 40).put<uint64_t>(uint64_t(1) << 22);
  b.put<uint32_t>(uint32_t(GgmlType::F32)).put<uint64_t>(0).pad_to(256);
  std::vector<uint8_t> s;
  auto r = parse(b.b, &s);
  ASSERT_FALSE(r.ok()) << "2^62 F32 elements accepted with num_bytes " << r->tensors()[0].num_bytes;
  EXPECT_NE(r.status().message().find("offset "), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("'t'"), std::string::npos) << r.status().message();
}

TEST(GgufBadFiles, BadValues) {
  std::vector<uint8_t> s;
  {
    Bytes b;  // unknown value type
    b.header(0, 1).str("k").put<uint32_t>(13).put<uint32_t>(0);
    expect_error(parse(b.b, &s), 33, "unknown value type 13");
  }
  {
    Bytes b;  // unknown array element type
    b.header(0, 1).str("k").put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint32_t>(77).put<uint64_t>(0);
    expect_error(parse(b.b, &s), 37, "77");
  }
  {
    Bytes b;  // bool that is neither 0 nor 1
    b.header(0, 1).str("k").put<uint32_t>(uint32_t(GgufValueType::BOOL)).put<uint8_t>(2);
    expect_error(parse(b.b, &s), 37, "bool");
  }
  {
    Bytes b;  // arrays nested 6 deep
    b.header(0, 1).str("k").put<uint32_t>(uint32_t(GgufValueType::ARRAY));
    for (int i = 0; i < 6; ++i) b.put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint64_t>(1);
    b.put<uint32_t>(uint32_t(GgufValueType::UINT8)).put<uint64_t>(0);
    auto r = parse(b.b, &s);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("nested"), std::string::npos) << r.status().message();
  }
  for (uint32_t al : {0u, 3u, 48u}) {
    GgufWriter w;
    w.add_u32("general.alignment", 64);
    auto bytes = *w.to_bytes();
    // Patch the u32 value (the last 4 bytes before the padding: key starts at 24).
    const size_t value_at = 24 + 8 + std::string("general.alignment").size() + 4;
    std::memcpy(bytes.data() + value_at, &al, 4);
    auto r = parse(bytes, &s);
    ASSERT_FALSE(r.ok()) << al;
    EXPECT_NE(r.status().message().find("general.alignment"), std::string::npos) << r.status().message();
  }
}

TEST(GgufBadFiles, BadTensorInfos) {
  std::vector<uint8_t> s;
  // One tensor "t", 1 dim; field offsets: n_dims 33, dim 37, type 45, offset 49, end 57.
  auto one_tensor = [](uint64_t dim, uint32_t type, uint64_t offset) {
    Bytes b;
    b.header(1, 0).str("t").put<uint32_t>(1).put<uint64_t>(dim).put<uint32_t>(type).put<uint64_t>(offset);
    return b;
  };
  {
    Bytes b = one_tensor(32, 99, 0);
    b.pad_to(64 + 128);
    auto r = parse(b.b, &s);
    expect_error(r, 45, "type", StatusCode::kUnsupported);
    EXPECT_NE(r.status().message().find("type#99"), std::string::npos) << r.status().message();
  }
  {
    Bytes b = one_tensor(33, uint32_t(GgmlType::Q4_0), 0);  // not a multiple of the block size
    b.pad_to(64 + 128);
    expect_error(parse(b.b, &s), 45, "block size");
  }
  {
    Bytes b = one_tensor(8, uint32_t(GgmlType::F32), 16);  // misaligned offset
    b.pad_to(64 + 128);
    expect_error(parse(b.b, &s), 49, "aligned");
  }
  {
    Bytes b = one_tensor(8, uint32_t(GgmlType::F32), 0);  // 32 data bytes, only 31 present
    b.pad_to(64 + 31);
    expect_error(parse(b.b, &s), 64, "'t' data");
  }
  {
    Bytes b = one_tensor(8, uint32_t(GgmlType::F32), uint64_t(1) << 63);  // offset past the end
    b.pad_to(64 + 32);
    auto r = parse(b.b, &s);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("'t' data"), std::string::npos) << r.status().message();
  }
  {
    Bytes b = one_tensor(8, uint32_t(GgmlType::F32), ~uint64_t(31));  // begin would wrap around
    b.pad_to(64 + 32);
    EXPECT_FALSE(parse(b.b, &s).ok());
  }
  {
    Bytes b = one_tensor(8, uint32_t(GgmlType::F32), 0);  // data section missing entirely
    expect_error(parse(b.b, &s), 57, "tensor data");
  }
  {
    Bytes b;  // duplicate tensor names
    b.header(2, 0);
    for (int i = 0; i < 2; ++i) b.str("t").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(32 * i);
    b.pad_to(128 + 64);
    auto r = parse(b.b, &s);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("duplicate"), std::string::npos) << r.status().message();
  }
}

}  // namespace
}  // namespace specserve
