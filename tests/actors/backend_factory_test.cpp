// actors/backend_factory.h: the backend a device string names, and the errors that name the
// flag and value when it cannot be made (malformed, no CUDA in this build, no device, bad ordinal).
#include "actors/backend_factory.h"

#include <gtest/gtest.h>

#include <string>

#include "cpu/matmul.h"
#include "cpu/matmul_amx.h"

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
  // The device is named once ("device 'gpu0': device 'gpu0': ..." before).
  EXPECT_EQ(bad.status().message(), "device 'gpu0': expected cpu or cuda:N (N >= 0)");
  const Status dtype = check_compute_dtype(ComputeDtype::kFloat32, "gpu", "--dtype");
  EXPECT_EQ(dtype.message(), "device 'gpu': expected cpu or cuda:N (N >= 0)");
  auto gpu = device_memory("cuda:0");
  if (gpu.ok()) {  // a GPU is present: its numbers are sane
    EXPECT_GT(gpu->total_bytes, 0);
    EXPECT_GT(gpu->free_bytes, 0);
    EXPECT_LE(gpu->free_bytes, gpu->total_bytes);
  } else {
    EXPECT_EQ(gpu.status().code(), StatusCode::kUnavailable) << gpu.status().to_string();
  }
}

// --dtype on the CPU (core/dtype.h): float32 runs the fp32 kernel, bfloat16 the AMX kernel or
// a clear error where AMX cannot run, float16 an error; the log's source names the flag.
TEST(BackendFactory, DtypeChoosesTheCpuKernelOrSaysWhyNot) {
  const MatmulIsa saved = matmul_isa();
  // float32 is the fp32 kernel the process would run: AVX2 where the CPU lacks avx512f or the run
  // sets SPECSERVE_CPU_MATMUL=avx2.
  const MatmulIsa fp32 = __builtin_cpu_supports("avx512f") && cpu_kernel_env("SPECSERVE_CPU_MATMUL") != "avx2"
                             ? MatmulIsa::kAvx512
                             : MatmulIsa::kAvx2;

  ASSERT_TRUE(apply_compute_dtype(ComputeDtype::kFloat32, "cpu", "--dtype").ok());
  EXPECT_EQ(matmul_isa(), fp32);
  EXPECT_EQ(matmul_isa_source(), "set by --dtype float32");

  const Status check = check_compute_dtype(ComputeDtype::kBFloat16, "cpu", "models.target.dtype");
  const Status bf16 = apply_compute_dtype(ComputeDtype::kBFloat16, "cpu", "models.target.dtype");
  EXPECT_EQ(check.ok(), bf16.ok());
  if (amx_usable()) {
    ASSERT_TRUE(bf16.ok()) << bf16.to_string();
    EXPECT_EQ(matmul_isa(), MatmulIsa::kAmx);
    EXPECT_EQ(matmul_isa_source(), "set by models.target.dtype bfloat16");
  } else {
    EXPECT_EQ(bf16.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(bf16.message().find("models.target.dtype = 'bfloat16'"), std::string::npos) << bf16.message();
    EXPECT_NE(bf16.message().find(amx_refusal()), std::string::npos) << bf16.message();
    EXPECT_EQ(matmul_isa(), fp32);  // unchanged
  }

  // auto keeps whatever the process runs; float16 has no CPU kernel and changes nothing.
  const MatmulIsa before = matmul_isa();
  EXPECT_TRUE(apply_compute_dtype(ComputeDtype::kAuto, "cpu", "--dtype").ok());
  EXPECT_EQ(matmul_isa(), before);
  for (const Status& st : {apply_compute_dtype(ComputeDtype::kFloat16, "cpu", "--dtype"),
                           check_compute_dtype(ComputeDtype::kFloat16, "cpu", "--dtype")}) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("--dtype = 'float16': the CPU backend has no float16 kernel"), std::string::npos)
        << st.message();
  }
  EXPECT_EQ(matmul_isa(), before);

  // Back to fp32 (from amx where it ran); a float16 for CUDA is only recorded, the CPU untouched.
  ASSERT_TRUE(apply_compute_dtype(ComputeDtype::kFloat32, "cpu", "--dtype").ok());
  EXPECT_EQ(matmul_isa(), fp32);
  EXPECT_TRUE(check_compute_dtype(ComputeDtype::kFloat16, "cuda:0", "--dtype").ok());
  EXPECT_TRUE(apply_compute_dtype(ComputeDtype::kFloat16, "cuda:0", "--dtype").ok());
  EXPECT_EQ(matmul_isa(), fp32);
  EXPECT_TRUE(apply_compute_dtype(ComputeDtype::kAuto, "cuda:0", "--dtype").ok());

  const Status bad = apply_compute_dtype(ComputeDtype::kFloat32, "gpu0", "--dtype");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'gpu0'"), std::string::npos) << bad.message();
  set_matmul_isa(saved);
}

}  // namespace
}  // namespace specserve
