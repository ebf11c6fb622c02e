// `specserve serve`: a head and one replica in this process, from flags (a one-node topology).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/backend_factory.h"
#include "actors/proposer_factory.h"
#include "actors/worker_config.h"
#include "cluster/launch.h"
#include "config/topology.h"
#include "model/gguf.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tools/cli/common.h"
#include "tools/cli/http_front_end.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

constexpr const char* kDefaultTokenFile = "~/.config/specserve/token";

// ---------------------------------------------------------------- serve

struct ServeArgs {
  std::string model, host = "127.0.0.1", token_file = kDefaultTokenFile, ready_file;
  int actor_port = 7420, max_num_seqs = 64, max_num_batched_tokens = 2048, block_size = 16, max_model_len = 0, threads = 0;
  int tensor_parallel_size = 1;
  std::string device = "cpu";
  std::string dtype = "auto";
  double gpu_memory_utilization = 0.9;
  std::string kv_cache_bytes = "1GiB";
  bool enable_prefix_caching = true;
  double drain_timeout = 60;
  SpecArgs spec;
  HttpArgs http;
};

// The files `serve` will load, checked as `up --dry-run` checks them (cluster/up_plan.h): the
// target (model/model_loader.h check_model_file), then the speculative entry's files
// (actors/proposer_factory.h check_speculative_files). Every problem, one per line, each
// starting with the flag that gave the value; the status code is the first problem's.
Status check_serve_files(const SpecArgs& args, const Topology& t) {
  std::vector<Status> problems;
  const std::string& path = t.models.target.path;
  auto target = GgufFile::open(path);
  if (!target.ok()) {
    Status st = target.status();
    // As load_model says it: the default model is fetched by a script.
    if (st.code() == StatusCode::kNotFound && path.find("SmolLM2-135M-Instruct") != std::string::npos) {
      st = Status(st.code(), st.message() + " (run scripts/fetch-model.sh to fetch the default model)");
    }
    problems.push_back(st);
  } else if (Status st = check_model_file(*target); !st.ok()) {
    problems.push_back(st);
  }
  for (Status& st : problems) st = Status(st.code(), (st.message().rfind(path, 0) == 0 ? "--model " : "--model " + path + ": ") + st.message());
  // The context and the CPU KV pool (tensor-parallel size 1; on cuda:N the pool comes from
  // --gpu-memory-utilization and the worker plans it): a pool that cannot hold one sequence of
  // max_model_len is refused here, as vLLM does, not found by a request halfway through.
  if (problems.empty() && t.models.target.tensor_parallel_size == 1 && !t.nodes.empty() && !t.nodes[0].workers.empty() &&
      t.nodes[0].workers[0].device.kind == DeviceKind::kCpu) {
    if (auto cfg = ModelConfig::from_gguf(*target); cfg.ok()) {
      if (Status st = check_target_fits(t, *cfg, path, /*cpu_pool=*/true, /*check_memory=*/true); !st.ok()) problems.push_back(st);
    }
  }
  if (t.models.speculative) {
    for (Status& st : speculative_file_problems(args, *t.models.speculative, target.ok() ? &*target : nullptr)) problems.push_back(std::move(st));
  }
  if (problems.empty()) return Status();
  std::string all;
  for (const Status& st : problems) all += (all.empty() ? "" : "\nspecserve serve: ") + st.message();
  return Status(problems.front().code(), all);
}

