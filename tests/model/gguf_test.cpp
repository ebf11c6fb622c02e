// GGUF reader and writer: round trips through GgufWriter -> GgufFile, and hostile files that
// must give a Status naming the offset and the field, never a crash or a huge allocation.
#include "model/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <vector>

#include "model/dequant.h"
#include "model/gguf_writer.h"

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

// Parses `bytes` from a heap copy of exactly that size (so an over-read is an over-read).
Expected<GgufFile> parse(const std::vector<uint8_t>& bytes, std::vector<uint8_t>* storage) {
  *storage = bytes;
  return GgufFile::from_memory(storage->data(), storage->size(), "mem.gguf");
}

// A hand-built GGUF image, for files the writer refuses to produce.
struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(version).put<uint64_t>(n_tensors).put<uint64_t>(n_kv);
    return *this;
  }
  Bytes& pad_to(size_t n) {
    if (b.size() < n) b.resize(n, 0);
    return *this;
  }
  size_t size() const { return b.size(); }
};

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

// A writer holding one value of every metadata kind and tensors of several types.
GgufWriter full_writer() {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u8("t.u8", 255);
  w.add_i8("t.i8", -128);
  w.add_u16("t.u16", 65535);
  w.add_i16("t.i16", -32768);
  w.add_u32("t.u32", 4294967295u);
  w.add_i32("t.i32", std::numeric_limits<int32_t>::min());
  w.add_u64("t.u64", std::numeric_limits<uint64_t>::max());
  w.add_u64("t.u64_small", 12345);
  w.add_i64("t.i64", std::numeric_limits<int64_t>::min());
  w.add_f32("t.f32", 1.0f / 3.0f);
  w.add_f64("t.f64", -2.5e300);
  w.add_bool("t.true", true);
  w.add_bool("t.false", false);
  w.add_string("t.string", std::string("h\xc3\xa9llo\0world", 12));
  w.add_string("t.empty_string", "");
  w.add_u8_array("a.u8", {0, 1, 255});
  w.add_i8_array("a.i8", {-128, 0, 127});
  w.add_u16_array("a.u16", {0, 65535});
  w.add_i16_array("a.i16", {-32768, 32767});
  w.add_u32_array("a.u32", {0, 4294967295u});
  w.add_i32_array("a.i32", {std::numeric_limits<int32_t>::min(), 7});
  w.add_u64_array("a.u64", {1, std::numeric_limits<uint64_t>::max()});
  w.add_i64_array("a.i64", {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
  w.add_f32_array("a.f32", {0.5f, -1.25f, 3.0e38f});
  w.add_f64_array("a.f64", {1e-300, -0.0});
  w.add_bool_array("a.bool", {true, false, true});
  w.add_string_array("a.string", {"a", "", "\xf0\x9f\x99\x82"});
  w.add_i32_array("a.empty", {});
  // [[1, 2], []] as nested u32 arrays: the reader validates and skips them.
  Bytes nested;
  nested.put<uint32_t>(uint32_t(GgufValueType::UINT32)).put<uint64_t>(2).put<uint32_t>(1).put<uint32_t>(2);
  nested.put<uint32_t>(uint32_t(GgufValueType::UINT32)).put<uint64_t>(0);
  Bytes outer;
  outer.put<uint32_t>(uint32_t(GgufValueType::ARRAY)).put<uint64_t>(2);
  outer.b.insert(outer.b.end(), nested.b.begin(), nested.b.end());
  w.add_raw("a.nested", GgufValueType::ARRAY, outer.b);

  const std::vector<float> f = iota_floats(24, -3.0f);
  EXPECT_TRUE(w.add_tensor_f32("token_embd.weight", {8, 3}, f).ok());
  std::vector<uint8_t> q6(2 * 210);
  for (size_t i = 0; i < q6.size(); ++i) q6[i] = static_cast<uint8_t>(i * 37 + 11);
  q6[208] = 0x00; q6[209] = 0x3c;  // d = 1.0 in each block, so values are finite
  q6[418] = 0x00; q6[419] = 0x3c;
  EXPECT_TRUE(w.add_tensor("blk.0.ffn_down.weight", {256, 2}, GgmlType::Q6_K, q6.data(), q6.size()).ok());
  std::vector<uint8_t> f16(2 * 2 * 3 * 4 * 2);
  for (size_t i = 0; i < f16.size(); i += 2) { f16[i] = 0; f16[i + 1] = static_cast<uint8_t>(0x3c + (i % 4)); }
  EXPECT_TRUE(w.add_tensor("t.4d", {2, 2, 3, 4}, GgmlType::F16, f16.data(), f16.size()).ok());
  std::vector<uint8_t> q8(34);
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i);
  EXPECT_TRUE(w.add_tensor("t.q8", {32}, GgmlType::Q8_0, q8.data(), q8.size()).ok());
  // Last tensor is 32 bytes, a multiple of the alignment: no proper prefix is a valid file.
  EXPECT_TRUE(w.add_tensor_f32("output_norm.weight", {8}, iota_floats(8, 1.0f)).ok());
  return w;
}

void check_full(const GgufFile& f) {
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(*f.get_string("general.architecture"), "llama");
  EXPECT_EQ(*f.get_int("t.u8"), 255);
  EXPECT_EQ(*f.get_int("t.i8"), -128);
  EXPECT_EQ(*f.get_int("t.u16"), 65535);
  EXPECT_EQ(*f.get_int("t.i16"), -32768);
  EXPECT_EQ(*f.get_int("t.u32"), 4294967295ll);
  EXPECT_EQ(*f.get_int("t.i32"), std::numeric_limits<int32_t>::min());
  ASSERT_NE(f.find("t.u64"), nullptr);
  EXPECT_EQ(f.find("t.u64")->type, GgufValueType::UINT64);
  EXPECT_EQ(std::get<uint64_t>(f.find("t.u64")->v), std::numeric_limits<uint64_t>::max());
  EXPECT_FALSE(f.get_int("t.u64").ok());  // does not fit in int64
  EXPECT_EQ(*f.get_int("t.u64_small"), 12345);
  EXPECT_EQ(*f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(*f.get_float("t.f32"), static_cast<double>(1.0f / 3.0f));
  EXPECT_EQ(f.find("t.f32")->type, GgufValueType::FLOAT32);
  EXPECT_EQ(*f.get_float("t.f64"), -2.5e300);
  EXPECT_EQ(*f.get_bool("t.true"), true);
  EXPECT_EQ(*f.get_bool("t.false"), false);
  EXPECT_EQ(*f.get_string("t.string"), std::string("h\xc3\xa9llo\0world", 12));
  EXPECT_EQ(*f.get_string("t.empty_string"), "");

  auto ints = [&](const char* key, GgufValueType elem) {
    const GgufValue* v = f.find(key);
    EXPECT_NE(v, nullptr) << key;
    if (!v) return std::vector<int64_t>{};
    EXPECT_EQ(v->type, GgufValueType::ARRAY) << key;
    EXPECT_EQ(v->array_type, elem) << key;
    auto a = f.get_int_array(key);
    EXPECT_TRUE(a.ok()) << key;
    if (a.ok()) EXPECT_EQ(v->array_size, a->size()) << key;
    return a.ok() ? *a : std::vector<int64_t>{};
  };
  EXPECT_EQ(ints("a.u8", GgufValueType::UINT8), (std::vector<int64_t>{0, 1, 255}));
  EXPECT_EQ(ints("a.i8", GgufValueType::INT8), (std::vector<int64_t>{-128, 0, 127}));
  EXPECT_EQ(ints("a.u16", GgufValueType::UINT16), (std::vector<int64_t>{0, 65535}));
  EXPECT_EQ(ints("a.i16", GgufValueType::INT16), (std::vector<int64_t>{-32768, 32767}));
  EXPECT_EQ(ints("a.u32", GgufValueType::UINT32), (std::vector<int64_t>{0, 4294967295ll}));
  EXPECT_EQ(ints("a.i32", GgufValueType::INT32), (std::vector<int64_t>{std::numeric_limits<int32_t>::min(), 7}));
  // UINT64 elements are stored bit-cast in the int64 vector.
  EXPECT_EQ(ints("a.u64", GgufValueType::UINT64), (std::vector<int64_t>{1, -1}));
  EXPECT_EQ(ints("a.i64", GgufValueType::INT64),
            (std::vector<int64_t>{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}));
  EXPECT_EQ(ints("a.empty", GgufValueType::INT32), std::vector<int64_t>{});
  EXPECT_EQ(*f.get_float_array("a.f32"), (std::vector<double>{0.5, -1.25, static_cast<double>(3.0e38f)}));
  EXPECT_EQ(f.find("a.f32")->array_type, GgufValueType::FLOAT32);
  auto f64 = *f.get_float_array("a.f64");
  ASSERT_EQ(f64.size(), 2u);
  EXPECT_EQ(f64[0], 1e-300);
  EXPECT_TRUE(f64[1] == 0.0 && std::signbit(f64[1]));
  ASSERT_NE(f.find("a.bool"), nullptr);
  EXPECT_EQ(f.find("a.bool")->array_type, GgufValueType::BOOL);
  EXPECT_EQ(std::get<std::vector<bool>>(f.find("a.bool")->v), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(*f.get_string_array("a.string"), (std::vector<std::string>{"a", "", "\xf0\x9f\x99\x82"}));
  ASSERT_NE(f.find("a.nested"), nullptr);
  EXPECT_EQ(f.find("a.nested")->array_type, GgufValueType::ARRAY);
  EXPECT_EQ(f.find("a.nested")->array_size, 2u);
  EXPECT_EQ(f.metadata().size(), 30u);

  // Wrong-type access is an error naming the key, not a crash.
  auto wrong = f.get_string("t.u8");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("t.u8"), std::string::npos);
  EXPECT_EQ(f.get_int("missing.key").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*f.get_int_or("missing.key", 7), 7);

  ASSERT_EQ(f.tensors().size(), 5u);
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->shape, (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(emb->type(), GgmlType::F32);
  EXPECT_EQ(emb->num_elements, 24);
  EXPECT_EQ(emb->num_bytes, 96u);
  EXPECT_EQ(emb->offset, 0u);
  const std::vector<float> want = iota_floats(24, -3.0f);
  EXPECT_EQ(0, std::memcmp(emb->data, want.data(), 96));

  const GgufTensorInfo* q6 = f.find_tensor("blk.0.ffn_down.weight");
  ASSERT_NE(q6, nullptr);
  EXPECT_EQ(q6->type(), GgmlType::Q6_K);
  EXPECT_EQ(q6->num_bytes, 420u);
  EXPECT_EQ(q6->offset, 96u);
  EXPECT_EQ(q6->data[0], 11);
  auto deq = dequantize_tensor(*q6);
  ASSERT_TRUE(deq.ok()) << deq.status().to_string();
  EXPECT_EQ(deq->size(), 512u);

  const GgufTensorInfo* t4 = f.find_tensor("t.4d");
  ASSERT_NE(t4, nullptr);
  EXPECT_EQ(t4->shape, (std::vector<int64_t>{2, 2, 3, 4}));
  EXPECT_EQ(t4->num_bytes, 96u);
  EXPECT_EQ(t4->offset, 96u + 448u);
  const GgufTensorInfo* q8 = f.find_tensor("t.q8");
  ASSERT_NE(q8, nullptr);
  EXPECT_EQ(q8->num_bytes, 34u);
  EXPECT_EQ(q8->data[33], 33);
  for (const GgufTensorInfo& t : f.tensors()) {
    EXPECT_EQ(t.offset % 32, 0u) << t.name;
  }
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "specserve_gguf_test_" + std::to_string(::getpid()) + "_" + stem + ".gguf";
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

// ---- round trips --------------------------------------------------------------------------

TEST(GgufRoundTrip, FromMemory) {
  GgufWriter w = full_writer();
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status().to_string();
  std::vector<uint8_t> storage;
  auto f = parse(*bytes, &storage);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  check_full(*f);
  EXPECT_EQ(f->file_size(), bytes->size());
}

TEST(GgufRoundTrip, OpenFile) {
  GgufWriter w = full_writer();
  const std::string path = temp_path("roundtrip");
  ASSERT_TRUE(w.write_file(path).ok());
  {
    auto f = GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    check_full(*f);
    EXPECT_EQ(f->path(), path);
    // Moving keeps the mapping and the tensor pointers valid.
    GgufFile moved = std::move(*f);
    check_full(moved);
  }
  // The file and the in-memory image are the same bytes.
  auto bytes = w.to_bytes();
  std::FILE* fp = std::fopen(path.c_str(), "rb");
  ASSERT_NE(fp, nullptr);
  std::vector<uint8_t> disk(bytes->size() + 1);
  EXPECT_EQ(std::fread(disk.data(), 1, disk.size(), fp), bytes->size());
  std::fclose(fp);
  disk.resize(bytes->size());
  EXPECT_EQ(disk, *bytes);
  std::remove(path.c_str());
}

TEST(GgufRoundTrip, CustomAlignment) {
  GgufWriter w;
  w.add_u32("general.alignment", 256);
  ASSERT_TRUE(w.add_tensor_f32("a", {3}, {1, 2, 3}).ok());
  ASSERT_TRUE(w.add_tensor_f32("b", {5}, {4, 5, 6, 7, 8}).ok());
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->size() % 256, 0u);
  std::vector<uint8_t> storage;
  auto f = parse(*bytes, &storage);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->alignment(), 256u);
  EXPECT_EQ(f->find_tensor("b")->offset, 256u);
  EXPECT_EQ(reinterpret_cast<const float*>(f->find_tensor("b")->data)[4], 8.0f);
  EXPECT_EQ((f->find_tensor("a")->data - storage.data()) % 256, 0);
}

TEST(GgufRoundTrip, EmptyFileHasNoTensors) {
  GgufWriter w;
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes.ok());
  std::vector<uint8_t> storage;
  auto f = parse(*bytes, &storage);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_TRUE(f->tensors().empty());
}

TEST(GgufRoundTrip, ReplacingAKeyKeepsOneValue) {
  GgufWriter w;
  w.add_u32("k", 1);
  w.add_string("k", "two");
  EXPECT_EQ(w.num_metadata(), 1u);
  std::vector<uint8_t> storage;
  auto f = parse(*w.to_bytes(), &storage);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->get_string("k"), "two");
  EXPECT_TRUE(w.remove("k"));
  EXPECT_FALSE(w.remove("k"));
}

