// core/dtype.h: vLLM's --dtype names and aliases parse; anything else is refused naming the field
// and the value.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace specserve {
namespace {

TEST(ComputeDtype, ParsesVllmNamesAndAliases) {
  const std::pair<const char*, ComputeDtype> cases[] = {
      {"auto", ComputeDtype::kAuto},         {"float32", ComputeDtype::kFloat32}, {"float", ComputeDtype::kFloat32},
      {"bfloat16", ComputeDtype::kBFloat16}, {"float16", ComputeDtype::kFloat16}, {"half", ComputeDtype::kFloat16}};
  for (const auto& [text, want] : cases) {
    auto d = parse_compute_dtype(text, "--dtype");
    ASSERT_TRUE(d.ok()) << text << ": " << d.status().to_string();
    EXPECT_EQ(*d, want) << text;
  }
  EXPECT_STREQ(compute_dtype_name(ComputeDtype::kAuto), "auto");
  EXPECT_STREQ(compute_dtype_name(ComputeDtype::kFloat32), "float32");
  EXPECT_STREQ(compute_dtype_name(ComputeDtype::kBFloat16), "bfloat16");
  EXPECT_STREQ(compute_dtype_name(ComputeDtype::kFloat16), "float16");
}

TEST(ComputeDtype, RefusesOtherNamesNamingFieldAndValue) {
  for (const char* bad : {"bf16", "fp32", "Float32", " float32", "", "float64", "int8"}) {
    auto d = parse_compute_dtype(bad, "models.target.dtype");
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(d.status().message(), "models.target.dtype = '" + std::string(bad) +
                                        "': not one of auto, float32, float, bfloat16, float16, half");
  }
}

}  // namespace
}  // namespace specserve
