// GGUF reader and writer: round trips through GgufWriter -> GgufFile, and the writer's errors.
// Hostile files (a Status naming the offset and the field, never a crash or a huge allocation)
// are in gguf_bad_files_test.cpp.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "model/dequant.h"
#include "model/gguf_writer.h"
#include "tests/model/gguf_test_util.h"

namespace specserve {
namespace {

using namespace gguf_testing;

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

}  // namespace
}  // namespace specserve
