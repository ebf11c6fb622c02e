// Dequantisation against the gguf-py reference recorded in tests/data/dequant/ by
// tools/record_dequant_reference.py (see its header for the exact command).
#include "model/dequant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

struct Case {
  const char* name;
  GgmlType type;
};

const Case kCases[] = {
    {"F32", GgmlType::F32},   {"F16", GgmlType::F16},   {"BF16", GgmlType::BF16},
    {"Q4_0", GgmlType::Q4_0}, {"Q4_1", GgmlType::Q4_1}, {"Q5_0", GgmlType::Q5_0},
    {"Q5_1", GgmlType::Q5_1}, {"Q8_0", GgmlType::Q8_0}, {"Q2_K", GgmlType::Q2_K},
    {"Q3_K", GgmlType::Q3_K}, {"Q4_K", GgmlType::Q4_K}, {"Q5_K", GgmlType::Q5_K},
    {"Q6_K", GgmlType::Q6_K},
};

class DequantReference : public ::testing::TestWithParam<Case> {};

TEST_P(DequantReference, BitExact) {
  const Case c = GetParam();
  const std::string raw = testing::read_file(testing::data_path(std::string("dequant/") + c.name + ".bin"));
  const std::string ref = testing::read_file(testing::data_path(std::string("dequant/") + c.name + ".f32"));
  ASSERT_EQ(ref.size() % 4, 0u);
  const int64_t n = static_cast<int64_t>(ref.size() / 4);
  ASSERT_EQ(ggml_row_bytes(c.type, n), static_cast<int64_t>(raw.size())) << c.name;

  // Copy the input to an odd address: tensor data in a GGUF file has no block alignment.
  std::vector<uint8_t> src(raw.size() + 1);
  std::memcpy(src.data() + 1, raw.data(), raw.size());
  std::vector<float> out(static_cast<size_t>(n), -12345.0f);
  ASSERT_TRUE(dequantize(c.type, src.data() + 1, n, out.data()).ok());

  int mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t got, want;
    std::memcpy(&got, &out[i], 4);
    std::memcpy(&want, ref.data() + 4 * i, 4);
    float want_f;
    std::memcpy(&want_f, &want, 4);
    if (got == want || (std::isnan(out[i]) && std::isnan(want_f))) continue;
    if (++mismatches <= 5) {
      ADD_FAILURE() << c.name << " element " << i << " (block " << i / ggml_type_traits(static_cast<uint32_t>(c.type))->block_size
                    << "): got " << out[i] << " (0x" << std::hex << got << "), want " << want_f << " (0x" << want
                    << std::dec << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << c.name;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantReference, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// check_block_scales: an infinite or NaN fp16 scale of any block format is named (tensor, block,
// scale, value); the recorded blocks pass. Each scale it names is one the dequantiser reads: with
// it set to +inf, dequantising gives non-finite values in that block and only there.
TEST(Dequant, NonFiniteBlockScalesAreNamedAndAreTheDequantisersScales) {
  struct Scale {
    const char* type;
    GgmlType t;
    int64_t block_bytes, block_values;
    int offset;
    const char* name;
  };
  const Scale kScales[] = {
      {"Q4_0", GgmlType::Q4_0, 18, 32, 0, "d"},     {"Q4_1", GgmlType::Q4_1, 20, 32, 0, "d"},
      {"Q4_1", GgmlType::Q4_1, 20, 32, 2, "m"},     {"Q5_0", GgmlType::Q5_0, 22, 32, 0, "d"},
      {"Q5_1", GgmlType::Q5_1, 24, 32, 0, "d"},     {"Q5_1", GgmlType::Q5_1, 24, 32, 2, "m"},
      {"Q8_0", GgmlType::Q8_0, 34, 32, 0, "d"},     {"Q2_K", GgmlType::Q2_K, 84, 256, 80, "d"},
      {"Q2_K", GgmlType::Q2_K, 84, 256, 82, "dmin"}, {"Q3_K", GgmlType::Q3_K, 110, 256, 108, "d"},
      {"Q4_K", GgmlType::Q4_K, 144, 256, 0, "d"},   {"Q4_K", GgmlType::Q4_K, 144, 256, 2, "dmin"},
      {"Q5_K", GgmlType::Q5_K, 176, 256, 0, "d"},   {"Q5_K", GgmlType::Q5_K, 176, 256, 2, "dmin"},
      {"Q6_K", GgmlType::Q6_K, 210, 256, 208, "d"},
  };
  for (const Scale& sc : kScales) {
    SCOPED_TRACE(std::string(sc.type) + " " + sc.name);
    std::string raw = testing::read_file(testing::data_path(std::string("dequant/") + sc.type + ".bin"));
    const int64_t blocks = static_cast<int64_t>(raw.size()) / sc.block_bytes;
    ASSERT_GE(blocks, 3);
    GgufTensorInfo t;
    t.name = "blk.7.ffn_up.weight";
    t.raw_type = static_cast<uint32_t>(sc.t);
    t.num_elements = blocks * sc.block_values;
    t.shape = {t.num_elements};
    t.num_bytes = raw.size();
    t.data = reinterpret_cast<const uint8_t*>(raw.data());
    EXPECT_TRUE(check_block_scales(t).ok()) << check_block_scales(t).to_string();
    for (const uint16_t bad : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}}) {  // +inf, -inf, NaN
      std::string corrupt = raw;
      std::memcpy(corrupt.data() + sc.block_bytes + sc.offset, &bad, 2);  // block 1
      t.data = reinterpret_cast<const uint8_t*>(corrupt.data());
      const Status st = check_block_scales(t);
      EXPECT_EQ(st.code(), StatusCode::kCorruptData) << std::hex << bad;
      EXPECT_NE(st.message().find("tensor 'blk.7.ffn_up.weight' (" + std::string(sc.type) + "): block 1 of " + std::to_string(blocks)),
                std::string::npos)
          << st.message();
      EXPECT_NE(st.message().find(std::string("has scale ") + sc.name + " = "), std::string::npos) << st.message();
      if (bad != 0x7c00) continue;
      std::vector<float> out(static_cast<size_t>(t.num_elements));
      ASSERT_TRUE(dequantize(sc.t, t.data, t.num_elements, out.data()).ok());
      int64_t non_finite_in_1 = 0, non_finite_elsewhere = 0;
      for (int64_t i = 0; i < t.num_elements; ++i) {
        if (std::isfinite(out[static_cast<size_t>(i)])) continue;
        (i / sc.block_values == 1 ? non_finite_in_1 : non_finite_elsewhere)++;
      }
      EXPECT_GT(non_finite_in_1, 0) << "offset " << sc.offset << " is not a scale the dequantiser reads";
      EXPECT_EQ(non_finite_elsewhere, 0);
    }
  }
  // Plain float tensors pass whatever they hold; a wrong byte count is corrupt.
  std::vector<float> f(64, std::numeric_limits<float>::quiet_NaN());
  GgufTensorInfo t;
  t.name = "output_norm.weight";
  t.raw_type = static_cast<uint32_t>(GgmlType::F32);
  t.num_elements = 64;
  t.shape = {64};
  t.num_bytes = 256;
  t.data = reinterpret_cast<const uint8_t*>(f.data());
  EXPECT_TRUE(check_block_scales(t).ok());
  std::vector<uint8_t> q(100);
  t.raw_type = static_cast<uint32_t>(GgmlType::Q8_0);
  t.num_bytes = q.size();  // 64 Q8_0 values need 68 bytes
  t.data = q.data();
  EXPECT_EQ(check_block_scales(t).code(), StatusCode::kCorruptData);
}

