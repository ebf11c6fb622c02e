#include "actors/backend_factory.h"

#include <cstdlib>

#include "config/topology.h"
#include "cpu/cpu_backend.h"
#ifdef SPECSERVE_WITH_CUDA
#include "gpu/cuda_backend.h"
#endif

namespace specserve {

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
  if (const char* w = std::getenv("SPECSERVE_CUDA_WEIGHTS"); w && *w) {
    auto v = parse_cuda_weights(w);
    if (!v.ok()) return invalid_argument("SPECSERVE_CUDA_WEIGHTS: " + v.status().message());
    opts.weights = *v;
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

Status plan_kv_cache(const Backend& backend, const ModelConfig& c, EngineOptions* o) {
  if (o->num_kv_blocks != 0) return Status();
  const std::string name = backend.name();
  if (name.rfind("cuda:", 0) != 0) return Status();
#ifdef SPECSERVE_WITH_CUDA
  auto info = cuda_device_info(std::stoi(name.substr(5)));
  if (!info.ok()) return info.status();
  const int64_t max_len = o->max_model_len > 0 ? o->max_model_len : c.context_length;
  const int64_t wanted = (max_len * 4 + o->block_size - 1) / o->block_size;  // the engine's default
  const int64_t block_bytes = 2 * 4 * c.num_layers * c.kv_dim() * static_cast<int64_t>(o->block_size);
  // Activations of one forward pass (model/transformer.cpp's scratch buffers, 1.25x as it
  // allocates them) and the logits of every row, plus fixed slack for cuBLAS and the CUDA context.
  const int64_t rows = o->max_num_batched_tokens;
  const int64_t activations =
      rows * 4 * (3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_size + c.vocab_size) * 5 / 4;
  const int64_t budget = info->free_bytes - activations - (int64_t{1} << 30);
  const int64_t fit = budget > 0 ? budget / block_bytes : 0;
  if (fit < 1) {
    return resource_exhausted(name + ": " + std::to_string(info->free_bytes >> 20) + " MiB free after the weights: no room for a KV block of " +
                              std::to_string(block_bytes >> 10) + " KiB beside " + std::to_string(activations >> 20) +
                              " MiB of activations");
  }
  o->num_kv_blocks = std::min(wanted, fit);
  return Status();
#else
  (void)c;
  return Status();
#endif
}

}  // namespace specserve