int run_serve_cmd(const ServeArgs& a) {
  Topology t;
  t.source = "(serve flags)";
  t.cluster.name = "serve";
  auto tf = expand_user_path(a.token_file);
  if (!tf.ok()) return std::fprintf(stderr, "specserve serve: --token-file: %s\n", tf.status().message().c_str()), 2;
  t.cluster.token_file = *tf;
  t.head.host = a.host;
  t.head.actor_port = a.actor_port;
  t.source = "(serve flags)";
  t.locations["models.target.path"] = "--model";
  t.locations["models.speculative.model"] = "--speculative-model";
  t.locations["scheduler.kv_cache_bytes"] = "--kv-cache-bytes";
  t.locations["models.target.max_model_len"] = "--max-model-len";
  t.locations["head.actor_port"] = "--actor-port";
  t.locations["head.http_port"] = "--port";
  t.locations["head.host"] = "--host";
  t.models.target.path = a.model.empty() ? default_model_path() : a.model;
  t.locations["models.target.dtype"] = "--dtype";
  if (auto d = parse_compute_dtype(a.dtype, "--dtype"); d.ok()) {
    t.models.target.dtype = *d;
  } else {
    return std::fprintf(stderr, "specserve serve: %s\n", d.status().message().c_str()), 2;
  }
  // Bad input before anything listens: bfloat16 where this CPU cannot run it, float16 on the CPU.
  if (Status st = check_compute_dtype(t.models.target.dtype, a.device, "--dtype"); !st.ok()) {
    return std::fprintf(stderr, "specserve serve: %s\n", st.message().c_str()), exit_status_for(st);
  }
  if (a.max_model_len > 0) t.models.target.max_model_len = a.max_model_len;
  EngineOptions eo;
  eo.max_model_len = a.max_model_len;
  auto spec = parse_spec_args(a.spec, &eo);
  if (!spec.ok()) return std::fprintf(stderr, "specserve serve: %s\n", spec.status().message().c_str()), 2;
  if (spec->has_value()) {
    t.models.speculative = **spec;
    t.models.speculative->disable_by_batch_size = eo.disable_by_batch_size;
    t.models.speculative->adaptive_k = eo.adaptive_k;
    t.models.speculative->disable_by_goodput = eo.disable_by_goodput;
  }
  auto kv = parse_byte_size(a.kv_cache_bytes);
  if (!kv.ok()) return std::fprintf(stderr, "specserve serve: --kv-cache-bytes: %s\n", kv.status().message().c_str()), 2;
  t.scheduler.kv_cache_bytes = *kv;
  t.scheduler.max_num_seqs = a.max_num_seqs;
  t.scheduler.max_num_batched_tokens = a.max_num_batched_tokens;
  HttpArgs http = a.http;
  if (Status st = resolve_http_args(&http); !st.ok()) return std::fprintf(stderr, "specserve serve: %s\n", st.message().c_str()), 2;
  // As the topology's head.host note says for `up`: beyond loopback, other machines reach both ports.
  if (!is_loopback_host(a.host)) {
    std::fprintf(stderr,
                 "specserve serve: note: --host %s is not loopback: other machines can reach the actor port (they must "
                 "present the cluster token)%s\n",
                 a.host.c_str(),
                 http.no_http ? ""
                 : http.api_key.empty() ? " and the HTTP API, which has no --api-key: anyone who reaches it can use it"
                 : http.ssl_certfile.empty() ? " and the HTTP API (--api-key required; without --ssl-certfile the key and "
                                               "the text travel unencrypted)"
                                             : " and the HTTPS API (--api-key required)");
  }
  // vLLM refuses the same: a step could not give every running sequence its token.
  if (a.max_num_batched_tokens < a.max_num_seqs) {
    return std::fprintf(stderr,
                        "specserve serve: --max-num-batched-tokens = %d is less than --max-num-seqs = %d: every running "
                        "sequence needs at least one token per step\n",
                        a.max_num_batched_tokens, a.max_num_seqs),
           2;
  }
  // Before the model loads: the HTTP front end could not bind a port the actor port holds.
  // With --no-http nothing listens on --port (its default 8000 included), so any actor port goes.
  if (const int http_port = a.http.port >= 0 ? a.http.port : 8000;
      !a.http.no_http && http_port != 0 && http_port == a.actor_port) {
    return std::fprintf(stderr, "specserve serve: --port = %d is also --actor-port = %d: the two must differ\n", http_port,
                        a.actor_port),
           2;
  }
  t.scheduler.block_size = a.block_size;
  t.scheduler.enable_prefix_caching = a.enable_prefix_caching;
  auto device = parse_device(a.device);
  if (!device.ok()) {
    return std::fprintf(stderr, "specserve serve: --device = '%s': %s\n", a.device.c_str(), device.status().message().c_str()), 2;
  }
  NodeSpec n;
  n.name = "local";
  // Tensor parallelism: the ranks are actors of this process (actors/tp_group.h); on cuda:N rank
  // r runs on cuda:N+r, as vLLM places its ranks on consecutive GPUs.
  t.models.target.tensor_parallel_size = a.tensor_parallel_size;
  t.locations["models.target.tensor_parallel_size"] = "--tensor-parallel-size";
  for (int r = 0; r < a.tensor_parallel_size; ++r) {
    WorkerSpec w;
    w.model = "target";
    w.rank = r;
    w.device = *device;
    if (device->kind == DeviceKind::kCuda) w.device.index += r;
    w.gpu_memory_utilization = a.gpu_memory_utilization;
    // Before anything listens or prints its address: a device this machine lacks is bad input.
    if (Status st = check_device_available(r == 0 ? "--device" : "--device (tensor-parallel rank " + std::to_string(r) + ")",
                                           w.device.to_string());
        !st.ok()) {
      return std::fprintf(stderr, "specserve serve: %s\n", st.message().c_str()), 2;
    }
    if (r == 0 || device->kind == DeviceKind::kCuda) n.devices.push_back(w.device);
    n.workers.push_back(w);
  }
  t.nodes.push_back(n);
  // Also before the banner: the target and the draft / head files, checked without loading any
  // weight (a head passed as --model, a head of another method or trained on another target, a
  // tree that does not parse) — bad input, named by its flag, not a worker failure after the
  // HTTP front end has printed its address.
  if (Status st = check_serve_files(a.spec, t); !st.ok()) return std::fprintf(stderr, "specserve serve: %s\n", st.message().c_str()), 2;
  // A ready file that cannot be written would leave whoever waits for it waiting.
  if (!a.ready_file.empty()) {
    if (Status st = check_replaceable_file("--ready-file", a.ready_file); !st.ok()) return std::fprintf(stderr, "specserve serve: %s\n", st.message().c_str()), 2;
  }
  ServeOptions o;
  o.topology = std::move(t);
  o.threads = a.threads;
  o.drain_timeout_s = a.drain_timeout;
  o.ready_file = a.ready_file;
  o.topology.head.http_port = a.http.port >= 0 ? a.http.port : 8000;
  o.front_end = make_http_front_end(http);
  return run_serve(o);
}

}  // namespace

