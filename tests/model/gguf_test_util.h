// Helpers of the GGUF reader and writer tests (gguf_test.cpp: round trips and writer errors;
// gguf_bad_files_test.cpp: hostile files): a hand-built GGUF image, a writer holding one value of
// every metadata kind and tensors of several types, parsing from an exact-size heap copy, and
// temporary file paths.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace specserve::gguf_testing {

// Parses `bytes` from a heap copy of exactly that size (so an over-read is an over-read).
inline Expected<GgufFile> parse(const std::vector<uint8_t>& bytes, std::vector<uint8_t>* storage) {
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

inline std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

// A writer holding one value of every metadata kind and tensors of several types.
inline GgufWriter full_writer() {
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

inline std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "specserve_gguf_test_" + std::to_string(::getpid()) + "_" + stem + ".gguf";
}

}  // namespace specserve::gguf_testing
