// Topology parsing, the `nodes:` section: each node's name, host and devices, and its workers
// (role, model, replica, rank, device, gpu_memory_utilization). Split from topology_parse.cpp,
// which walks the other sections; the cross-field checks are in topology_validate.cpp.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <map>
#include <set>
#include <string>

#include "config/topology.h"
#include "config/topology_internal.h"

namespace specserve {
namespace topology_internal {

void TopologyParser::parse_nodes(const YAML::Node& n) {
  record("nodes", n);
  if (!n.IsSequence() || n.size() == 0) {
    error(n, "nodes", "expected a non-empty sequence of nodes ({name, host, devices, workers}), got " + describe(n));
    return;
  }
  std::map<std::string, std::string> names;  // name -> path of its first use
  for (size_t i = 0; i < n.size(); ++i) {
    const std::string path = "nodes[" + std::to_string(i) + "]";
    record(path, n[i]);
    NodeSpec node;
    parse_node(n[i], path, &node);
    if (!node.name.empty()) {
      auto [it, inserted] = names.emplace(node.name, path);
      if (!inserted) {
        error_at(topo_.where(path + ".name"), path + ".name",
                 quote(node.name) + " is already the name of " + it->second);
      }
    }
    topo_.nodes.push_back(std::move(node));
  }
}

void TopologyParser::parse_node(const YAML::Node& n, const std::string& path, NodeSpec* node) {
  Fields f(*this, n, path, {"name", "host", "devices", "workers"});
  if (!f.is_map()) return;
  if (auto name = read_name(f, true)) node->name = *name;
  if (auto h = read_host(f, "host")) node->host = *h;
  if (const YAML::Node* d = f.get("devices")) {
    record(f.path("devices"), *d);
    if (!d->IsSequence() || d->size() == 0) {
      error(*d, f.path("devices"),
            "expected a non-empty sequence of devices ([cpu, cuda:0, ...]), got " + describe(*d));
    } else {
      for (size_t j = 0; j < d->size(); ++j) {
        const YAML::Node e = (*d)[j];
        const std::string dp = f.path("devices") + "[" + std::to_string(j) + "]";
        record(dp, e);
        if (!e.IsScalar()) {
          error(e, dp, "expected a device (cpu or cuda:N), got " + describe(e));
          continue;
        }
        auto dev = parse_device(e.Scalar());
        if (!dev.ok()) {
          error(e, dp, dev.status().message());
          continue;
        }
        if (std::find(node->devices.begin(), node->devices.end(), *dev) != node->devices.end()) {
          error(e, dp, quote(e.Scalar()) + " is listed twice");
          continue;
        }
        node->devices.push_back(*dev);
      }
    }
  } else {
    missing(f, "devices", "the devices this node offers, e.g. [cpu] or [cuda:0, cuda:1]");
  }
  if (const YAML::Node* w = f.get("workers")) {
    record(f.path("workers"), *w);
    if (!w->IsSequence()) {
      error(*w, f.path("workers"), "expected a sequence of workers ({role, device, ...}), got " + describe(*w));
      return;
    }
    for (size_t j = 0; j < w->size(); ++j) {
      const std::string wp = f.path("workers") + "[" + std::to_string(j) + "]";
      record(wp, (*w)[j]);
      WorkerSpec spec;
      parse_worker((*w)[j], wp, *node, &spec);
      node->workers.push_back(spec);
    }
  }
}

void TopologyParser::parse_worker(const YAML::Node& n, const std::string& path, const NodeSpec& node, WorkerSpec* w) {
  Fields f(*this, n, path, {"role", "model", "replica", "rank", "device", "gpu_memory_utilization"});
  if (!f.is_map()) return;
  bool role_ok = false;
  if (const YAML::Node* r = scalar(f, "role", "a string", true)) {
    static const std::map<std::string, WorkerRole> kByName = {{"target_shard", WorkerRole::kTargetShard},
                                                              {"draft_worker", WorkerRole::kDraftWorker},
                                                              {"prefill_worker", WorkerRole::kPrefillWorker}};
    auto it = kByName.find(r->Scalar());
    if (it == kByName.end()) {
      error(*r, f.path("role"), quote(r->Scalar()) + " is not one of target_shard, draft_worker, prefill_worker");
    } else {
      w->role = it->second;
      role_ok = true;
    }
  }
  if (const YAML::Node* d = scalar(f, "device", "a device (cpu or cuda:N)", true)) {
    auto dev = parse_device(d->Scalar());
    if (!dev.ok()) {
      error(*d, f.path("device"), dev.status().message());
    } else {
      w->device = *dev;
      // Checked here, against this node's own list, so the message can name both.
      if (!node.devices.empty() && std::find(node.devices.begin(), node.devices.end(), *dev) == node.devices.end()) {
        std::string listed;
        for (const auto& nd : node.devices) listed += (listed.empty() ? "" : ", ") + nd.to_string();
        const std::string node_path = path.substr(0, path.find(".workers"));
        error(*d, f.path("device"), quote(d->Scalar()) + " is not in " + node_path + ".devices [" + listed + "]");
      }
    }
  }
  if (auto r = read_int(f, "replica", 0, INT32_MAX, false)) w->replica = static_cast<int32_t>(*r);
  // vLLM's gpu_memory_utilization: a fraction of the device's total memory, in (0, 1].
  if (auto u = read_double(f, "gpu_memory_utilization", std::numeric_limits<double>::lowest(), false)) {
    const YAML::Node& at = *f.get("gpu_memory_utilization");
    if (*u <= 0 || *u > 1) {
      error(at, f.path("gpu_memory_utilization"),
            quote(at.Scalar()) + " must be in (0, 1]: the fraction of the device's total memory this worker may use");
    } else {
      w->gpu_memory_utilization = *u;
      if (w->device.kind == DeviceKind::kCpu && f.get("device")) {
        topo_.notes.push_back(loc(at.Mark()) + ": " + f.path("gpu_memory_utilization") + ": " + quote(at.Scalar()) +
                              " is ignored on device 'cpu' (it sizes the KV cache of cuda:N workers only)");
      }
    }
  }
  if (!role_ok) return;

  const int32_t tp = topo_.models.target.tensor_parallel_size;
  if (w->role == WorkerRole::kTargetShard) {
    if (auto r = read_int(f, "rank", 0, tp_invalid_ ? 1023 : tp - 1, false)) {
      w->rank = static_cast<int32_t>(*r);
    } else if (!f.get("rank") && tp > 1) {
      missing(f, "rank", "models.target.tensor_parallel_size is " + std::to_string(tp) +
                             ": each target_shard needs a rank in 0.." + std::to_string(tp - 1));
    }
  } else if (const YAML::Node* r = f.get("rank")) {
    error(*r, f.path("rank"),
          "applies only to role target_shard, not " + quote(worker_role_name(w->role)) + "; got " + describe(*r));
  }
  const std::string want = w->role == WorkerRole::kDraftWorker ? "speculative" : "target";
  if (auto m = read_string(f, "model", false)) {
    if (*m != want) {
      error(*f.get("model"), f.path("model"), "a " + std::string(worker_role_name(w->role)) + " runs models." + want +
                                                  ", got " + quote(*m));
    }
  }
  w->model = want;
  if (w->role == WorkerRole::kDraftWorker && !topo_.models.speculative) {
    error(*f.get("role"), f.path("role"), "'draft_worker' needs models.speculative, which is not set");
  }
}

}  // namespace topology_internal
}  // namespace specserve
