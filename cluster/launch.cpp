// specserve cluster: the launcher commands (launch.h) — what `up`, `node`, `worker` and `serve` check
// and start; what up and serve do around the running head is in launch_lifecycle.cpp.
#include "cluster/launch.h"

#include <unistd.h>

#include <caf/io/all.hpp>

#include <chrono>
#include <map>
#include <cstdio>
#include <set>
#include <thread>

#include "actors/backend_factory.h"
#include "actors/client.h"
#include "actors/draft_worker.h"
#include "actors/gateway.h"
#include "actors/head.h"
#include "actors/messages.h"
#include "actors/runtime.h"
#include "actors/target_shard.h"
#include "actors/tp_group.h"
#include "actors/tp_rank.h"
#include "cluster/launch_lifecycle.h"
#include "cluster/node_supervisor.h"
#include "cluster/process.h"
#include "cluster/topology_snapshot.h"
#include "cluster/up_plan.h"
#include "core/logging.h"

namespace specserve {
namespace {

int fail(const char* cmd, const Status& st) {
  std::fprintf(stderr, "specserve %s: %s\n", cmd, st.message().c_str());
  return 1;
}

// A worker that fails before it registers: its reason also goes where its launcher reads it
// (kExitReasonFileEnv). It exits kExitConfig for bad input (the topology entry, a model or token
// file missing or malformed, a dtype this device cannot run), which a retry cannot mend; 1 for
// what may pass (the head not reachable yet, a device that did not answer, no memory).
int fail_worker(const Status& st) {
  std::fprintf(stderr, "specserve worker: %s\n", st.message().c_str());
  record_exit_reason(st.message());
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruptData:
    case StatusCode::kUnsupported:
    case StatusCode::kOutOfRange:
      return kExitConfig;
    default:
      return 1;
  }
}

bool has_draft_worker(const Topology& t, int32_t replica) {
  for (const NodeSpec& n : t.nodes) {
    for (const WorkerSpec& w : n.workers) {
      if (w.role == WorkerRole::kDraftWorker && w.replica == replica) return true;
    }
  }
  return false;
}

}  // namespace