void add_serve_command(CLI::App& app) {
  {
    auto a = std::make_shared<ServeArgs>();
    auto* sub = app.add_subcommand("serve", "Serve a model in one process: head (actor port, OpenAI-compatible HTTP API on --port) and one replica with its proposer");
    sub->add_option("--model", a->model, "GGUF model path (default: the fetched SmolLM2-135M-Instruct Q4_1)")->check(non_empty_path());
    sub->add_option("--host", a->host, "Address the actor port and the HTTP API listen on (loopback unless set; beyond it, use --api-key)")->capture_default_str();
    sub->add_option("--actor-port", a->actor_port, "Actor (client API) port; 0 picks a free one")->check(CLI::Range(0, 65535))->capture_default_str();
    sub->add_option("--token-file", a->token_file, "Cluster token file (created, mode 0600, when missing)")->capture_default_str();
    sub->add_option("--max-num-seqs", a->max_num_seqs, "Sequences running at once")->check(CLI::Range(1, 4096))->capture_default_str();
    sub->add_option("--max-num-batched-tokens", a->max_num_batched_tokens, "Tokens per forward pass")->check(CLI::Range(1, 1 << 20))->capture_default_str();
    sub->add_option("--block-size", a->block_size, "KV block size in tokens")->check(CLI::Range(1, 1024))->capture_default_str();
    sub->add_option("--kv-cache-bytes", a->kv_cache_bytes, "KV cache size (e.g. 512MiB, 2GiB)")->capture_default_str();
    // NOTE: two flags rather than CLI11's "--a,!--no-a", whose help line shows "{false}" (the
    // negation's value), which read as if the default were off.
    auto* apc_on = sub->add_flag("--enable-prefix-caching", a->enable_prefix_caching,
                                 "Automatic prefix caching: reuse the KV blocks of cached prompt prefixes (default on)");
    sub->add_flag_callback("--no-enable-prefix-caching", [a] { a->enable_prefix_caching = false; }, "Turn automatic prefix caching off")
        ->excludes(apc_on);
    sub->add_option("--max-model-len", a->max_model_len, "Context length limit in tokens (0 or left out: the model's)")->check(CLI::Range(0, INT32_MAX))->check(max_model_len_not_one());
    sub->add_option("--threads", a->threads, "CPU threads (default: all cores), split evenly between tensor-parallel ranks")
        ->check(CLI::Range(0, 1024));
    sub->add_option("--tensor-parallel-size", a->tensor_parallel_size,
                    "Split the target over N ranks (attention heads and MLP columns; Gloo all-reduce over loopback), "
                    "each an actor with its own CPU threads; 1 <= N <= the model's kv heads")
        ->check(CLI::Range(1, 1024))
        ->capture_default_str();
    sub->add_option("--device", a->device, "Where the target runs: cpu or cuda:N (tensor-parallel rank r on cuda:N+r)")->capture_default_str();
    add_dtype_option(*sub, &a->dtype);
    add_enforce_eager_flag(*sub);
    add_gpu_memory_utilization_option(*sub, &a->gpu_memory_utilization,
                                      "cuda:N: fraction of each GPU's total memory this server may use for weights, activations "
                                      "and KV (vLLM's); the KV pool takes what the weights leave. Ignored on the CPU");
    sub->add_option("--drain-timeout", a->drain_timeout, "Seconds to finish in-flight requests on Ctrl-C / SIGTERM")
        ->check(seconds_validator("--drain-timeout"))
        ->capture_default_str();
    sub->add_option("--ready-file", a->ready_file, "Write the actor endpoint HOST:PORT (for `client --connect`; the HTTP port is --port) to this file once ready");
    add_spec_options(*sub, &a->spec);
    add_http_flags(sub, &a->http, /*with_port=*/true);
    register_command("serve", [a] { return run_serve_cmd(*a); });
  }
}

}  // namespace specserve::cli
