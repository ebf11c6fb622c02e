// actors/backend_factory.h: the backend a device string names, and the errors that name the
// flag and value when it cannot be made (malformed, no CUDA in this build, no device, bad ordinal).
#include "actors/backend_factory.h"

#include <gtest/gtest.h>

#include <string>

namespace specserve {
namespace {

TEST(BackendFactory, CpuIsTheCpuBackend) {
  auto b = make_backend_for_device("--device", "cpu", 1);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_TRUE(check_device_available("--device", "cpu").ok());
}

TEST(BackendFactory, MalformedDeviceNamesFlagAndValue) {
  for (const char* bad : {"gpu", "cuda", "cuda:", "cuda:-1", "cuda:x", ""}) {
    auto b = make_backend_for_device("--device", bad, 1);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(b.status().message().find("--device = '" + std::string(bad) + "'"), std::string::npos) << b.status().message();
  }
}

// cuda:N either works (a GPU is present and N exists) or fails with an error that names the
// flag, the value and the reason; never a crash inside CUDA.
TEST(BackendFactory, CudaWithoutADeviceOrOutOfRangeIsAClearError) {
  for (const char* dev : {"cuda:0", "cuda:63"}) {
    auto b = make_backend_for_device("nodes[0].workers[0].device", dev, 1);
    if (b.ok()) {
      EXPECT_EQ((*b)->name(), dev);
      continue;
    }
    const std::string m = b.status().message();
    EXPECT_NE(m.find("nodes[0].workers[0].device = '" + std::string(dev) + "'"), std::string::npos) << m;
    // The check without making a backend agrees with the factory.
    const Status check = check_device_available("nodes[0].workers[0].device", dev);
    EXPECT_EQ(check.code(), b.status().code()) << check.to_string();
    EXPECT_EQ(check.message(), m);
    const bool no_cuda_build = m.find("built without the CUDA backend") != std::string::npos;
    const bool no_device = m.find("no CUDA device") != std::string::npos;
    const bool bad_ordinal = m.find("does not exist") != std::string::npos;
    EXPECT_TRUE(no_cuda_build || no_device || bad_ordinal) << m;
    EXPECT_EQ(b.status().code(), bad_ordinal ? StatusCode::kInvalidArgument : StatusCode::kUnavailable) << m;
  }
}

TEST(BackendFactory, KvPlanChangesNothingOnTheCpu) {
  auto b = make_backend_for_device("--device", "cpu", 1);
  ASSERT_TRUE(b.ok());
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.ffn_size = 128;
  c.vocab_size = 100;
  c.context_length = 256;
  EngineOptions o;
  ASSERT_TRUE(plan_kv_cache(**b, c, &o).ok());
  EXPECT_EQ(o.num_kv_blocks, 0) << "the CPU keeps the engine's default";
  o.num_kv_blocks = 7;
  ASSERT_TRUE(plan_kv_cache(**b, c, &o).ok());
  EXPECT_EQ(o.num_kv_blocks, 7) << "an explicit size is kept";
}

}  // namespace
}  // namespace specserve