int run_up(const UpOptions& o) {
  install_stop_signals();
  clear_inherited_topology_snapshot();  // single-threaded still
  // Read once: what is checked here is what every process up starts uses (cluster/topology_snapshot.h).
  auto source = read_topology_source(o.config_path);
  auto topo = source.ok() ? parse_topology(source->text, o.config_path, source->base_dir)
                          : Expected<Topology>(source.status());
  // Every problem at once, each naming its field and value, before anything starts (with or
  // without --dry-run): a user fixes them in one pass, and a bad head or tree is not found only
  // by a worker after the cluster is up. Bad input exits 2.
  const char* who = o.dry_run ? "up --dry-run" : "up";
  std::vector<std::string> problems;
  auto add = [&problems](const Status& st) {
    // One line per problem (the parser and the port check put several in one status).
    const std::string& m = st.message();
    for (size_t b = 0, e; b < m.size(); b = e + 1) {
      e = m.find('\n', b);
      if (e == std::string::npos) e = m.size();
      if (e > b) problems.push_back(m.substr(b, e - b));
    }
  };
  auto refuse = [&] {
    for (const std::string& p : problems) std::fprintf(stderr, "specserve %s: %s\n", who, p.c_str());
    std::fprintf(stderr, "specserve %s: %zu problem(s) in %s; nothing was started%s\n", who, problems.size(),
                 o.config_path.c_str(),
                 topo.ok() ? "" : " (ports, devices, head files and trees are checked once the topology parses)");
    return 2;
  };
  // NOTE: the parser lists every field it refuses, but the checks below need a parsed topology.
  if (!topo.ok()) return add(topo.status()), refuse();
  for (const auto& n : topo->notes) get_logger("cluster")->warn("{}", n);
  for (const Status& st : {check_ports_free(*topo, /*include_http=*/static_cast<bool>(o.front_end)), check_tensor_parallel_size(*topo)})
    if (!st.ok()) add(st);
  for (const Status& st : check_up_plan(*topo)) add(st);
  if (!problems.empty()) return refuse();
  if (o.dry_run) {
    std::fputs(describe_up_plan(*topo).c_str(), stdout);
    std::printf("specserve up --dry-run: %s is valid; nothing was started\n", o.config_path.c_str());
    return 0;
  }
  // Handed to the node processes (their workers inherit it) and the autoscaler's workers.
  std::map<std::string, std::string> snapshot_env;
  if (auto env = topology_snapshot_env(*source); env.ok()) {
    snapshot_env = std::move(*env);
  } else {
    get_logger("cluster")->warn("{}", env.status().message());
  }
  auto token = ensure_cluster_token(topo->cluster.token_file);
  if (!token.ok()) return fail("up", token.status());
  // With the autoscaler, the head starts replicas on demand (min_replicas + warm_pool at once,
  // the rest when the pool is refilled); local workers are then children of this process, not of
  // node processes. Without it, every node process starts all its workers.
  const bool autoscaled = topo->autoscale.enabled();
  // NOTE: declared before the runtime so that it outlives the scheduler actor, whose
  // start_replica callback refers to it (locals are destroyed in reverse order).
  WorkerLauncher launcher(*topo, o.config_path, o.threads_per_worker, snapshot_env);
  ActorRuntime rt;
  std::function<Status(int32_t)> start_replica;
  if (autoscaled) start_replica = [&launcher](int32_t replica) { return launcher.request(replica); };
  auto head = Head::start(rt, *topo, *token, /*publish=*/true, start_replica);
  if (!head.ok()) return fail("up", head.status());
  launcher.set_scheduler((*head)->scheduler());
  std::shared_ptr<void> front_end;
  if (o.front_end) {
    auto fe = o.front_end(*topo, **head, rt, *token);
    if (!fe.ok()) {
      shut_down(**head, nullptr, 0, nullptr);
      return fail("up", fe.status());
    }
    front_end = *fe;
  }
  const std::string endpoint = topo->head.host + ":" + std::to_string((*head)->actor_port());
  std::vector<Child> children;
  std::vector<std::string> remote;
  for (const NodeSpec& n : topo->nodes) {
    if (!is_loopback_host(n.host) && n.host != topo->head.host) {
      remote.push_back("specserve node --join " + endpoint + " --name " + n.name + " --config " + o.config_path);
      continue;
    }
    if (autoscaled) continue;  // the launcher starts this node's workers when the head asks
    std::vector<std::string> argv = {self_executable(), "node", "--join", endpoint, "--name", n.name, "--config",
                                     o.config_path, "--exit-with-parent"};
    if (o.threads_per_worker > 0) {
      argv.push_back("--threads-per-worker");
      argv.push_back(std::to_string(o.threads_per_worker));
    }
    auto c = spawn_child(argv, snapshot_env, "node " + n.name);
    if (!c.ok()) {
      shut_down(**head, &children, 0, &front_end);
      return fail("up", c.status());
    }
    children.push_back(*c);
  }
  std::fprintf(stderr, "specserve up: cluster '%s': head actor port %s (token in %s); %zu node process(es) started%s\n",
               topo->cluster.name.c_str(), endpoint.c_str(), topo->cluster.token_file.c_str(), children.size(),
               autoscaled ? "; the autoscaler starts the local replicas' workers" : "");
  for (const auto& r : remote) std::fprintf(stderr, "specserve up: on the node's host, run: %s\n", r.c_str());
  auto client = Client::in_process(rt.system(), (*head)->scheduler(), *token);
  bool failed = false;
  const AutoscaleSpec& as = topo->autoscale;
  const size_t replicas = autoscaled ? static_cast<size_t>(as.min_replicas) : topo->replica_ids().size();
  remove_ready_file(o.ready_file);
  const bool ready = autoscaled ? wait_ready(*client, replicas, 1e9, &failed, launcher.children(), &launcher, endpoint)
                                : wait_ready(*client, replicas, 1e9, &failed, &children);
  if (ready) {
    std::fprintf(stderr, "specserve up: ready: %zu replica(s) serve %s\n", replicas, topo->models.target.path.c_str());
    if (autoscaled) {
      std::fprintf(stderr, "specserve up: autoscaling %d..%d ready replica(s), warm pool %d, of %zu declared\n",
                   as.min_replicas, as.max_replicas, as.warm_pool, topo->replica_ids().size());
    }
    print_status_line(*client);
    std::fprintf(stderr, "specserve up: submit with: specserve client --connect %s --token-file %s --chat \"Hello\"\n",
                 endpoint.c_str(), topo->cluster.token_file.c_str());
    if (Status st = write_ready_file(o.ready_file, endpoint); !st.ok()) {
      std::fprintf(stderr, "specserve up: %s; stopping\n", st.message().c_str());
      failed = true;
    }
  }
  int rc = failed ? 1 : 0;
  while (!failed && !stop_requested()) {
    for (const auto& line : reap_children(&children)) get_logger("cluster")->warn("{}", line);
    // Every node process of this host gone (killed: their workers stop with them; or all their
    // workers stopped) and no node of another host declared: nothing can serve again. Stop, as
    // vLLM's server does when its engine dies, so a supervisor (systemd, Kubernetes) restarts the
    // whole cluster. Under the autoscaler up starts no node process: the launcher's workers are
    // its own children, and it starts them again on demand.
    if (!autoscaled && children.empty() && remote.empty()) {
      std::fprintf(stderr, "specserve up: every node process has exited and no node of another host is declared: "
                           "nothing can serve any more; stopping (exit 1)\n");
      (*head)->forget_restarts();  // requests waiting for a restart fail now, not after worker_restart_timeout_s
      rc = 1;
      break;
    }
    std::vector<std::string> exited;
    launcher.pump(endpoint, &exited);
    for (const auto& line : exited) {
      // A worker the autoscaler retired exits 0.
      if (line.find("exited with code 0") != std::string::npos) {
        get_logger("cluster")->info("{}", line);
      } else {
        get_logger("cluster")->warn("{}", line);
      }
    }
    wait_for_stop(autoscaled ? 0.05 : 0.2);
  }
  remove_ready_file(o.ready_file);  // no longer serving
  shut_down(**head, &children, failed ? 0 : o.drain_timeout_s, &front_end);
  stop_children(launcher.children(), 10.0);
  return rc;
}

