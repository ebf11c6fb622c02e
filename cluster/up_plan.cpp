// specserve cluster: `specserve up --dry-run` (see up_plan.h).
#include "cluster/up_plan.h"

#include <unistd.h>

#include <cstdio>

#include "actors/backend_factory.h"
#include "actors/runtime.h"
#include "actors/worker_config.h"

namespace specserve {
namespace {

bool runs_here(const Topology& t, const NodeSpec& n) { return is_loopback_host(n.host) || n.host == t.head.host; }

// A target shard (on this host: `here_only`) whose KV pool is scheduler.kv_cache_bytes (the CPU's).
bool cpu_target(const Topology& t, bool here_only) {
  for (const NodeSpec& n : t.nodes) {
    if (here_only && !runs_here(t, n)) continue;
    for (const WorkerSpec& w : n.workers)
      if (w.role == WorkerRole::kTargetShard && w.device.kind == DeviceKind::kCpu) return true;
  }
  return false;
}

// "<where>: <field> = <value>: <message>", the message's own leading "<value>: " (a file's path,
// which the GGUF reader and the head checks put first) dropped as said already.
Status field_error(const Topology& t, const std::string& field, const std::string& value, const Status& st) {
  std::string msg = st.message();
  if (!value.empty() && msg.rfind(value + ": ", 0) == 0) msg = msg.substr(value.size() + 2);
  return Status(st.code(), t.where(field) + ": " + field + " = " + value + ": " + msg);
}

}  // namespace

std::vector<Status> check_up_plan(const Topology& t) {
  std::vector<Status> problems;
  // A node `up` does not start (another host: its own `specserve node --join` there) can never
  // join a head that listens on loopback. NOTE: only a note said so; `up` then waited for it
  // for good and never wrote --ready-file.
  if (is_loopback_host(t.head.host)) {
    for (size_t i = 0; i < t.nodes.size(); ++i) {
      if (runs_here(t, t.nodes[i])) continue;
      const std::string p = "nodes[" + std::to_string(i) + "].host";
      problems.push_back(invalid_argument(t.where(p) + ": " + p + " = " + t.nodes[i].host + ": a node on another host (its own `specserve node` "
                                          "joins the head) cannot reach head.host " + t.head.host +
                                          ", which is loopback: give head.host an address that node reaches"));
    }
  }
  bool dtype_checked_on_cpu = false;
  for (size_t i = 0; i < t.nodes.size(); ++i) {
    const NodeSpec& n = t.nodes[i];
    // NOTE: a remote node's devices are checked by its own `specserve node` (this machine cannot see them).
    if (!runs_here(t, n)) continue;
    for (size_t j = 0; j < n.workers.size(); ++j) {
      const std::string path = "nodes[" + std::to_string(i) + "].workers[" + std::to_string(j) + "].device";
      Status st = check_device_available(t.where(path) + ": " + path, n.workers[j].device.to_string());
      if (!st.ok()) problems.push_back(st);
      // models.target.dtype on this machine's CPU (bfloat16 needs AMX; no float16 kernel), once,
      // for a target-side worker (a draft worker that cannot follow it keeps its default).
      if (n.workers[j].device.kind == DeviceKind::kCpu && n.workers[j].role != WorkerRole::kDraftWorker &&
          !dtype_checked_on_cpu) {
        dtype_checked_on_cpu = true;
        const std::string field = "models.target.dtype";
        if (Status d = check_compute_dtype(t.models.target.dtype, "cpu", field); !d.ok()) {
          problems.push_back(Status(d.code(), t.where(field) + ": " + d.message() + " (" + path + " is cpu)"));
        }
      }
    }
  }
  // What would fail only after the cluster is up: a context past the model's (the worker
  // refuses it), a CPU KV pool that cannot hold one sequence of it (requests fail halfway).
  // NOTE: tensor_parallel_size 1 only: a rank's KV pool counts its own share of the heads.
  // The block count is the same on every host; the memory is this host's.
  const bool cpu_pool = t.models.target.tensor_parallel_size == 1 && cpu_target(t, /*here_only=*/false);
  for (const ModelFileProblem& p : check_model_files(t, cpu_pool, /*check_memory=*/cpu_target(t, /*here_only=*/true))) {
    problems.push_back(p.field.empty() ? p.status : field_error(t, p.field, p.value, p.status));
  }
  // Every CPU target-side worker on this host allocates its own pool of scheduler.kv_cache_bytes
  // at start (a 4 GiB pool is 4 GiB resident): together they must fit this machine's memory,
  // not only each alone (a trial's 2 x 15 GiB on a 23.5 GiB host passed). Tensor parallelism
  // splits a pool over its ranks: checked for size 1.
  if (t.models.target.tensor_parallel_size == 1) {
    int64_t pools = 0;
    for (const NodeSpec& n : t.nodes) {
      if (!runs_here(t, n)) continue;
      for (const WorkerSpec& w : n.workers) pools += w.device.kind == DeviceKind::kCpu && w.role != WorkerRole::kDraftWorker;
    }
    const int64_t pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    const int64_t memory = pages > 0 && page > 0 ? pages * page : 0;
    if (pools > 1 && memory > 0 && t.scheduler.kv_cache_bytes <= memory && t.scheduler.kv_cache_bytes > memory / pools) {
      char need[32], have[32];
      std::snprintf(need, sizeof need, "%.1f GiB", static_cast<double>(t.scheduler.kv_cache_bytes) * pools / (1LL << 30));
      std::snprintf(have, sizeof have, "%.1f GiB", static_cast<double>(memory) / (1LL << 30));
      problems.push_back(invalid_argument(t.where("scheduler.kv_cache_bytes") + ": scheduler.kv_cache_bytes = " +
                                          std::to_string(t.scheduler.kv_cache_bytes) + " for each of the " +
                                          std::to_string(pools) + " CPU target shards and prefill workers on this host is " +
                                          need + ", more than this machine's memory (" + have + ")"));
    }
  }
  // An existing cluster.token_file that `up` would refuse (a directory, a device, readable by
  // others, empty); a missing one is fine: `up` creates it.
  if (auto tok = read_cluster_token(t.cluster.token_file); !tok.ok() && tok.status().code() != StatusCode::kNotFound) {
    std::string msg = tok.status().message();  // "cluster token file PATH: why": the field says the first part
    if (msg.rfind("cluster token file ", 0) == 0) msg = msg.substr(19);
    problems.push_back(field_error(t, "cluster.token_file", t.cluster.token_file, Status(tok.status().code(), msg)));
  } else if (!tok.ok()) {
    // Missing: `up` creates it, so the folder it goes in must be creatable (/proc/x/token is not).
    if (Status st = check_cluster_token_creatable(t.cluster.token_file); !st.ok()) {
      problems.push_back(field_error(t, "cluster.token_file", t.cluster.token_file, st));
    }
  }
  return problems;
}

std::string describe_up_plan(const Topology& t) {
  std::string s;
  auto line = [&s](const char* fmt, auto... args) {
    char buf[1024];
    std::snprintf(buf, sizeof buf, fmt, args...);
    s += buf;
    s += '\n';
  };
  line("cluster '%s' (token file %s)", t.cluster.name.c_str(), t.cluster.token_file.c_str());
  line("head: actor port %s:%d, HTTP port %d", t.head.host.c_str(), t.head.actor_port, t.head.http_port);
  std::string max_len = t.models.target.max_model_len ? std::to_string(*t.models.target.max_model_len) : "the model's";
  line("target: %s (tensor_parallel_size %d, max_model_len %s, dtype %s)", t.models.target.path.c_str(),
       t.models.target.tensor_parallel_size, max_len.c_str(), compute_dtype_name(t.models.target.dtype));
  line("speculative: %s", describe_speculative(t).c_str());
  for (const NodeSpec& n : t.nodes) {
    std::string devs;
    for (const DeviceSpec& d : n.devices) devs += (devs.empty() ? "" : ", ") + d.to_string();
    line("node '%s' on %s (%s): devices [%s], %zu worker(s)", n.name.c_str(), n.host.c_str(),
         runs_here(t, n) ? "started here" : "remote: run `specserve node` there", devs.c_str(), n.workers.size());
    for (const WorkerSpec& w : n.workers) {
      std::string mem;
      if (w.device.kind == DeviceKind::kCuda) mem = ", gpu_memory_utilization " + std::to_string(w.gpu_memory_utilization).substr(0, 4);
      // NOTE: a rank means something for a target shard only (its tensor-parallel slice).
      const std::string rank = w.role == WorkerRole::kTargetShard ? ", rank " + std::to_string(w.rank) : "";
      line("  %s: replica %d%s, device %s%s", worker_role_name(w.role), w.replica, rank.c_str(),
           w.device.to_string().c_str(), mem.c_str());
    }
  }
  line("scheduler: max_num_seqs %d, max_num_batched_tokens %d, block_size %d, kv_cache_bytes %lld per replica, "
       "prefix caching %s",
       t.scheduler.max_num_seqs, t.scheduler.max_num_batched_tokens, t.scheduler.block_size,
       static_cast<long long>(t.scheduler.kv_cache_bytes), t.scheduler.enable_prefix_caching ? "on" : "off");
  if (t.scheduler.worker_restarts > 0 && !t.autoscale.enabled()) {
    if (t.models.target.tensor_parallel_size > 1) {
      line("restarts: a draft worker killed by a signal is restarted up to %d times; the ranks of a tensor-parallel "
           "target are never restarted (a dead rank fails its replica)",
           t.scheduler.worker_restarts);
    } else {
      line("restarts: a worker killed by a signal is restarted up to %d times; a dead target shard's requests wait up "
           "to %g s for it",
           t.scheduler.worker_restarts, t.scheduler.worker_restart_timeout_s);
    }
  }
  if (t.autoscale.enabled()) {
    line("autoscale: %d..%d ready replicas, warm_pool %d", t.autoscale.min_replicas, t.autoscale.max_replicas,
         t.autoscale.warm_pool);
  } else {
    line("autoscale: off (every declared replica serves)");
  }
  return s;
}

}  // namespace specserve
