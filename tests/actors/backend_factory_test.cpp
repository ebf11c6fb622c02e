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

// The CPU's memory is not planned (gpu_memory_plan.h's DeviceMemoryBudget stays inactive there).
TEST(BackendFactory, DeviceMemoryIsForCudaOnly) {
  auto cpu = device_memory("cpu");
  ASSERT_FALSE(cpu.ok());
  EXPECT_EQ(cpu.status().code(), StatusCode::kUnsupported);
  auto bad = device_memory("gpu0");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto gpu = device_memory("cuda:0");
  if (gpu.ok()) {  // a GPU is present: its numbers are sane
    EXPECT_GT(gpu->total_bytes, 0);
    EXPECT_GT(gpu->free_bytes, 0);
    EXPECT_LE(gpu->free_bytes, gpu->total_bytes);
  } else {
    EXPECT_EQ(gpu.status().code(), StatusCode::kUnavailable) << gpu.status().to_string();
  }
}

}  // namespace
}  // namespace specserve