int run_node(const NodeOptions& o) {
  install_stop_signals();
  if (o.exit_with_parent && !exit_with_parent()) return 0;
  auto topo = load_launched_topology(o.config_path);
  if (!topo.ok()) return fail("node", topo.status());
  const NodeSpec* node = nullptr;
  std::string names;
  for (const NodeSpec& n : topo->nodes) {
    if (n.name == o.name) node = &n;
    names += (names.empty() ? "" : ", ") + n.name;
  }
  if (!node) return fail("node", invalid_argument("--name '" + o.name + "': no such node in " + o.config_path + " (nodes: " + names + ")"));
  auto hp = parse_host_port(o.join, "--join");
  if (!hp.ok()) return fail("node", hp.status());
  const int32_t threads = o.threads_per_worker > 0 ? o.threads_per_worker
                                                   : default_threads(static_cast<int32_t>(node->workers.size()));
  std::vector<SupervisedWorker> workers;
  const bool tensor_parallel = topo->models.target.tensor_parallel_size > 1;
  for (size_t j = 0; j < node->workers.size(); ++j) {
    const WorkerSpec& w = node->workers[j];
    SupervisedWorker sw;
    sw.argv = {self_executable(), "worker", "--join", o.join, "--node", o.name, "--config",
               o.config_path, "--index", std::to_string(j), "--threads", std::to_string(threads)};
    // Passive OpenMP waits: workers share cores, and spinning threads starve each other.
    sw.env = {{"OMP_WAIT_POLICY", "PASSIVE"}};
    sw.name = "worker " + o.name + "/" + std::to_string(j) + " " + worker_role_name(w.role);
    sw.restartable = !(tensor_parallel && w.role == WorkerRole::kTargetShard);
    workers.push_back(std::move(sw));
  }
  NodeSupervisor sup(o.name, topo->autoscale.enabled() ? 0 : topo->scheduler.worker_restarts);
  if (Status st = sup.start(std::move(workers)); !st.ok()) {
    sup.stop(5);
    return fail("node", st);
  }
  get_logger("cluster")->info("node {}: {} worker process(es) started, joining {}{}", o.name, sup.running().size(), o.join,
                              topo->scheduler.worker_restarts > 0 && !topo->autoscale.enabled()
                                  ? " (a worker killed by a signal is restarted, up to " +
                                        std::to_string(topo->scheduler.worker_restarts) + " times)"
                                  : "");
  bool failed = false;
  while (!stop_requested() && !sup.done()) {
    sup.pump(&failed);
    wait_for_stop(0.2);
  }
  sup.stop(10.0);
  return failed ? 1 : 0;
}

