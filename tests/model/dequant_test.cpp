// Dequantisation against the gguf-py reference recorded in tests/data/dequant/ by
// tools/record_dequant_reference.py (see its header for the exact command).
#include "model/dequant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
