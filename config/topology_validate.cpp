// Topology validation: the cross-field checks TopologyParser runs once every field parsed
// (ranks cover tensor_parallel_size, the memory fractions of workers sharing a GPU, replicas,
// reachability of the head, autoscale bounds), and check_ports_free.
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "config/topology.h"
#include "config/topology_internal.h"

namespace specserve {
namespace topology_internal {

// ---- cross-field checks, run once every field parsed cleanly

void TopologyParser::check_topology(const std::optional<int32_t>& explicit_max_replicas) {
  const int32_t tp = topo_.models.target.tensor_parallel_size;
  const std::string tp_path = "models.target.tensor_parallel_size";
  const std::string tp_shown = quote(std::to_string(tp)) + (explicit_.count(tp_path) ? "" : " (default)");

  // Workers on one GPU share its memory, each within its gpu_memory_utilization; workers on the
  // same machine share its CPU.
  // NOTE: keyed by machine, not by node entry, so two node entries on one host (as in
  // examples/cluster-two-nodes.yaml) cannot between them give cuda:0 more than all of it.
  std::map<std::pair<std::string, std::string>, std::vector<DeviceUser>> device_users;
  // replica -> rank -> first worker path
  std::map<int32_t, std::map<int32_t, std::string>> shards;
  std::map<int32_t, std::string> other_workers;  // replica -> path of a draft/prefill worker
  std::map<int32_t, std::string> draft_workers;  // replica -> path of its draft worker
  std::map<int32_t, std::string> prefill_workers;  // replica -> path of its prefill worker
  for (size_t i = 0; i < topo_.nodes.size(); ++i) {
    const NodeSpec& node = topo_.nodes[i];
    for (size_t j = 0; j < node.workers.size(); ++j) {
      const WorkerSpec& w = node.workers[j];
      const std::string wp = "nodes[" + std::to_string(i) + "].workers[" + std::to_string(j) + "]";
      if (w.device.kind == DeviceKind::kCuda) {
        device_users[std::make_pair(host_key(node.host), w.device.to_string())].push_back(
            DeviceUser{wp, node.name, node.host, w.gpu_memory_utilization});
      }
      if (w.role == WorkerRole::kTargetShard) {
        auto [it, inserted] = shards[w.replica].emplace(w.rank, wp);
        if (!inserted) {
          const std::string rp = explicit_.count(wp + ".rank") ? wp + ".rank" : wp;
          error_at(topo_.where(rp), rp, "rank " + quote(std::to_string(w.rank)) + " of replica " +
                                            std::to_string(w.replica) + " is already taken by " + it->second);
        }
      } else {
        other_workers.emplace(w.replica, wp);
        if (w.role == WorkerRole::kDraftWorker || w.role == WorkerRole::kPrefillWorker) {
          // One of each per replica: the scheduler hands a replica's drafts to one draft worker
          // and its new prompts to one prefill worker.
          const std::string rp = explicit_.count(wp + ".role") ? wp + ".role" : wp;
          auto& seen = w.role == WorkerRole::kDraftWorker ? draft_workers : prefill_workers;
          auto [it, inserted] = seen.emplace(w.replica, wp);
          if (!inserted) {
            error_at(topo_.where(rp), rp, "replica " + quote(std::to_string(w.replica)) + " already has a " +
                                              worker_role_name(w.role) + ": " + it->second);
          }
          // A prefill worker ships whole KV blocks to decode replicas; a tensor-parallel decode
          // replica holds each block's KV heads split over its ranks and has no data plane for them.
          if (w.role == WorkerRole::kPrefillWorker && tp > 1) {
            error_at(topo_.where(rp), rp, "a prefill_worker needs models.target.tensor_parallel_size 1 (it is " +
                                              tp_shown + "): KV blocks split over tensor-parallel ranks cannot be shipped yet");
          }
          // Medusa and EAGLE draft from the target's hidden states, which stay in the target
          // shard's process (spec/proposer.h, Proposer::needs_hidden).
          const auto& sp = topo_.models.speculative;
          if (w.role == WorkerRole::kDraftWorker && sp &&
              (sp->method == SpeculativeMethod::kMedusa || sp->method == SpeculativeMethod::kEagle)) {
            error_at(topo_.where(rp), rp, "a draft_worker cannot run models.speculative.method " +
                                              quote(speculative_method_name(sp->method)) +
                                              ": it drafts from the target's hidden states, which only the target_shard has; "
                                              "remove the draft_worker (the target_shard then runs the proposer itself)");
          }
        }
      }
    }
  }
  for (const auto& [key, users] : device_users) check_device_share(key.second, users);
  if (shards.empty()) {
    error_at(topo_.where("nodes"), "nodes",
             "no target_shard worker: a replica needs models.target.tensor_parallel_size " + tp_shown +
                 " target_shard workers (ranks 0.." + std::to_string(tp - 1) + ")");
  }
  for (const auto& [replica, ranks] : shards) {
    if (tp_invalid_ || static_cast<int32_t>(ranks.size()) == tp) continue;  // a refused size: its own error
    std::string have, lack;
    for (const auto& [r, p] : ranks) have += (have.empty() ? "" : ", ") + std::to_string(r);
    for (int32_t r = 0; r < tp; ++r) {
      if (!ranks.count(r)) lack += (lack.empty() ? "" : ", ") + std::to_string(r);
    }
    error_at(topo_.where(tp_path), tp_path,
             tp_shown + " but replica " + std::to_string(replica) + " has " + std::to_string(ranks.size()) +
                 " target_shard worker(s) (ranks " + have + "); missing rank(s) " + lack);
  }
  for (const auto& [replica, wp] : other_workers) {
    if (!shards.count(replica)) {
      const std::string rp = explicit_.count(wp + ".replica") ? wp + ".replica" : wp;
      error_at(topo_.where(rp), rp, "replica " + quote(std::to_string(replica)) + " has no target_shard worker");
    }
  }

  // Remote nodes must be able to reach the head.
  for (size_t i = 0; i < topo_.nodes.size(); ++i) {
    const NodeSpec& node = topo_.nodes[i];
    if (!is_loopback_host(node.host) && is_loopback_host(topo_.head.host)) {
      const std::string p = "nodes[" + std::to_string(i) + "].host";
      topo_.notes.push_back(topo_.where(p) + ": " + p + ": " + quote(node.host) + " is not loopback but head.host " +
                            quote(topo_.head.host) + " is: a node on another machine cannot join this head");
    }
  }

  AutoscaleSpec& a = topo_.autoscale;
  const int32_t declared = static_cast<int32_t>(shards.size());
  if (explicit_max_replicas) {
    a.max_replicas = *explicit_max_replicas;
    // NOTE: the warm pool's standby replicas are declared too (their devices are placed), so a
    // topology may declare up to max_replicas + warm_pool replicas.
    // NOTE: sums in 64 bits: max_replicas + warm_pool overflowed int32 (2147483647 gave nonsense).
    if (declared > int64_t{a.max_replicas} + a.warm_pool) {
      error_at(topo_.where("autoscale.max_replicas"), "autoscale.max_replicas",
               quote(std::to_string(a.max_replicas)) + " is less than the " + std::to_string(declared) +
                   " replicas the nodes declare" +
                   (a.warm_pool ? " (less autoscale.warm_pool " + std::to_string(a.warm_pool) + ")" : std::string()) +
                   (a.enabled() ? ": the replicas beyond max_replicas + warm_pool would never be used"
                                : ": with max_replicas == min_replicas and no warm_pool the autoscaler is off and every "
                                  "declared replica serves") +
                   "; raise max_replicas or declare fewer replicas");
    }
  } else {
    // The warm pool's replicas are among the declared ones: they are not counted as routable.
    a.max_replicas = std::max(a.min_replicas, std::max(declared - a.warm_pool, 1));
  }
  // The autoscaler places replicas only where the topology declares their workers (and so their
  // devices): the min_replicas ready replicas and the warm_pool standby ones must all be
  // placeable, or the cluster can never reach its floor. Fewer than max_replicas + warm_pool
  // is allowed (the top of the range stays out of reach), with a note logged at `up`.
  // Without the autoscaler too (min_replicas == max_replicas and no warm pool: every declared
  // replica serves), a floor above the declared count is a mistake (it was taken silently).
  if (a.configured && !shards.empty() && declared < int64_t{a.min_replicas} + a.warm_pool) {
    const std::string field = a.min_replicas > declared || a.warm_pool == 0 ? "autoscale.min_replicas" : "autoscale.warm_pool";
    error_at(topo_.where(field), field,
             "autoscale.min_replicas " + quote(std::to_string(a.min_replicas)) + " + autoscale.warm_pool " +
                 quote(std::to_string(a.warm_pool)) + " need " + std::to_string(int64_t{a.min_replicas} + a.warm_pool) +
                 " replicas but the nodes declare only " + std::to_string(declared) +
                 " replica(s): declare each replica's workers under nodes[].workers, or lower min_replicas / warm_pool");
  } else if (a.enabled() && !shards.empty() && declared < int64_t{a.max_replicas} + a.warm_pool) {
    const std::string where = topo_.where(explicit_max_replicas ? "autoscale.max_replicas" : "autoscale");
    const int32_t full_up_to = std::max(0, declared - a.warm_pool);  // ready replicas with the pool still full
    std::string what;
    if (a.warm_pool == 0) {
      what = "at most " + std::to_string(declared) + " can be ready (declare more replicas to reach max_replicas)";
    } else if (full_up_to == 0) {
      what = "the pool is full only while no replica is ready: its standby replicas are promoted and it is not refilled "
             "(declare more replicas to keep a warm pool)";
    } else {
      what = "with up to " + std::to_string(full_up_to) + " ready the pool stays full; beyond that its standby replicas are "
             "promoted and the pool is not refilled (declare more replicas to keep a warm pool at max_replicas)";
    }
    topo_.notes.push_back(where + ": autoscale.max_replicas " + quote(std::to_string(a.max_replicas)) +
                          (explicit_max_replicas ? "" : " (the default: max(min_replicas, declared replicas - warm_pool, 1))") +
                          " + autoscale.warm_pool " + quote(std::to_string(a.warm_pool)) + " want " +
                          std::to_string(int64_t{a.max_replicas} + a.warm_pool) + " replicas but the nodes declare " +
                          std::to_string(declared) + ": " + what);
  }
  if (a.enabled() && topo_.scheduler.worker_restarts > 0) {
    topo_.notes.push_back(topo_.where("scheduler.worker_restarts") + ": scheduler.worker_restarts " +
                          quote(std::to_string(topo_.scheduler.worker_restarts)) +
                          " is ignored: with the autoscaler, it starts replicas in place of dead ones");
  } else if (topo_.scheduler.worker_restarts > 0 && topo_.models.target.tensor_parallel_size > 1) {
    // NOTE: a killed rank's requests failed naming worker_restart_timeout_s, never waited for.
    topo_.notes.push_back(topo_.where("scheduler.worker_restarts") + ": scheduler.worker_restarts " +
                          quote(std::to_string(topo_.scheduler.worker_restarts)) +
                          " restarts draft workers only: the ranks of a tensor-parallel target "
                          "(models.target.tensor_parallel_size " +
                          std::to_string(topo_.models.target.tensor_parallel_size) +
                          ") are never restarted, and a dead rank fails its replica");
  }
}

void TopologyParser::check_device_share(const std::string& device, const std::vector<DeviceUser>& users) {
  if (users.size() < 2) return;
  double sum = 0;
  std::string listed;
  for (const DeviceUser& u : users) {
    sum += u.gpu_memory_utilization;
    const bool set = explicit_.count(u.path + ".gpu_memory_utilization") > 0;
    listed += (listed.empty() ? "" : " + ") + u.path + " (node " + quote(u.node) + ") " +
              quote(fraction_text(u.gpu_memory_utilization)) + (set ? "" : " (default)");
  }
  // A small tolerance: 0.3 + 0.7 is 1.0000000000000002 in binary.
  if (sum <= 1.0 + 1e-9) return;
  const DeviceUser& last = users.back();
  const std::string field = explicit_.count(last.path + ".gpu_memory_utilization") ? last.path + ".gpu_memory_utilization"
                                                                                    : last.path + ".device";
  error_at(topo_.where(field), field,
           quote(device) + " on host " + quote(last.host) + " is shared by " + listed + ": gpu_memory_utilization sums to " +
               fraction_text(sum) + " > 1. Workers sharing a GPU each use their own fraction of its total memory; give "
               "each one a gpu_memory_utilization so that they sum to at most 1 (e.g. 0.6 for the target_shard and 0.3 "
               "for the draft_worker), or give each its own device");
}

}  // namespace topology_internal

using topology_internal::quote;

// ---------------------------------------------------------------- ports

Status check_ports_free(const Topology& topology, bool include_http) {
  const HeadSpec& head = topology.head;
  std::string problems;
  StatusCode code = StatusCode::kOk;
  std::vector<std::pair<std::string, int32_t>> ports = {{"head.actor_port", head.actor_port}};
  if (include_http) ports.emplace_back("head.http_port", head.http_port);
  for (const auto& [field, port] : ports) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string service = std::to_string(port);
    const int gai = getaddrinfo(head.host.c_str(), service.c_str(), &hints, &res);
    auto add = [&](StatusCode c, const std::string& where, const std::string& text) {
      if (code == StatusCode::kOk) code = c;
      problems += (problems.empty() ? "" : "\n") + where + ": " + text;
    };
    if (gai != 0) {
      add(StatusCode::kInvalidArgument, topology.where("head.host"),
          "head.host: " + quote(head.host) + " does not resolve: " + gai_strerror(gai));
      break;
    }
    int err = 0;
    const int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
    if (fd < 0) {
      err = errno;
    } else {
      // SO_REUSEADDR as the servers will set it: a port left in TIME_WAIT is free, a listener is not.
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
      ::close(fd);
      if (err == EADDRINUSE) {
        // NOTE: cpp-httplib listens with SO_REUSEPORT only, and the TIME_WAIT connections a
        // stopped HTTP server leaves keep that option: Linux then refuses SO_REUSEADDR alone for
        // about a minute although nothing listens. With SO_REUSEPORT the bind succeeds; whether
        // something really listens is then asked with a connect.
        const int fd2 = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
        if (fd2 >= 0) {
          ::setsockopt(fd2, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
          ::setsockopt(fd2, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
          const bool bound = ::bind(fd2, res->ai_addr, res->ai_addrlen) == 0;
          ::close(fd2);
          if (bound) {
            const int probe = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
            const bool listening = probe >= 0 && ::connect(probe, res->ai_addr, res->ai_addrlen) == 0;
            if (probe >= 0) ::close(probe);
            if (!listening) err = 0;
          }
        }
      }
    }
    freeaddrinfo(res);
    if (err == 0) continue;
    const char* name = strerrorname_np(err);
    std::string why = std::string(name ? name : "errno " + std::to_string(err)) + ", " + std::strerror(err);
    if (err == EADDRINUSE) {
      why = "already in use (" + why + "): another process listens there; stop it or pick another port";
    }
    if (err == EADDRNOTAVAIL) why = "cannot bind (" + why + "): head.host is not an address of this machine";
    if (err == EACCES) why = "cannot bind (" + why + "): ports below 1024 need privileges";
    add(StatusCode::kUnavailable, topology.where(field),
        field + ": " + quote(std::to_string(port)) + " on " + head.host + ": " + why);
  }
  if (code == StatusCode::kOk) return Status();
  return Status(code, problems);
}

}  // namespace specserve