// ---- writer errors ------------------------------------------------------------------------

TEST(GgufWriterErrors, RejectsBadTensors) {
  GgufWriter w;
  std::vector<uint8_t> d(1024);
  EXPECT_EQ(w.add_tensor("", {4}, GgmlType::F32, d.data(), 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {}, GgmlType::F32, d.data(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {1, 1, 1, 1, 1}, GgmlType::F32, d.data(), 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {0}, GgmlType::F32, d.data(), 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {-4}, GgmlType::F32, d.data(), 16).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {int64_t(1) << 40, int64_t(1) << 40}, GgmlType::F32, d.data(), 16).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {16}, GgmlType::Q4_0, d.data(), 9).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {4}, GgmlType::F32, d.data(), 15).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add_tensor("x", {4}, static_cast<GgmlType>(99), d.data(), 16).code(), StatusCode::kUnsupported);
  EXPECT_EQ(w.num_tensors(), 0u);
  ASSERT_TRUE(w.add_tensor("x", {4}, GgmlType::F32, d.data(), 16).ok());
  Status dup = w.add_tensor("x", {4}, GgmlType::F32, d.data(), 16);
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(dup.message().find("'x'"), std::string::npos);
}

TEST(GgufWriterErrors, RejectsBadAlignment) {
  GgufWriter w;
  w.add_u32("general.alignment", 48);
  EXPECT_FALSE(w.to_bytes().ok());
  w.add_u64("general.alignment", 64);  // must be u32
  EXPECT_FALSE(w.to_bytes().ok());
  EXPECT_FALSE(w.write_file(temp_path("never")).ok());
  w.add_u32("general.alignment", 64);
  EXPECT_TRUE(w.to_bytes().ok());
}

TEST(GgufWriterErrors, UnwritablePath) {
  GgufWriter w;
  Status st = w.write_file("/nonexistent-dir/x.gguf");
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/nonexistent-dir/x.gguf"), std::string::npos) << st.message();
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
