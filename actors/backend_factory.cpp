#include "actors/backend_factory.h"

#include <atomic>
#include <cstdlib>

#include "config/topology.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#include "cpu/matmul_amx.h"
#ifdef SPECSERVE_WITH_CUDA
#include "gpu/cuda_backend.h"
#endif

namespace specserve {
namespace {

// The dtype apply_compute_dtype set for CUDA backends (kAuto: $SPECSERVE_CUDA_WEIGHTS or bf16).
std::atomic<ComputeDtype>& cuda_dtype() {
  static std::atomic<ComputeDtype> d{ComputeDtype::kAuto};
  return d;
}

Status check_cpu_dtype(ComputeDtype dtype, const std::string& field) {
  const std::string value = field + " = '" + compute_dtype_name(dtype) + "'";
  if (dtype == ComputeDtype::kBFloat16 && !amx_usable()) {
    return invalid_argument(value + ": the CPU backend's bf16 matmul needs Intel AMX (amx-tile, amx-bf16 and avx512bf16, "
                            "Sapphire Rapids or later, Linux >= 5.16), and " + amx_refusal() + "; use float32");
  }
  if (dtype == ComputeDtype::kFloat16) {
    return invalid_argument(value + ": the CPU backend has no float16 kernel; use float32, or bfloat16 on a CPU with Intel AMX");
  }
  return Status();
}

Status apply_cpu_dtype(ComputeDtype dtype, const std::string& field) {
  if (Status st = check_cpu_dtype(dtype, field); !st.ok()) return st;
  const std::string source = "set by " + field + " " + compute_dtype_name(dtype);
  switch (dtype) {
    case ComputeDtype::kAuto:
    case ComputeDtype::kFloat16:
      return Status();
    case ComputeDtype::kFloat32: {
      // The fp32 kernel the process would run without SPECSERVE_CPU_MATMUL=amx or vnni: avx2 when the
      // variable asks for it or the CPU lacks avx512f.
      const bool avx2 = cpu_kernel_env("SPECSERVE_CPU_MATMUL") == "avx2" || !set_matmul_isa(MatmulIsa::kAvx512, source);
      if (avx2) set_matmul_isa(MatmulIsa::kAvx2, source);
      return Status();
    }
    case ComputeDtype::kBFloat16:
      set_matmul_isa(MatmulIsa::kAmx, source);  // amx_usable(): checked above
      return Status();
  }
  return Status();
}

}  // namespace

std::string compute_description(const std::string& device) {
  auto spec = parse_device(device);
  if (!spec.ok()) return "?";
  if (spec->kind == DeviceKind::kCpu) {
    const MatmulIsa isa = matmul_isa();
    // vnni multiplies only Q4_1 / Q8_0 blocks; with every weight dequantised at load
    // (SPECSERVE_CPU_WEIGHTS=f32) the AVX-512 fp32 kernel does all the work.
    if (isa == MatmulIsa::kVnni) return std::string(cpu_weight_storage()) == "blocks" ? "vnni int8" : "avx512 fp32";
    return std::string(matmul_isa_name(isa)) + (isa == MatmulIsa::kAmx ? " bf16" : " fp32");
  }
#ifdef SPECSERVE_WITH_CUDA
  switch (cuda_dtype().load()) {
    case ComputeDtype::kBFloat16: return "cuda bf16 weights";
    case ComputeDtype::kFloat16: return "cuda fp16 weights";
    case ComputeDtype::kFloat32: return "cuda fp32 weights";
    case ComputeDtype::kAuto: break;
  }
  if (const char* w = std::getenv("SPECSERVE_CUDA_WEIGHTS"); w && *w) {
    if (auto v = parse_cuda_weights(w); v.ok()) return std::string("cuda ") + cuda_weights_name(*v) + " weights";
  }
  return "cuda bf16 weights";
#else
  return "cuda";
#endif
}

Status check_compute_dtype(ComputeDtype dtype, const std::string& device, const std::string& field) {
  auto spec = parse_device(device);
  if (!spec.ok()) return spec.status();  // parse_device names the device already
  return spec->kind == DeviceKind::kCpu ? check_cpu_dtype(dtype, field) : Status();
}

Status apply_compute_dtype(ComputeDtype dtype, const std::string& device, const std::string& field) {
  auto spec = parse_device(device);
  if (!spec.ok()) return spec.status();  // parse_device names the device already
  if (spec->kind == DeviceKind::kCpu) {
    return apply_cpu_dtype(dtype, field);  // the CPU backend logs the kernel and this source
  }
  cuda_dtype().store(dtype);
  return Status();
}

Expected<std::unique_ptr<Backend>> make_backend_for_device(const std::string& flag, const std::string& device,
                                                           int threads) {
  auto spec = parse_device(device);
  if (!spec.ok()) return invalid_argument(flag + " = '" + device + "': " + spec.status().message());
  if (spec->kind == DeviceKind::kCpu) return make_cpu_backend(threads);
#ifdef SPECSERVE_WITH_CUDA
  CudaBackendOptions opts;
  if (const char* mm = std::getenv("SPECSERVE_CUDA_MATMUL"); mm && *mm) {
    auto m = parse_cuda_matmul(mm);
    if (!m.ok()) return invalid_argument("SPECSERVE_CUDA_MATMUL: " + m.status().message());
    opts.matmul = *m;
  }
  switch (cuda_dtype().load()) {
    case ComputeDtype::kBFloat16: opts.weights = CudaWeights::kBF16; break;
    case ComputeDtype::kFloat16: opts.weights = CudaWeights::kF16; break;
    case ComputeDtype::kFloat32: opts.weights = CudaWeights::kF32; break;
    case ComputeDtype::kAuto:
      if (const char* w = std::getenv("SPECSERVE_CUDA_WEIGHTS"); w && *w) {
        auto v = parse_cuda_weights(w);
        if (!v.ok()) return invalid_argument("SPECSERVE_CUDA_WEIGHTS: " + v.status().message());
        opts.weights = *v;
      }
      break;
  }
  if (const char* g = std::getenv("SPECSERVE_CUDA_GRAPHS"); g && *g) {
    const std::string v = g;
    if (v != "0" && v != "1") {
      return invalid_argument("SPECSERVE_CUDA_GRAPHS = '" + v + "': expected 1 (CUDA graphs, the default) or 0 (eager, as --enforce-eager)");
    }
    opts.cuda_graphs = v == "1";
  }
  if (const char* g = std::getenv("SPECSERVE_CUDA_ATTENTION_SPLIT"); g && *g) {
    const std::string v = g;
    if (v != "0" && v != "1") {
      return invalid_argument("SPECSERVE_CUDA_ATTENTION_SPLIT = '" + v + "': expected 1 (split over the keys, the default) or 0");
    }
    opts.attention_split = v == "1";
  }
  auto b = make_cuda_backend(spec->index, opts);
  if (!b.ok()) return Status(b.status().code(), flag + " = '" + device + "': " + b.status().message());
  return std::move(*b);
#else
  return unavailable(flag + " = '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

Status check_device_available(const std::string& flag, const std::string& device) {
  auto spec = parse_device(device);
  if (!spec.ok()) return invalid_argument(flag + " = '" + device + "': " + spec.status().message());
  if (spec->kind == DeviceKind::kCpu) return Status();
#ifdef SPECSERVE_WITH_CUDA
  auto info = cuda_device_info(spec->index);
  if (!info.ok()) return Status(info.status().code(), flag + " = '" + device + "': " + info.status().message());
  return Status();
#else
  return unavailable(flag + " = '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

Expected<DeviceMemory> device_memory(const std::string& device) {
  auto spec = parse_device(device);
  if (!spec.ok()) return spec.status();  // parse_device names the device already
  if (spec->kind == DeviceKind::kCpu) return unsupported("device 'cpu': host memory is not planned");
#ifdef SPECSERVE_WITH_CUDA
  auto info = cuda_device_info(spec->index);
  if (!info.ok()) return Status(info.status().code(), "device '" + device + "': " + info.status().message());
  return DeviceMemory{info->total_bytes, info->free_bytes};
#else
  return unavailable("device '" + device + "': this specserve was built without the CUDA backend (nvcc not found at configure time)");
#endif
}

}  // namespace specserve