int run_worker(const WorkerOptions& o) {
  install_stop_signals();
  // Workers are started by `specserve node`: they stop with it.
  if (!exit_with_parent()) return 0;
  auto topo = load_launched_topology(o.config_path);
  if (!topo.ok()) return fail_worker(topo.status());
  const NodeSpec* node = nullptr;
  for (const NodeSpec& n : topo->nodes) {
    if (n.name == o.node) node = &n;
  }
  if (!node) return fail_worker(invalid_argument("--node '" + o.node + "': no such node in " + o.config_path));
  if (o.index < 0 || o.index >= static_cast<int32_t>(node->workers.size())) {
    return fail_worker(invalid_argument("--index " + std::to_string(o.index) + ": node " + o.node + " has " +
                                        std::to_string(node->workers.size()) + " worker(s)"));
  }
  const WorkerSpec& spec = node->workers[static_cast<size_t>(o.index)];
  const size_t node_index = static_cast<size_t>(node - topo->nodes.data());
  const std::string device_path =
      "nodes[" + std::to_string(node_index) + "].workers[" + std::to_string(o.index) + "].device";
  if (Status st = check_device_available(topo->where(device_path) + ": " + device_path, spec.device.to_string()); !st.ok()) {
    return fail_worker(st);
  }
  // Before the model loads: every target-side worker of the topology computes in its one dtype.
  // A draft worker follows it where its device can (its arithmetic never changes the output:
  // verification is the target's), else keeps its default with a warning (a CPU draft beside a
  // float16 CUDA target, or a CPU without AMX beside a bfloat16 one).
  if (Status st = apply_compute_dtype(topo->models.target.dtype, spec.device.to_string(), "models.target.dtype");
      !st.ok()) {
    if (spec.role != WorkerRole::kDraftWorker) {
      return fail_worker(Status(st.code(), topo->where("models.target.dtype") + ": " + st.message()));
    }
    get_logger("cluster")->warn("draft worker on {}: {}; it keeps its default arithmetic", spec.device.to_string(),
                                st.message());
  }
  auto token = read_cluster_token(topo->cluster.token_file);
  if (!token.ok()) return fail_worker(token.status());
  auto hp = parse_host_port(o.join, "--join");
  if (!hp.ok()) return fail_worker(hp.status());
  ActorRuntime rt;
  caf::actor head;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.connect_timeout_s);
  std::string last_error;
  while (!head && std::chrono::steady_clock::now() < end && !stop_requested()) {
    auto h = connect_through_gateway(rt.system(), hp->first, hp->second, *token, std::chrono::seconds(10));
    if (h.ok()) {
      head = *h;
    } else if (h.status().code() == StatusCode::kInvalidArgument) {
      return fail_worker(invalid_argument("the head at " + h.status().message() + " (token file " +
                                          topo->cluster.token_file + ")"));
    } else {
      last_error = h.status().message();
      wait_for_stop(0.5);
    }
  }
  if (!head) return fail_worker(unavailable("cannot reach the head at " + o.join + ": " + last_error));
  WorkerConfig wc;
  wc.node = o.node;
  wc.role = spec.role;
  wc.replica = spec.replica;
  wc.rank = spec.rank;
  wc.device = spec.device;
  wc.gpu_memory_utilization = spec.gpu_memory_utilization;
  wc.gpu_memory_utilization_field =
      "nodes[" + std::to_string(node_index) + "].workers[" + std::to_string(o.index) + "].gpu_memory_utilization";
  wc.topology = *topo;
  wc.remote_draft = has_draft_worker(*topo, spec.replica);
  wc.threads = o.threads;
  wc.token = *token;
  wc.scheduler = head;
  caf::actor a;
  wc.tp_host = node->host;  // tensor-parallel ranks of one replica may sit on several hosts
  if (spec.role == WorkerRole::kTargetShard && spec.rank > 0) {
    a = spawn_tp_rank(rt.system(), wc);  // follows rank 0 of its replica (actors/tp_group.h)
  } else if (spec.role == WorkerRole::kTargetShard || spec.role == WorkerRole::kPrefillWorker) {
    if (spec.role == WorkerRole::kPrefillWorker) wc.remote_draft = false;  // a prefill worker does not speculate
    a = spawn_target_shard(rt.system(), wc);
  } else {
    wc.listen_host = node->host;
    a = spawn_draft_worker(rt.system(), wc);
  }
  // Runs until the actor quits (the head went away, or loading failed) or a stop signal.
  caf::scoped_actor self{rt.system()};
  self->monitor(a);
  bool done = false, failed = false, stopping = false, lost_head = false;
  auto stop_deadline = std::chrono::steady_clock::time_point::max();
  while (!done) {
    self->receive(
        [&](caf::down_msg& m) {
          done = true;
          // A worker that could not load quits with user_shutdown (its error is in the log and
          // in `specserve status`); one whose head went away quits normally.
          failed = !stopping && m.reason == caf::exit_reason::user_shutdown;
          // The head went away abnormally (not a shutdown): the node restarts this worker.
          lost_head = !stopping && m.reason == kLostHeadReason;
        },
        caf::after(std::chrono::milliseconds(200)) >> [&] {
          if (stopping && std::chrono::steady_clock::now() > stop_deadline) {
            caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
            stop_deadline = std::chrono::steady_clock::time_point::max();
          }
          if (stop_requested() && !stopping) {
            stopping = true;
            // A target shard stopping on its own (the rest of the cluster goes on) first moves
            // its running sequences, with their KV, to other replicas; the shard quits once
            // receivers have them. With no other replica ready its requests finish here first.
            // The head answers -1 when the whole cluster drains (then it stops at once).
            int32_t moving = -1;
            if (spec.role == WorkerRole::kTargetShard) {
              self->request(head, std::chrono::seconds(2), drain_rep_atom::value, *token, spec.replica, true, a)
                  .receive([&](int32_t n) { moving = n; }, [&](caf::error&) { moving = -1; });
            }
            if (moving >= 0) {
              // The head's log says which: moved with their KV, or finished here (no other replica).
              std::fprintf(stderr,
                           "specserve worker: stopping: %d request(s) of replica %d move to other replicas or finish here "
                           "first\n",
                           moving, spec.replica);
              // NOTE: a shard in the middle of a long step (a big prefill on a CPU) takes the migrate
              // message only after it; then receivers read its KV. Bounded, then it stops anyway.
              stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
            } else {
              caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
            }
          }
        });
  }
  if (lost_head) {
    std::fprintf(stderr, "specserve worker: lost the head at %s; exiting %d so that the node restarts this worker\n",
                 o.join.c_str(), kExitLostHead);
    return kExitLostHead;
  }
  return failed ? 1 : 0;
}

