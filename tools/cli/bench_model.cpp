// `specserve bench-model`: prefill and decode speed of the model runtime on this machine, and
// the memory-bandwidth bound of decode (bytes read per decode step / measured bandwidth).
// --device cuda:N runs it on a GPU, where the bandwidth is the device's peak (2 x memory clock
// x bus width); --synthetic llama-1b|llama-8b builds a model of that shape with random bf16
// weights in memory (no download); --decode-batches times decode at several batch sizes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/backend_factory.h"
#include "cpu/attention.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#ifdef SPECSERVE_WITH_CUDA
#include "gpu/cuda_backend.h"
#endif
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/sampling.h"
#include "spec/engine.h"
#include "tools/cli/common.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct Args {
  std::string model, output;
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string synthetic;  ///< "", "llama-1b" or "llama-8b"
  std::vector<int> decode_batches = {1};
  int threads = 0;
  int tensor_parallel_size = 1;
  int repeats = 3;
  std::vector<int> prompt_lengths = {256, 512};
  int decode_tokens = 128;
  int decode_context = 64;  ///< tokens cached before the timed decode steps
  /// Verification steps to time: one sequence, N chain rows after the --decode-context prompt,
  /// every row a logit row (what the engine's target pass does for N - 1 drafted tokens).
  std::vector<int> verify_rows;
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

// Llama shapes for --synthetic (Llama 3.2 1B and Llama 3.1 8B: layers, hidden, heads, kv
// heads, ffn, vocab, tied head), from their published configs.
struct SyntheticShape {
  const char* name;
  int64_t layers, hidden, heads, kv_heads, ffn, vocab;
  bool tied;
};
constexpr SyntheticShape kShapes[] = {
    {"llama-1b", 16, 2048, 32, 8, 8192, 128256, true},
    {"llama-8b", 32, 4096, 32, 8, 14336, 128256, false},
    {"llama-tiny", 2, 256, 4, 2, 512, 1024, false},  // checks the benchmark itself in seconds
};

// A llama GGUF file of `shape` at `path`: matrices bf16 with values cycled from one random pool
// (their values do not change the speed), norms 1.0 in fp32. No tokenizer: the benchmark feeds
// token ids. NOTE: written to a file (tmpfs when there is one) rather than GgufWriter::to_bytes,
// whose growing vector would copy an 8B model's 16 GB several times.
Status write_synthetic_gguf(const SyntheticShape& sh, const std::string& path) {
  GgufWriter w;
  const std::string a = "llama.";
  w.add_string("general.architecture", "llama");
  w.add_string("general.name", std::string("synthetic-") + sh.name);
  w.add_u32(a + "block_count", static_cast<uint32_t>(sh.layers));
  w.add_u32(a + "context_length", 8192);
  w.add_u32(a + "embedding_length", static_cast<uint32_t>(sh.hidden));
  w.add_u32(a + "feed_forward_length", static_cast<uint32_t>(sh.ffn));
  w.add_u32(a + "attention.head_count", static_cast<uint32_t>(sh.heads));
  w.add_u32(a + "attention.head_count_kv", static_cast<uint32_t>(sh.kv_heads));
  w.add_u32(a + "rope.dimension_count", static_cast<uint32_t>(sh.hidden / sh.heads));
  w.add_f32(a + "rope.freq_base", 500000.0f);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  w.add_u32(a + "vocab_size", static_cast<uint32_t>(sh.vocab));
  std::vector<uint16_t> pool(1 << 20);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& v : pool) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    // bf16 of a small value: sign random, exponent 2^-8 .. 2^-5, mantissa random.
    v = static_cast<uint16_t>(((x >> 63) << 15) | ((119 + (x >> 20) % 4) << 7) | ((x >> 8) & 0x7f));
  }
  std::vector<uint16_t> buf;
  auto matrix = [&](const std::string& name, int64_t cols, int64_t rows) -> Status {
    buf.resize(static_cast<size_t>(cols * rows));
    for (size_t i = 0; i < buf.size(); i += pool.size())
      std::memcpy(buf.data() + i, pool.data(), std::min(pool.size(), buf.size() - i) * 2);
    return w.add_tensor(name, {cols, rows}, GgmlType::BF16, buf.data(), buf.size() * 2);
  };
  auto norm = [&](const std::string& name, int64_t n) {
    return w.add_tensor_f32(name, {n}, std::vector<float>(static_cast<size_t>(n), 1.0f));
  };
  const int64_t d = sh.hidden, hd = sh.hidden / sh.heads, kvd = hd * sh.kv_heads;
  SPECSERVE_RETURN_IF_ERROR(matrix("token_embd.weight", d, sh.vocab));
  SPECSERVE_RETURN_IF_ERROR(norm("output_norm.weight", d));
  if (!sh.tied) SPECSERVE_RETURN_IF_ERROR(matrix("output.weight", d, sh.vocab));
  for (int64_t l = 0; l < sh.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SPECSERVE_RETURN_IF_ERROR(norm(p + "attn_norm.weight", d));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "attn_q.weight", d, d));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "attn_k.weight", d, kvd));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "attn_v.weight", d, kvd));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "attn_output.weight", d, d));
    SPECSERVE_RETURN_IF_ERROR(norm(p + "ffn_norm.weight", d));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "ffn_gate.weight", d, sh.ffn));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "ffn_up.weight", d, sh.ffn));
    SPECSERVE_RETURN_IF_ERROR(matrix(p + "ffn_down.weight", sh.ffn, d));
  }
  buf = {};
  return w.write_file(path);
}

