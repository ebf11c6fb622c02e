// `specserve bench-model`: prefill and decode speed of the model runtime on this machine, and
// the memory-bandwidth bound of decode (bytes read per decode step / measured bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "model/sampling.h"
#include "tools/cli/common.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct Args {
  std::string model, output;
  int threads = 0;
  int tensor_parallel_size = 1;
  int repeats = 3;
  std::vector<int> prompt_lengths = {256, 512};
  int decode_tokens = 128;
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Read bandwidth in GB/s: sums a 1 GiB buffer (well past the caches) with the OpenMP team.
double measure_read_bandwidth() {
  const size_t n = (size_t(1) << 30) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const double t0 = now_s();
    double total = 0;
#pragma omp parallel for reduction(+ : total)
    for (size_t i = 0; i < n; i += 8) total += buf[i] + buf[i + 1] + buf[i + 2] + buf[i + 3] + buf[i + 4] + buf[i + 5] + buf[i + 6] + buf[i + 7];
    const double dt = now_s() - t0;
    if (total != static_cast<double>(n)) std::fprintf(stderr, "bandwidth check sum off\n");
    best = std::max(best, n * sizeof(float) / dt / 1e9);
  }
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Args& a) {
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  auto loaded = load_cpu_model(path, a.threads, a.tensor_parallel_size);
  if (!loaded.ok()) {
    std::fprintf(stderr, "specserve bench-model: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  Transformer& m = *(*loaded)->lm.model;
  const ModelConfig& c = m.config();
  const int bs = 16;
  ForwardOutput fo;
  int max_len = 64;  // the decode phase starts after a 64-token prompt
  for (int l : a.prompt_lengths) {
    if (l < 1 || l >= c.context_length) {
      std::fprintf(stderr, "specserve bench-model: --prompt-lengths: %d is not in 1..%lld\n", l,
                   static_cast<long long>(c.context_length - 1));
      return 1;
    }
    max_len = std::max(max_len, l);
  }
  max_len += a.decode_tokens + 1;
  if (max_len > c.context_length) {
    std::fprintf(stderr, "specserve bench-model: prompt length + --decode-tokens %d exceed the context length %lld\n",
                 a.decode_tokens, static_cast<long long>(c.context_length));
    return 1;
  }
  auto kv = m.create_kv((max_len + bs - 1) / bs + 1, bs);
  if (!kv.ok()) {
    std::fprintf(stderr, "specserve bench-model: %s\n", kv.status().to_string().c_str());
    return 1;
  }
  auto fwd = [&](const ForwardBatch& b) {
    Status st = m.forward(b, **kv, &fo);
    if (!st.ok()) std::fprintf(stderr, "specserve bench-model: forward: %s\n", st.to_string().c_str());
    return st.ok();
  };
  std::vector<int32_t> table;
  for (int i = 0; i < (max_len + bs - 1) / bs + 1; ++i) table.push_back(i);
  nlohmann::json out;
  out["model"] = path;
  out["threads"] = a.threads;
  out["tensor_parallel_size"] = a.tensor_parallel_size;
  for (int len : a.prompt_lengths) {
    std::vector<double> times;
    for (int r = 0; r < a.repeats; ++r) {
      ForwardBatch b;
      SequenceInput s;
      for (int i = 0; i < len; ++i) s.tokens.push_back(100 + (i * 37) % 20000);
      s.block_table = table;
      b.seqs.push_back(s);
      const double t0 = now_s();
      if (!fwd(b)) return 1;
      times.push_back(now_s() - t0);
    }
    const double tps = len / median(times);
    std::fprintf(stderr, "[bench-model] prefill %d tokens: %.1f tokens/s\n", len, tps);
    out["prefill"][std::to_string(len)] = tps;
  }
  // Decode at batch 1 after a 64-token prompt.
  std::vector<double> rates;
  for (int r = 0; r < a.repeats; ++r) {
    ForwardBatch b;
    SequenceInput s;
    for (int i = 0; i < 64; ++i) s.tokens.push_back(100 + i);
    s.block_table = table;
    b.seqs.push_back(s);
    if (!fwd(b)) return 1;
    const double t0 = now_s();
    for (int i = 0; i < a.decode_tokens; ++i) {
      ForwardBatch d;
      SequenceInput x;
      x.tokens = {static_cast<int32_t>(Sampler::argmax(fo.row(0, 0), static_cast<int32_t>(c.vocab_size)))};
      x.num_cached = 64 + i;
      x.block_table = table;
      d.seqs.push_back(x);
      if (!fwd(d)) return 1;
    }
    rates.push_back(a.decode_tokens / (now_s() - t0));
  }
  const double decode_tps = median(rates);
  // Bytes one decode step reads: every matmul weight in fp32 (the CPU reference keeps fp32),
  // the norms, and the KV of ~128 cached tokens (small next to the weights).
  const double d = static_cast<double>(c.hidden_size), ff = static_cast<double>(c.ffn_size);
  const double per_layer = d * c.q_dim() * 2 + d * c.kv_dim() * 2 + 3 * d * ff;
  const double weight_bytes = 4.0 * (c.num_layers * per_layer + d * c.vocab_size);
  const double kv_bytes = 4.0 * 2 * c.num_layers * c.kv_dim() * (64 + a.decode_tokens / 2.0);
  const double bw = measure_read_bandwidth();
  const double bound = bw * 1e9 / (weight_bytes + kv_bytes);
  std::fprintf(stderr, "[bench-model] decode batch 1: %.2f tokens/s; %.1f MB read per step; bandwidth %.1f GB/s -> bound %.1f tokens/s (%.0f%%)\n",
               decode_tps, (weight_bytes + kv_bytes) / 1e6, bw, bound, 100 * decode_tps / bound);
  out["decode_batch1_tokens_per_s"] = decode_tps;
  out["bytes_per_decode_step"] = weight_bytes + kv_bytes;
  out["read_bandwidth_gb_s"] = bw;
  out["bandwidth_bound_tokens_per_s"] = bound;
  std::printf("%s\n", out.dump(1).c_str());
  if (!a.output.empty()) std::ofstream(a.output) << out.dump(1) << "\n";
  return 0;
}

}  // namespace

void add_bench_model(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("bench-model", "Prefill and decode tokens/s of the model runtime, and the bandwidth bound (a benchmark)");
  sub->add_option("--model", a->model, "GGUF model (default: the fetched SmolLM2-135M-Instruct)");
  sub->add_option("--threads", a->threads, "CPU threads (default: all), split between tensor-parallel ranks");
  sub->add_option("--tensor-parallel-size", a->tensor_parallel_size,
                  "Ranks (threads with their own CPU backend, Gloo all-reduce over loopback); <= the model's kv heads")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--repeats", a->repeats, "Runs per figure; the median is reported")->check(CLI::Range(1, 100));
  sub->add_option("--prompt-lengths", a->prompt_lengths, "Prefill lengths to time");
  sub->add_option("--decode-tokens", a->decode_tokens, "Decode steps to time")->check(CLI::Range(1, 4096));
  sub->add_option("--output", a->output, "Write the results as JSON here");
  register_command("bench-model", [a] { return run(*a); });
}

}  // namespace specserve::cli
