#include "tools/cli/common.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "actors/backend_factory.h"
#include "core/logging.h"
#include "cpu/cpu_backend.h"

namespace specserve::cli {

std::string default_model_path() {
  if (const char* env = std::getenv("SPECSERVE_MODEL"); env && *env) return env;
  const std::string name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  std::string candidates[2] = {std::string(SPECSERVE_SOURCE_DIR) + "/models/" + name, ""};
  if (const char* home = std::getenv("HOME")) candidates[1] = std::string(home) + "/.cache/specserve/models/" + name;
  for (const auto& c : candidates)
    if (!c.empty() && std::filesystem::exists(c)) return c;
  return candidates[0];
}

Expected<std::unique_ptr<CpuModel>> load_cpu_model(const std::string& path, int threads, int tensor_parallel_size) {
  auto m = std::make_unique<CpuModel>();
  if (tensor_parallel_size == 1) {
    m->own_backend = make_cpu_backend(threads);
    auto lm = load_model(path, *m->own_backend);
    if (!lm.ok()) return lm.status();
    m->lm = std::move(*lm);
    return m;
  }
  if (tensor_parallel_size < 1) {
    return invalid_argument("tensor_parallel_size = " + std::to_string(tensor_parallel_size) + ": must be >= 1");
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto f = GgufFile::open(path);
  if (!f.ok()) return f.status();
  m->lm.file = std::make_unique<GgufFile>(std::move(*f));
  auto tok = Tokenizer::from_gguf(*m->lm.file);
  if (!tok.ok()) return tok.status();
  m->lm.tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
  ThreadedTensorParallelOptions o;
  o.tp_size = tensor_parallel_size;
  o.num_threads = threads;
  auto g = ThreadedTensorParallel::create(*m->lm.file, o);
  if (!g.ok()) return g.status();
  m->group = std::move(*g);
  m->lm.model = m->group->take_model();
  m->lm.load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& c = m->lm.model->config();
  get_logger("model")->info("loaded {} ({} layers, {} heads / {} kv heads) as {} tensor-parallel ranks (Gloo, loopback) in {:.2f} s",
                            path, c.num_layers, c.num_heads, c.num_kv_heads, tensor_parallel_size, m->lm.load_seconds);
  return m;
}

Expected<std::unique_ptr<CpuModel>> load_model_on_device(const std::string& path, const std::string& device, int threads,
                                                         int tensor_parallel_size) {
  if (device == "cpu") return load_cpu_model(path, threads, tensor_parallel_size);
  if (tensor_parallel_size != 1) {
    return invalid_argument("--tensor-parallel-size = " + std::to_string(tensor_parallel_size) + " with --device = '" +
                            device + "': this command runs tensor parallelism on the CPU (Gloo) only; for NCCL ranks on GPUs use "
                            "`specserve serve --device cuda:N --tensor-parallel-size N` or a topology");
  }
  auto b = make_backend_for_device("--device", device, threads);
  if (!b.ok()) return b.status();
  auto m = std::make_unique<CpuModel>();
  m->own_backend = std::move(*b);
  auto lm = load_model(path, *m->own_backend);
  if (!lm.ok()) return lm.status();
  m->lm = std::move(*lm);
  return m;
}

}  // namespace specserve::cli