int run(const Args& a) {
  if (!a.output.empty()) {
    if (Status st = check_output_file("--output", a.output); !st.ok()) {
      std::fprintf(stderr, "specserve bench-model: %s\n", st.message().c_str());
      return 2;
    }
  }
  std::string path = a.model.empty() ? default_model_path() : a.model;
  if (Status st = apply_dtype_option(a.dtype, a.device); !st.ok()) {
    std::fprintf(stderr, "specserve bench-model: %s\n", st.message().c_str());
    return exit_status_for(st);
  }
  // The model: a file on --device (with its tokenizer; tensor-parallel ranks on the CPU) or a
  // synthetic image. Declared so that models go before their backends.
  std::unique_ptr<Backend> synthetic_backend;
  std::unique_ptr<GgufFile> image_file;
  std::unique_ptr<Transformer> synthetic_model;
  std::unique_ptr<CpuModel> loaded_model;
  Backend* backend = nullptr;
  if (!a.synthetic.empty()) {
    if (a.tensor_parallel_size != 1) {
      std::fprintf(stderr, "specserve bench-model: --synthetic runs with --tensor-parallel-size 1, not %d\n",
                   a.tensor_parallel_size);
      return 2;
    }
    auto made = make_backend_for_device("--device", a.device, a.threads);
    if (!made.ok()) {
      std::fprintf(stderr, "specserve bench-model: %s\n", made.status().to_string().c_str());
      return 2;
    }
    synthetic_backend = std::move(*made);
    backend = synthetic_backend.get();
    const SyntheticShape* sh = nullptr;
    for (const auto& s : kShapes)
      if (a.synthetic == s.name) sh = &s;
    if (!sh) {
      std::fprintf(stderr, "specserve bench-model: --synthetic = '%s': expected llama-1b, llama-8b or llama-tiny\n", a.synthetic.c_str());
      return 2;
    }
    const double t0 = now_s();
    const std::string dir = std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
    const std::string file = dir + "/specserve-bench-" + sh->name + "-" + std::to_string(::getpid()) + ".gguf";
    Status st = write_synthetic_gguf(*sh, file);
    if (!st.ok()) {
      std::fprintf(stderr, "specserve bench-model: --synthetic: %s\n", st.to_string().c_str());
      return 1;
    }
    const double t1 = now_s();
    auto f = GgufFile::open(file);
    std::filesystem::remove(file);  // the mapping keeps the data until the file object goes
    if (!f.ok()) {
      std::fprintf(stderr, "specserve bench-model: --synthetic: %s\n", f.status().to_string().c_str());
      return 1;
    }
    image_file = std::make_unique<GgufFile>(std::move(*f));
    auto m = Transformer::load(*image_file, *backend);
    if (!m.ok()) {
      std::fprintf(stderr, "specserve bench-model: --synthetic: %s\n", m.status().to_string().c_str());
      return 1;
    }
    synthetic_model = std::move(*m);
    path = std::string("synthetic:") + sh->name;
    std::fprintf(stderr, "[bench-model] %s: bf16 weights written in %.1f s, loaded onto %s in %.1f s\n", sh->name,
                 t1 - t0, backend->name().c_str(), now_s() - t1);
  } else {
    auto loaded = load_model_on_device(path, a.device, a.threads, a.tensor_parallel_size);
    if (!loaded.ok()) {
      std::fprintf(stderr, "specserve bench-model: %s\n", loaded.status().to_string().c_str());
      return exit_status_for(loaded.status());  // a missing or corrupt --model: 2
    }
    loaded_model = std::move(*loaded);
    backend = &loaded_model->backend();
  }
  const bool on_gpu = backend->name().rfind("cuda", 0) == 0;
  Transformer& m = synthetic_model ? *synthetic_model : *loaded_model->lm.model;
  const ModelConfig& c = m.config();
  const int bs = 16;
  const int prompt = a.decode_context;  // the decode phase starts after a prompt of this many tokens
  ForwardOutput fo;
  if (prompt < 1 || prompt >= c.context_length) {
    std::fprintf(stderr, "specserve bench-model: --decode-context: %d is not in 1..%lld\n", prompt,
                 static_cast<long long>(c.context_length - 1));
    return 2;
  }
  int max_len = prompt;
  for (int l : a.prompt_lengths) {
    if (l < 1 || l >= c.context_length) {
      std::fprintf(stderr, "specserve bench-model: --prompt-lengths: %d is not in 1..%lld\n", l,
                   static_cast<long long>(c.context_length - 1));
      return 2;  // bad input, as --decode-batches below and every other flag
    }
    max_len = std::max(max_len, l);
  }
  max_len += a.decode_tokens + 1;
  if (max_len > c.context_length) {
    std::fprintf(stderr, "specserve bench-model: prompt length + --decode-tokens %d exceed the context length %lld\n",
                 a.decode_tokens, static_cast<long long>(c.context_length));
    return 2;
  }
  for (int n : a.verify_rows) {
    if (n < 1 || n > 64) {
      std::fprintf(stderr, "specserve bench-model: --verify-rows: %d is not in 1..64\n", n);
      return 2;
    }
    if (prompt + n > c.context_length) {
      std::fprintf(stderr, "specserve bench-model: --verify-rows: %d rows after --decode-context %d exceed the context length %lld\n",
                   n, prompt, static_cast<long long>(c.context_length));
      return 2;
    }
    max_len = std::max(max_len, prompt + n);
  }
  // Each row count once, in ascending order (a repeated one was timed and printed twice).
  std::vector<int> verify_rows = a.verify_rows;
  std::sort(verify_rows.begin(), verify_rows.end());
  verify_rows.erase(std::unique(verify_rows.begin(), verify_rows.end()), verify_rows.end());
  int max_batch = 1;
  for (int b : a.decode_batches) {
    if (b < 1 || b > 256) {
      std::fprintf(stderr, "specserve bench-model: --decode-batches: %d is not in 1..256\n", b);
      return 2;
    }
    max_batch = std::max(max_batch, b);
  }
  // Each sequence of a decode batch owns its own run of blocks; the prefill runs use sequence 0's.
  const int blocks_per_seq = (max_len + bs - 1) / bs + 1;
  auto kv = m.create_kv(static_cast<int64_t>(blocks_per_seq) * max_batch, bs);
  if (!kv.ok()) {
    std::fprintf(stderr, "specserve bench-model: %s\n", kv.status().to_string().c_str());
    return 1;
  }
  auto fwd = [&](const ForwardBatch& b) {
    Status st = m.forward(b, **kv, &fo);
    if (!st.ok()) std::fprintf(stderr, "specserve bench-model: forward: %s\n", st.to_string().c_str());
    return st.ok();
  };
  auto table_of = [&](int seq) {
    std::vector<int32_t> t;
    for (int i = 0; i < blocks_per_seq; ++i) t.push_back(seq * blocks_per_seq + i);
    return t;
  };
  const int32_t vocab_mod = static_cast<int32_t>(std::min<int64_t>(c.vocab_size - 100, 20000));
  nlohmann::json out;
  out["model"] = path;
  out["device"] = backend->name();
  out["threads"] = a.threads;
  out["dtype"] = a.dtype;
  out["cpu_matmul"] = matmul_isa_name(matmul_isa());  // cpu/matmul.h: avx2, avx512, amx or vnni (SPECSERVE_CPU_MATMUL)
  out["cpu_attention"] = attention_kernel_name();  // cpu/attention.h: tiled or rowwise (SPECSERVE_CPU_ATTENTION)
  out["cpu_weights"] = cpu_weight_storage();  // cpu/cpu_backend.h: blocks or f32 (SPECSERVE_CPU_WEIGHTS)
  out["cpu_fused_dequant"] = fused_block_matmul() ? "1" : "0";  // cpu/matmul.h (SPECSERVE_CPU_FUSED_DEQUANT)
  out["tensor_parallel_size"] = a.tensor_parallel_size;
  out["decode_context"] = prompt;
  for (int len : a.prompt_lengths) {
    std::vector<double> times;
    for (int r = 0; r < a.repeats; ++r) {
      ForwardBatch b;
      SequenceInput s;
      for (int i = 0; i < len; ++i) s.tokens.push_back(100 + (i * 37) % vocab_mod);
      s.block_table = table_of(0);
      b.seqs.push_back(s);
      const double t0 = now_s();
      if (!fwd(b)) return 1;
      times.push_back(now_s() - t0);
    }
    const double tps = len / median(times);
    std::fprintf(stderr, "[bench-model] prefill %d tokens: %.1f tokens/s\n", len, tps);
    out["prefill"][std::to_string(len)] = tps;
  }
  // Bytes one decode step reads: every matmul weight in the backend's storage (fp32 or GGUF blocks
  // on the CPU, bf16 or fp16 on CUDA unless --dtype float32 or, under --dtype auto,
  // SPECSERVE_CUDA_WEIGHTS=fp32), and the fp32 KV of the cached tokens (prompt + half the decode).
  const char* cuda_weights = std::getenv("SPECSERVE_CUDA_WEIGHTS");  // actors/backend_factory.h
  const bool cuda_fp32 = a.dtype == "float32" || a.dtype == "float" ||
                         (a.dtype == "auto" && cuda_weights && std::string(cuda_weights) == "fp32");
  const double wbytes = on_gpu && !cuda_fp32 ? 2.0 : 4.0;
  const double d = static_cast<double>(c.hidden_size), ff = static_cast<double>(c.ffn_size);
  const double per_layer = d * c.q_dim() * 2 + d * c.kv_dim() * 2 + 3 * d * ff;
  double weight_bytes = wbytes * (c.num_layers * per_layer + d * c.vocab_size);
  if (!on_gpu && a.synthetic.empty() && std::string(cpu_weight_storage()) == "blocks") {
    // Q4_1 / Q8_0 matmul weights stay in their blocks on the CPU (cpu/cpu_backend.h): count the
    // GGUF's own bytes for them. The token embedding counts only where it is also the output head.
    if (auto f = GgufFile::open(path); f.ok()) {
      const bool tied = f->find_tensor("output.weight") == nullptr;
      weight_bytes = 0;
      for (const GgufTensorInfo& t : f->tensors()) {
        if (t.shape.size() != 2 || (t.name == "token_embd.weight" && !tied)) continue;
        const bool blocks = (t.type() == GgmlType::Q4_1 || t.type() == GgmlType::Q8_0) && t.shape[0] % 32 == 0;
        weight_bytes += blocks ? static_cast<double>(t.num_bytes) : 4.0 * static_cast<double>(t.num_elements);
      }
    }
  }
  const double kv_bytes_per_seq = 4.0 * 2 * c.num_layers * c.kv_dim() * (prompt + a.decode_tokens / 2.0);
  double peak_gb_s = 0;
  std::string peak_source;
#ifdef SPECSERVE_WITH_CUDA
  if (on_gpu) {
    auto info = cuda_device_info(std::stoi(backend->name().substr(5)));
    if (info.ok()) {
      peak_gb_s = info->peak_bandwidth_gb_s;
      peak_source = info->name + ": 2 x memory clock x bus width";
      out["gpu"] = info->name;
    }
  }
#endif
  if (!on_gpu) {
    peak_gb_s = measure_read_bandwidth();
    peak_source = "measured: OpenMP sum over 1 GiB";
  }
  out["bandwidth_gb_s"] = peak_gb_s;
  out["bandwidth_source"] = peak_source;
  // Decode at each batch size: `batch` sequences after a --decode-context-token prompt each, one token per
  // sequence per step, greedy as the engine decodes: only each row's argmax reaches the host
  // (SequenceInput::argmax_only), unless SPECSERVE_ARGMAX_ON_DEVICE=0 (whole logit rows, for
  // comparison; spec/engine.h EngineOptions::argmax_on_device).
  const auto on_device = argmax_on_device_from_env(true);
  if (!on_device.ok()) {
    std::fprintf(stderr, "specserve bench-model: %s\n", on_device.status().message().c_str());
    return 2;
  }
  const bool picks = *on_device;
  out["argmax_on_device"] = picks;
  std::fprintf(stderr, "[bench-model] greedy decode tokens: %s\n",
               picks ? "argmax on the backend (argmax_rows)" : "whole logit rows to the host (SPECSERVE_ARGMAX_ON_DEVICE=0)");
  for (int batch : a.decode_batches) {
    std::vector<double> rates;
    for (int r = 0; r < a.repeats; ++r) {
      ForwardBatch pre;
      for (int sq = 0; sq < batch; ++sq) {
        SequenceInput s;
        for (int i = 0; i < prompt; ++i) s.tokens.push_back(100 + (i + 7 * sq) % vocab_mod);
        s.block_table = table_of(sq);
        s.argmax_only = picks;
        pre.seqs.push_back(s);
      }
      if (!fwd(pre)) return 1;
      backend->synchronize();
      const double t0 = now_s();
      for (int i = 0; i < a.decode_tokens; ++i) {
        ForwardBatch dcd;
        for (int sq = 0; sq < batch; ++sq) {
          SequenceInput x;
          x.tokens = {picks ? std::max(0, fo.argmax_of(sq, 0)) : Sampler::argmax(fo.row(sq, 0), static_cast<int32_t>(c.vocab_size))};
          x.argmax_only = picks;
          x.num_cached = prompt + i;
          x.block_table = table_of(sq);
          dcd.seqs.push_back(x);
        }
        if (!fwd(dcd)) return 1;
      }
      rates.push_back(static_cast<double>(batch) * a.decode_tokens / (now_s() - t0));
    }
    const double tps = median(rates);
    const double step_s = batch / tps;
    const double bytes = weight_bytes + batch * kv_bytes_per_seq;
    const double achieved = bytes / step_s / 1e9;
    std::fprintf(stderr,
                 "[bench-model] decode batch %d: %.2f tokens/s (%.2f ms/step); %.1f MB read per step -> %.1f GB/s = %.0f%% of %.1f GB/s\n",
                 batch, tps, step_s * 1e3, bytes / 1e6, achieved, peak_gb_s > 0 ? 100 * achieved / peak_gb_s : 0.0, peak_gb_s);
    nlohmann::json& o = out["decode"][std::to_string(batch)];
    o["tokens_per_s"] = tps;
    o["ms_per_step"] = step_s * 1e3;
    o["bytes_per_step"] = bytes;
    o["achieved_gb_s"] = achieved;
    o["fraction_of_bandwidth"] = peak_gb_s > 0 ? achieved / peak_gb_s : 0.0;
    o["bandwidth_bound_tokens_per_s"] = peak_gb_s > 0 ? batch * peak_gb_s * 1e9 / bytes : 0.0;
    if (batch == 1) {  // the fields of earlier result files
      out["decode_batch1_tokens_per_s"] = tps;
      out["bytes_per_decode_step"] = bytes;
      out["read_bandwidth_gb_s"] = peak_gb_s;
      out["bandwidth_bound_tokens_per_s"] = peak_gb_s * 1e9 / bytes;
    }
  }
  // Verification steps: one sequence with the --decode-context prompt cached, then `n` chain rows
  // in one forward call, every row a logit row with its argmax (spec/engine_verify.cpp's target
  // pass for n - 1 drafted tokens, greedy). Each timed step writes the same n KV slots again, so
  // the context stays the prompt's. ratio_to_one_row: the step's time over the 1-row step's,
  // measured here the same way; it is what a drafted token must pay for (a step that accepts
  // a tokens on average gains when (1 + a) / ratio > 1, before the proposer's own cost).
  if (!verify_rows.empty()) {
    ForwardBatch pre;
    SequenceInput ps;
    for (int i = 0; i < prompt; ++i) ps.tokens.push_back(100 + i % vocab_mod);
    ps.block_table = table_of(0);
    ps.argmax_only = picks;
    pre.seqs.push_back(ps);
    if (!fwd(pre)) return 1;
    backend->synchronize();
    auto time_rows = [&](int n) -> double {
      std::vector<double> per_step;
      for (int r = 0; r < a.repeats; ++r) {
        const double t0 = now_s();
        for (int i = 0; i < a.decode_tokens; ++i) {
          ForwardBatch v;
          SequenceInput x;
          for (int j = 0; j < n; ++j) x.tokens.push_back(100 + (prompt + j + i) % vocab_mod);
          for (int j = 0; j < n; ++j) x.logit_rows.push_back(j);
          x.argmax_only = picks;
          x.num_cached = prompt;
          x.block_table = table_of(0);
          v.seqs.push_back(std::move(x));
          if (!fwd(v)) return -1;
        }
        backend->synchronize();
        per_step.push_back((now_s() - t0) / a.decode_tokens);
      }
      return median(per_step);
    };
    const double one = time_rows(1);
    if (one < 0) return 1;
    for (int n : verify_rows) {
      const double s = n == 1 ? one : time_rows(n);
      if (s < 0) return 1;
      std::fprintf(stderr, "[bench-model] verify %d rows after %d cached: %.2f ms/step = %.2fx the 1-row step (%.2f ms)\n", n,
                   prompt, s * 1e3, s / one, one * 1e3);
      nlohmann::json& o = out["verify"][std::to_string(n)];
      o["ms_per_step"] = s * 1e3;
      o["ratio_to_one_row"] = s / one;
    }
  }
#ifdef SPECSERVE_WITH_CUDA
  if (on_gpu) {  // gpu/cuda_graphs.h: whether decode steps ran as graph replays
    const CudaGraphStats g = cuda_graph_stats(*backend);
    const char* env = std::getenv("SPECSERVE_CUDA_GRAPHS");
    out["cuda_graphs"] = {{"enabled", !(env && std::string(env) == "0")}, {"replays", g.replays},
                          {"captures", g.captures}, {"eager_segments", g.eager_segments},
                          {"failed_captures", g.failed_captures}};
    std::fprintf(stderr, "[bench-model] cuda graphs: %lld replays, %lld captures, %lld eager segments, %lld failed captures\n",
                 static_cast<long long>(g.replays), static_cast<long long>(g.captures),
                 static_cast<long long>(g.eager_segments), static_cast<long long>(g.failed_captures));
  }
#endif
  std::printf("%s\n", out.dump(1).c_str());
  if (!a.output.empty()) {
    if (Status st = write_output_file("--output", a.output, out.dump(1) + "\n"); !st.ok()) {
      std::fprintf(stderr, "specserve bench-model: %s\n", st.message().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

void add_bench_model(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand("bench-model", "Prefill and decode tokens/s of the model runtime, and the bandwidth bound (a benchmark)");
  sub->add_option("--model", a->model, "GGUF model (default: the fetched SmolLM2-135M-Instruct)")->check(non_empty_path());
  sub->add_option("--threads", a->threads, "CPU threads (default: all), split between tensor-parallel ranks")->check(CLI::Range(0, 1024));
  sub->add_option("--tensor-parallel-size", a->tensor_parallel_size,
                  "Ranks (threads with their own CPU backend, Gloo all-reduce over loopback); <= the model's kv heads")
      ->check(CLI::Range(1, 1024));
  sub->add_option("--device", a->device, "Where the model runs: cpu or cuda:N (default: cpu; cuda needs tensor-parallel size 1)");
  add_dtype_option(*sub, &a->dtype);
  add_enforce_eager_flag(*sub);
  sub->add_option("--synthetic", a->synthetic,
                  "Instead of --model: a model shaped like llama-1b or llama-8b (or llama-tiny) with random bf16 weights, built in memory");
  sub->add_option("--decode-batches", a->decode_batches, "Decode batch sizes to time (default: 1)");
  sub->add_option("--repeats", a->repeats, "Runs per figure; the median is reported (default 3)")->check(CLI::Range(1, 100));
  sub->add_option("--prompt-lengths", a->prompt_lengths, "Prefill lengths to time (default: 256 512; decode follows a --decode-context-token prompt)");
  sub->add_option("--decode-tokens", a->decode_tokens, "Decode steps to time (default 128)")->check(CLI::Range(1, 4096));
  sub->add_option("--decode-context", a->decode_context,
                  "Tokens each sequence has cached when the timed decode steps start (llama-bench's depth; default 64)")
      ->capture_default_str();
  sub->add_option("--verify-rows", a->verify_rows,
                  "Also time verification steps: one sequence, N chain rows after the --decode-context prompt, all "
                  "with logits (a target pass over N - 1 drafted tokens), as ms and as a ratio to the 1-row step; "
                  "--decode-tokens steps per figure, the median of --repeats")
      ->check(CLI::Range(1, 64));
  sub->add_option("--output", a->output, "Write the results as JSON here");
  register_command("bench-model", [a] { return run(*a); });
}

}  // namespace specserve::cli