TEST(Dequant, TensorMatchesRawCall) {
  const std::string raw = testing::read_file(testing::data_path("dequant/Q4_1.bin"));
  GgufTensorInfo t;
  t.name = "blk.0.w";
  t.shape = {64, 4};
  t.raw_type = static_cast<uint32_t>(GgmlType::Q4_1);
  t.num_elements = 256;
  t.num_bytes = raw.size();
  t.data = reinterpret_cast<const uint8_t*>(raw.data());
  auto out = dequantize_tensor(t);
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  std::vector<float> direct(256);
  ASSERT_TRUE(dequantize(GgmlType::Q4_1, t.data, 256, direct.data()).ok());
  EXPECT_EQ(0, std::memcmp(out->data(), direct.data(), 256 * sizeof(float)));
}

TEST(Dequant, ZeroElementsIsOk) {
  EXPECT_TRUE(dequantize(GgmlType::Q4_K, nullptr, 0, nullptr).ok());
}

TEST(Dequant, CountNotMultipleOfBlockNamesTypeAndCount) {
  std::vector<uint8_t> src(64);
  std::vector<float> dst(64);
  Status st = dequantize(GgmlType::Q4_0, src.data(), 33, dst.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("Q4_0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("33"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("32"), std::string::npos) << st.message();

  st = dequantize(GgmlType::Q6_K, src.data(), -256, dst.data());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("-256"), std::string::npos) << st.message();
}

TEST(Dequant, UnknownOrUnhandledTypeNamesIt) {
  std::vector<uint8_t> src(1024);
  std::vector<float> dst(256);
  Status st = dequantize(static_cast<GgmlType>(77), src.data(), 32, dst.data());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("77"), std::string::npos) << st.message();

  st = dequantize(GgmlType::Q8_K, src.data(), 256, dst.data());
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("Q8_K"), std::string::npos) << st.message();
  EXPECT_FALSE(dequant_supported(GgmlType::Q8_1));
  EXPECT_TRUE(dequant_supported(GgmlType::Q6_K));
}

TEST(Dequant, NullPointerIsAnError) {
  std::vector<float> dst(32);
  EXPECT_EQ(dequantize(GgmlType::Q8_0, nullptr, 32, dst.data()).code(), StatusCode::kInvalidArgument);
}

TEST(Dequant, TensorWithWrongByteCountIsCorrupt) {
  std::vector<uint8_t> bytes(100);
  GgufTensorInfo t;
  t.name = "bad.weight";
  t.raw_type = static_cast<uint32_t>(GgmlType::Q8_0);
  t.num_elements = 64;
  t.num_bytes = bytes.size();  // 64 Q8_0 elements need 68 bytes
  t.data = bytes.data();
  auto out = dequantize_tensor(t);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(out.status().message().find("bad.weight"), std::string::npos);

  t.raw_type = 1234;
  out = dequantize_tensor(t);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(out.status().message().find("type#1234"), std::string::npos) << out.status().message();

  t.raw_type = static_cast<uint32_t>(GgmlType::Q8_0);
  t.num_elements = 65;
  out = dequantize_tensor(t);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specserve