int run_serve(const ServeOptions& o) {
  install_stop_signals();
  const Topology& t = o.topology;
  if (Status tp = check_tensor_parallel_size(t); !tp.ok()) return fail("serve", tp);
  {
    // The target's device (its first shard's; cpu when none is declared) decides what the dtype
    // means; before anything listens, so a dtype this machine cannot run is plain bad input.
    std::string device = "cpu";
    bool found_device = false;
    for (const NodeSpec& n : t.nodes)
      for (const WorkerSpec& w : n.workers)
        if (!found_device && w.role == WorkerRole::kTargetShard && w.rank == 0) {
          device = w.device.to_string();
          found_device = true;
        }
    // `serve` maps the field to its flag (--dtype); a topology file to file:line:column.
    const std::string where = t.where("models.target.dtype");
    const std::string field = where.rfind("--", 0) == 0 ? where : "models.target.dtype";
    if (Status st = apply_compute_dtype(t.models.target.dtype, device, field); !st.ok()) {
      return fail("serve", field == where ? st : Status(st.code(), where + ": " + st.message()));
    }
  }
  Status ports = check_ports_free(t, /*include_http=*/static_cast<bool>(o.front_end));
  if (!ports.ok()) return fail("serve", ports);
  auto token = ensure_cluster_token(t.cluster.token_file);
  if (!token.ok()) return fail("serve", token.status());
  ActorRuntime rt;
  auto head = Head::start(rt, t, *token);
  if (!head.ok()) return fail("serve", head.status());
  std::shared_ptr<void> front_end;
  if (o.front_end) {
    auto fe = o.front_end(t, **head, rt, *token);
    if (!fe.ok()) {
      shut_down(**head, nullptr, 0, nullptr);
      return fail("serve", fe.status());
    }
    front_end = *fe;
  }
  WorkerConfig wc;
  wc.node = t.nodes.empty() ? "local" : t.nodes[0].name;
  wc.role = WorkerRole::kTargetShard;
  wc.topology = t;
  wc.threads = o.threads;
  // The topology's first target shard says where the model runs (cpu when none is declared).
  bool found = false;
  for (const NodeSpec& n : t.nodes)
    for (const WorkerSpec& w : n.workers)
      if (w.role == WorkerRole::kTargetShard && !found) {
        wc.device = w.device;
        wc.gpu_memory_utilization = w.gpu_memory_utilization;
        wc.gpu_memory_utilization_field = "gpu_memory_utilization (--gpu-memory-utilization)";
        found = true;
      }
  wc.token = *token;
  wc.scheduler = (*head)->scheduler();
  // A tensor-parallel target: its ranks are actors of this process, each with its share of the
  // CPU threads, meeting over loopback Gloo (actors/tp_group.h).
  get_logger("cluster")->info("serve: speculative {}", describe_speculative(t));
  const int32_t tp = t.models.target.tensor_parallel_size;
  if (tp > 1) {
    const int32_t cores = o.threads > 0 ? o.threads : static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    wc.threads = std::max(1, cores / tp);
    get_logger("cluster")->info("serve: {} tensor-parallel ranks as actors of this process, {} CPU thread(s) each", tp,
                                wc.threads);
    for (int32_t r = 1; r < tp; ++r) {
      WorkerConfig follower = wc;
      follower.rank = r;
      // Each rank on the device its worker names (serve: cuda:N+r).
      for (const NodeSpec& n : t.nodes)
        for (const WorkerSpec& w : n.workers)
          if (w.role == WorkerRole::kTargetShard && w.rank == r) follower.device = w.device;
      spawn_tp_rank(rt.system(), follower);
    }
  }
  spawn_target_shard(rt.system(), wc);
  const std::string endpoint = t.head.host + ":" + std::to_string((*head)->actor_port());
  auto client = Client::in_process(rt.system(), (*head)->scheduler(), *token);
  bool failed = false;
  remove_ready_file(o.ready_file);
  if (wait_ready(*client, 1, 1e9, &failed)) {
    std::fprintf(stderr, "specserve serve: ready on %s (token in %s)\n", endpoint.c_str(), t.cluster.token_file.c_str());
    print_status_line(*client);
    if (Status st = write_ready_file(o.ready_file, endpoint); !st.ok()) {
      std::fprintf(stderr, "specserve serve: %s; stopping\n", st.message().c_str());
      failed = true;
    }
  }
  while (!failed && !stop_requested()) wait_for_stop(0.2);
  remove_ready_file(o.ready_file);  // no longer serving
  shut_down(**head, nullptr, failed ? 0 : o.drain_timeout_s, &front_end);
  return failed ? 1 : 0;
}

}  // namespace specserve
