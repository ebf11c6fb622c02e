// Writes the seed corpus for tools/fuzz/gguf_fuzz.cpp: small valid GGUF files that between
// them use every metadata type, nested arrays, several tensor types and a custom alignment.
// Usage: gguf_fuzz_seeds OUT_DIR   (called by scripts/fuzz-gguf.sh)
#include <cstdio>
#include <string>
#include <vector>

#include "model/gguf_writer.h"

using namespace specserve;

namespace {

bool write(const GgufWriter& w, const std::string& path) {
  Status st = w.write_file(path);
  if (!st.ok()) std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", st.to_string().c_str());
  return st.ok();
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 29);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  bool ok = true;

  ok &= write(GgufWriter(), dir + "/empty.gguf");

  GgufWriter meta;
  meta.add_string("general.architecture", "llama");
  meta.add_u8("u8", 1);
  meta.add_i8("i8", -1);
  meta.add_u16("u16", 2);
  meta.add_i16("i16", -2);
  meta.add_u32("llama.block_count", 2);
  meta.add_i32("i32", -3);
  meta.add_u64("u64", 4);
  meta.add_i64("i64", -4);
  meta.add_f32("llama.rope.freq_base", 10000.0f);
  meta.add_f64("f64", 0.5);
  meta.add_bool("bool", true);
  meta.add_u8_array("a.u8", {1, 2});
  meta.add_i8_array("a.i8", {-1});
  meta.add_u16_array("a.u16", {3});
  meta.add_i16_array("a.i16", {-3});
  meta.add_u32_array("a.u32", {5});
  meta.add_i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  meta.add_u64_array("a.u64", {6});
  meta.add_i64_array("a.i64", {-6});
  meta.add_f32_array("tokenizer.ggml.scores", {0.0f, -1.0f, -2.0f});
  meta.add_f64_array("a.f64", {1.5});
  meta.add_bool_array("a.bool", {true, false});
  meta.add_string_array("tokenizer.ggml.tokens", {"<s>", "a", "b"});
  // [[7], []] of u32
  meta.add_raw("a.nested", GgufValueType::ARRAY,
               {9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,                       // ARRAY of 2 arrays
                4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0,            // [7]
                4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});                      // []
  ok &= write(meta, dir + "/metadata.gguf");

  GgufWriter tensors;
  tensors.add_string("general.architecture", "llama");
  struct Spec { const char* name; GgmlType type; std::vector<int64_t> shape; };
  const std::vector<Spec> specs = {
      {"f32", GgmlType::F32, {4, 2}},     {"f16", GgmlType::F16, {8}},        {"bf16", GgmlType::BF16, {2, 2, 2}},
      {"q4_0", GgmlType::Q4_0, {32}},     {"q4_1", GgmlType::Q4_1, {32, 2}},  {"q5_0", GgmlType::Q5_0, {32}},
      {"q5_1", GgmlType::Q5_1, {32}},     {"q8_0", GgmlType::Q8_0, {32}},     {"q2_k", GgmlType::Q2_K, {256}},
      {"q3_k", GgmlType::Q3_K, {256}},    {"q4_k", GgmlType::Q4_K, {256}},    {"q5_k", GgmlType::Q5_K, {256}},
      {"q6_k", GgmlType::Q6_K, {256}},    {"q8_k", GgmlType::Q8_K, {256}},    {"4d", GgmlType::F32, {1, 2, 1, 2}},
  };
  uint8_t seed = 1;
  for (const Spec& s : specs) {
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    const auto bytes = pattern(static_cast<size_t>(ggml_row_bytes(s.type, n)), seed++);
    Status st = tensors.add_tensor(s.name, s.shape, s.type, bytes.data(), bytes.size());
    if (!st.ok()) {
      std::fprintf(stderr, "gguf_fuzz_seeds: %s\n", st.to_string().c_str());
      ok = false;
    }
  }
  ok &= write(tensors, dir + "/tensors.gguf");

  GgufWriter aligned;
  aligned.add_u32("general.alignment", 64);
  (void)aligned.add_tensor_f32("a", {3}, {1, 2, 3});
  (void)aligned.add_tensor_f32("b", {2}, {4, 5});
  ok &= write(aligned, dir + "/aligned.gguf");

  return ok ? 0 : 1;
}
