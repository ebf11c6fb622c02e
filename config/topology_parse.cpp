// Topology parsing: yaml-cpp builds the node tree; TopologyParser walks it section by section
// (here; the nodes in topology_parse_nodes.cpp, the typed field readers in
// topology_parse_fields.cpp), records every problem with its mark, then runs the cross-field
// checks (topology_validate.cpp). See the exception NOTE in topology.cpp.
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "config/topology.h"
#include "config/topology_internal.h"

namespace specserve {
namespace topology_internal {

namespace fs = std::filesystem;

// ---- sections

void TopologyParser::parse_cluster(const YAML::Node& n) {
  Fields f(*this, n, "cluster", {"name", "token_file"});
  if (auto name = read_name(f, false)) topo_.cluster.name = *name;
  std::string raw = "~/.config/specserve/token";
  if (auto t = read_string(f, "token_file", false)) raw = *t;
  bool ok = false;
  std::string abs = resolve_path(raw, f.get("token_file") ? *f.get("token_file") : n, f.path("token_file"), &ok);
  if (ok) topo_.cluster.token_file = abs;
}

void TopologyParser::parse_head(const YAML::Node& n) {
  Fields f(*this, n, "head", {"host", "actor_port", "http_port"});
  if (auto h = read_host(f, "host")) topo_.head.host = *h;
  if (auto p = read_int(f, "actor_port", 1, 65535, false)) topo_.head.actor_port = static_cast<int32_t>(*p);
  if (auto p = read_int(f, "http_port", 1, 65535, false)) topo_.head.http_port = static_cast<int32_t>(*p);
  if (topo_.head.actor_port == topo_.head.http_port) {
    const YAML::Node* at = f.get("http_port") ? f.get("http_port") : (f.get("actor_port") ? f.get("actor_port") : &n);
    error(*at, "head.http_port",
          quote(std::to_string(topo_.head.http_port)) + " is also head.actor_port: the two must differ");
  }
}

void TopologyParser::parse_models(const YAML::Node& n) {
  Fields f(*this, n, "models", {"target", "speculative"});
  if (!f.is_map()) return;
  if (const YAML::Node* t = f.get("target")) {
    parse_target(*t);
  } else {
    missing(f, "target", "the model every replica serves: {path, tensor_parallel_size}");
  }
  if (const YAML::Node* s = f.get("speculative")) parse_speculative(*s);
}

void TopologyParser::parse_target(const YAML::Node& n) {
  Fields f(*this, n, "models.target", {"path", "tensor_parallel_size", "max_model_len", "dtype"});
  if (!f.is_map()) return;
  if (auto p = read_model_path(f, "path", true)) topo_.models.target.path = *p;
  if (auto tp = read_int(f, "tensor_parallel_size", 1, 1024, false)) {
    topo_.models.target.tensor_parallel_size = static_cast<int32_t>(*tp);
  } else if (f.get("tensor_parallel_size")) {
    tp_invalid_ = true;  // the workers' ranks are then not checked against it (one error, not two)
  }
  // 2 at least: a context of 1 token leaves no room for a completion (and for the warm-up).
  if (auto m = read_int(f, "max_model_len", 2, INT32_MAX, false)) {
    topo_.models.target.max_model_len = static_cast<int32_t>(*m);
  }
  if (const YAML::Node* d = scalar(f, "dtype", "a string", false)) {
    auto dtype = parse_compute_dtype(d->Scalar(), "dtype");
    if (dtype.ok()) {
      topo_.models.target.dtype = *dtype;
    } else {
      error(*d, f.path("dtype"), quote(d->Scalar()) + " is not one of auto, float32, float, bfloat16, float16, half");
    }
  }
}

void TopologyParser::parse_speculative(const YAML::Node& n) {
  Fields f(*this, n, "models.speculative",
           {"method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "num_layers",
            "disable_by_batch_size", "disable_by_goodput", "draft_tensor_parallel_size", "adaptive_k", "speculative_token_tree", "eagle_topk",
            "eagle_depth", "draft_vocab_size", "draft_p_min", "typical_acceptance", "posterior_threshold", "posterior_alpha", "max_model_len",
            "lookup_cached_requests"});
  if (!f.is_map()) return;
  SpeculativeSpec s;
  bool method_ok = false;
  static const char* kMethods = "ngram, draft_model, layer_skip, medusa, eagle";
  if (const YAML::Node* m = scalar(f, "method", "a string", false)) {
    static const std::map<std::string, SpeculativeMethod> kByName = {
        {"ngram", SpeculativeMethod::kNgram},         {"draft_model", SpeculativeMethod::kDraftModel},
        {"layer_skip", SpeculativeMethod::kLayerSkip}, {"medusa", SpeculativeMethod::kMedusa},
        {"eagle", SpeculativeMethod::kEagle}};
    auto it = kByName.find(m->Scalar());
    if (it == kByName.end()) {
      error(*m, f.path("method"), quote(m->Scalar()) + " is not one of " + kMethods);
    } else {
      s.method = it->second;
      method_ok = true;
    }
  } else if (!f.get("method")) {
    missing(f, "method", std::string("one of ") + kMethods);
  }
  if (auto k = read_int(f, "num_speculative_tokens", 1, 64, true)) s.num_speculative_tokens = static_cast<int32_t>(*k);
  const auto lmin = read_int(f, "prompt_lookup_min", 1, INT32_MAX, false);
  const auto lmax = read_int(f, "prompt_lookup_max", 1, INT32_MAX, false);
  const auto layers = read_int(f, "num_layers", 1, INT32_MAX, false);
  if (auto d = read_int(f, "disable_by_batch_size", 1, INT32_MAX, false)) {
    s.disable_by_batch_size = static_cast<int32_t>(*d);
  }
  if (auto d = read_int(f, "draft_tensor_parallel_size", 1, 1024, false)) {
    // As vLLM's flag; a draft worker runs its model unsplit (the CLI's --speculative-config
    // refuses other values too).
    if (*d != 1) {
      error(*f.get("draft_tensor_parallel_size"), f.path("draft_tensor_parallel_size"),
            quote(std::to_string(*d)) + ": only 1 is supported (the draft model is not split)");
    }
    s.draft_tensor_parallel_size = static_cast<int32_t>(*d);
  }
  if (auto v = read_int(f, "max_model_len", 1, INT32_MAX, false)) s.max_model_len = static_cast<int32_t>(*v);
  if (auto a = read_bool(f, "adaptive_k")) s.adaptive_k = *a;
  if (auto g = read_bool(f, "disable_by_goodput")) s.disable_by_goodput = *g;
  if (auto a = read_bool(f, "typical_acceptance")) s.typical_acceptance = *a;
  for (const char* key : {"posterior_threshold", "posterior_alpha"}) {
    const bool is_threshold = std::string(key) == "posterior_threshold";
    auto v = read_double(f, key, 0, false);
    if (!v) continue;
    if ((is_threshold && *v == 0) || *v > 1) {
      error(*f.get(key), f.path(key), quote(f.get(key)->Scalar()) + " must be in " + (is_threshold ? "(0, 1]" : "[0, 1]"));
      continue;
    }
    if (is_threshold && static_cast<float>(*v) == 0.0f) {  // the engine holds a 32-bit float
      error(*f.get(key), f.path(key), quote(f.get(key)->Scalar()) + " is 0 as a 32-bit float (the engine's type); must be in (0, 1]");
      continue;
    }
    (is_threshold ? s.posterior_threshold : s.posterior_alpha) = static_cast<float>(*v);
  }
  // vLLM's defaults: both 5 when neither is given; one given sets the other.
  if (lmin) s.prompt_lookup_min = static_cast<int32_t>(*lmin);
  if (lmax) s.prompt_lookup_max = static_cast<int32_t>(*lmax);
  if (lmin && !lmax) s.prompt_lookup_max = s.prompt_lookup_min;
  if (lmax && !lmin) s.prompt_lookup_min = s.prompt_lookup_max;
  if (layers) s.num_layers = static_cast<int32_t>(*layers);
  if (auto t = read_string(f, "speculative_token_tree", false)) s.speculative_token_tree = *t;
  if (auto v = read_int(f, "eagle_topk", 1, 64, false)) s.eagle_topk = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "eagle_depth", 1, 64, false)) s.eagle_depth = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "draft_vocab_size", 0, INT32_MAX, false)) s.draft_vocab_size = static_cast<int32_t>(*v);
  const auto cached = read_int(f, "lookup_cached_requests", 0, 10000, false);
  if (cached) s.lookup_cached_requests = static_cast<int32_t>(*cached);
  if (auto v = read_double(f, "draft_p_min", std::numeric_limits<double>::lowest(), false)) {
    if (*v < 0 || *v > 1) {
      error(*f.get("draft_p_min"), f.path("draft_p_min"), quote(f.get("draft_p_min")->Scalar()) + " must be in [0, 1]");
    } else {
      s.draft_p_min = static_cast<float>(*v);
    }
  }
  if (!method_ok) return;  // the method-specific checks below would only echo that error

  const std::string method = quote(speculative_method_name(s.method));
  const bool needs_model = s.method == SpeculativeMethod::kDraftModel || s.method == SpeculativeMethod::kMedusa ||
                           s.method == SpeculativeMethod::kEagle;
  if (needs_model) {
    if (f.get("model")) {
      if (auto p = read_model_path(f, "model", true)) s.model = *p;
    } else {
      missing(f, "model", "method " + method + " needs the draft / head model's GGUF path");
    }
  } else if (const YAML::Node* m = f.get("model")) {
    error(*m, f.path("model"), "method " + method + " takes no model, got " + describe(*m));
  }
  // Given with a model-based method, the lookup runs first (spec/lookup_first_proposer.h).
  if (s.method != SpeculativeMethod::kNgram && (lmin || lmax)) s.lookup_first = true;
  if (cached && *cached > 0 && s.method != SpeculativeMethod::kNgram && !s.lookup_first) {
    error(*f.get("lookup_cached_requests"), f.path("lookup_cached_requests"),
          "applies to method 'ngram' or with prompt_lookup_min / prompt_lookup_max (prompt lookup first), not to " + method +
              " alone; got " + describe(*f.get("lookup_cached_requests")));
  }
  if ((lmin || lmax) && s.prompt_lookup_min > s.prompt_lookup_max) {
    const std::string key = lmax ? "prompt_lookup_max" : "prompt_lookup_min";
    error(*f.get(key), f.path(key),
          "prompt_lookup_min " + quote(std::to_string(s.prompt_lookup_min)) + (lmin ? "" : " (default)") +
              " is greater than prompt_lookup_max " + quote(std::to_string(s.prompt_lookup_max)) +
              (lmax ? "" : " (default)") + ": need 1 <= min <= max");
  }
  if (s.method != SpeculativeMethod::kLayerSkip) {
    if (const YAML::Node* v = f.get("num_layers")) {
      error(*v, f.path("num_layers"), "applies only to method 'layer_skip', not " + method + "; got " + describe(*v));
    }
  }
  // Trees: static trees for the head methods; the dynamic tree's knobs for eagle only, and not
  // beside a static tree (which replaces the dynamic one).
  const bool head_method = s.method == SpeculativeMethod::kMedusa || s.method == SpeculativeMethod::kEagle;
  for (const char* key : {"speculative_token_tree", "draft_vocab_size"}) {
    if (const YAML::Node* v = f.get(key); v && !head_method) {
      error(*v, f.path(key), "applies only to methods 'medusa' and 'eagle', not " + method + "; got " + describe(*v));
    }
  }
  if (const YAML::Node* v = f.get("speculative_token_tree"); v && head_method && s.speculative_token_tree.empty()) {
    error(*v, f.path("speculative_token_tree"), "is empty: give a tree such as \"[(0,), (0, 0)]\" or leave the key out");
  }
  if (const YAML::Node* v = f.get("draft_p_min"); v && s.method == SpeculativeMethod::kNgram) {
    error(*v, f.path("draft_p_min"), "does not apply to method 'ngram' (its drafts have no probabilities); got " + describe(*v));
  }
  for (const char* key : {"eagle_topk", "eagle_depth"}) {
    const YAML::Node* v = f.get(key);
    if (!v) continue;
    if (s.method != SpeculativeMethod::kEagle) {
      error(*v, f.path(key), "applies only to method 'eagle', not " + method + "; got " + describe(*v));
    } else if (!s.speculative_token_tree.empty()) {
      error(*v, f.path(key), "sets eagle's dynamic tree, but speculative_token_tree " + quote(s.speculative_token_tree) +
                                 " gives a static one; got " + describe(*v));
    }
  }
  topo_.models.speculative = s;
}

void TopologyParser::parse_scheduler(const YAML::Node& n) {
  Fields f(*this, n, "scheduler",
           {"max_num_seqs", "max_num_batched_tokens", "block_size", "kv_cache_bytes", "enable_prefix_caching",
            "rebalance_running", "worker_restarts", "worker_restart_timeout_s"});
  SchedulerSpec& s = topo_.scheduler;
  if (auto v = read_int(f, "max_num_seqs", 1, INT32_MAX, false)) s.max_num_seqs = static_cast<int32_t>(*v);
  const auto batched = read_int(f, "max_num_batched_tokens", 1, INT32_MAX, false);
  if (batched) s.max_num_batched_tokens = static_cast<int32_t>(*batched);
  if (auto v = read_int(f, "block_size", 1, 1024, false)) s.block_size = static_cast<int32_t>(*v);
  if (auto v = read_byte_size(f, "kv_cache_bytes")) s.kv_cache_bytes = *v;
  if (auto v = read_bool(f, "enable_prefix_caching")) s.enable_prefix_caching = *v;
  if (auto v = read_bool(f, "rebalance_running")) s.rebalance_running = *v;
  if (auto v = read_int(f, "worker_restarts", 0, 100, false)) s.worker_restarts = static_cast<int32_t>(*v);
  if (auto v = read_double(f, "worker_restart_timeout_s", 0, false)) {
    if (*v > 1e6) {
      error(*f.get("worker_restart_timeout_s"), "scheduler.worker_restart_timeout_s",
            quote(f.get("worker_restart_timeout_s")->Scalar()) + " must be in [0, 1e6] seconds");
    } else {
      s.worker_restart_timeout_s = *v;
    }
  }
  if (s.max_num_batched_tokens < s.max_num_seqs) {
    const YAML::Node* at =
        batched ? f.get("max_num_batched_tokens") : (f.get("max_num_seqs") ? f.get("max_num_seqs") : &n);
    error(*at, "scheduler.max_num_batched_tokens",
          quote(std::to_string(s.max_num_batched_tokens)) + " is less than max_num_seqs " +
              quote(std::to_string(s.max_num_seqs)) + ": every running sequence needs at least one token per step");
  }
}

void TopologyParser::parse_autoscale(const YAML::Node& n, std::optional<int32_t>* max_replicas) {
  Fields f(*this, n, "autoscale",
           {"min_replicas", "max_replicas", "warm_pool", "upscale_delay_s", "downscale_delay_s",
            "target_ongoing_requests", "ttft_slo_ms", "target_kv_cache_usage", "look_back_period_s",
            "new_replica_grace_s", "start_timeout_s", "start_backoff_s", "start_backoff_max_s"});
  AutoscaleSpec& a = topo_.autoscale;
  a.configured = true;
  if (auto v = read_int(f, "min_replicas", 0, INT32_MAX, false)) a.min_replicas = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "max_replicas", 1, INT32_MAX, false)) *max_replicas = static_cast<int32_t>(*v);
  if (auto v = read_int(f, "warm_pool", 0, INT32_MAX, false)) a.warm_pool = static_cast<int32_t>(*v);
  // Every duration is bounded as start_timeout_s is (1e300 was taken; -3 said ">= 0" where 0 then
  // said "(0, 1e9]"): one range per field, named whatever the value.
  auto in_range = [&](const std::string& key, double* out, bool zero_ok, double max, const std::string& range) {
    auto v = read_double(f, key, -std::numeric_limits<double>::infinity(), false);
    if (!v) return;
    if (*v < 0 || (*v == 0 && !zero_ok) || *v > max) {
      error(*f.get(key), "autoscale." + key, quote(f.get(key)->Scalar()) + " must be in " + range);
      return;
    }
    *out = *v;
  };
  in_range("upscale_delay_s", &a.upscale_delay_s, true, 1e9, "[0, 1e9] seconds");
  in_range("downscale_delay_s", &a.downscale_delay_s, true, 1e9, "[0, 1e9] seconds");
  in_range("ttft_slo_ms", &a.ttft_slo_ms, true, 1e12, "[0, 1e12] ms");
  in_range("new_replica_grace_s", &a.new_replica_grace_s, true, 1e9, "[0, 1e9] seconds");
  // Fields that must be strictly positive (or within (0, 1]).
  auto positive = [&](const std::string& key, double* out, double max, const std::string& range) {
    auto v = read_double(f, key, -std::numeric_limits<double>::infinity(), false);
    if (!v) return;
    if (*v <= 0 || *v > max) {
      error(*f.get(key), "autoscale." + key, quote(f.get(key)->Scalar()) + " must be in " + range);
      return;
    }
    *out = *v;
  };
  positive("target_ongoing_requests", &a.target_ongoing_requests, 1e9, "(0, 1e9]");
  positive("target_kv_cache_usage", &a.target_kv_cache_usage, 1.0, "(0, 1]");
  positive("look_back_period_s", &a.look_back_period_s, 1e9, "(0, 1e9] seconds");
  positive("start_timeout_s", &a.start_timeout_s, 1e9, "(0, 1e9] seconds");
  positive("start_backoff_s", &a.start_backoff_s, 1e9, "(0, 1e9] seconds");
  positive("start_backoff_max_s", &a.start_backoff_max_s, 1e9, "(0, 1e9] seconds");
  if (a.start_backoff_max_s < a.start_backoff_s) {
    const char* key = f.get("start_backoff_max_s") ? "start_backoff_max_s" : "start_backoff_s";
    error(*f.get(key), "autoscale.start_backoff_max_s",
          quote(fmt::format("{:g}", a.start_backoff_max_s)) + " is less than start_backoff_s " +
              quote(fmt::format("{:g}", a.start_backoff_s)));
  }
  if (*max_replicas && a.min_replicas > **max_replicas) {
    error(f.get("min_replicas") ? *f.get("min_replicas") : *f.get("max_replicas"), "autoscale.min_replicas",
          quote(std::to_string(a.min_replicas)) + " is greater than max_replicas " +
              quote(std::to_string(**max_replicas)));
  }
}

Expected<Topology> TopologyParser::run(const std::string& yaml_text, bool endpoint_only) {
  YAML::Node root;
  try {
    // NOTE: every document is read: YAML::Load took the first and silently dropped the rest of a
    // file with a second "---" document (two topologies pasted into one file).
    std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    if (docs.size() > 1) {
      return invalid_argument(loc(docs[1].Mark()) + ": (top level): a second YAML document ('---'); a topology file holds one");
    }
    if (!docs.empty()) root = docs.front();
  } catch (const YAML::Exception& e) {
    return invalid_argument(loc(e.mark) + ": malformed YAML: " + e.msg);
  }
  if (root.IsNull()) return invalid_argument(file_ + ":1:1: (top level): the topology is empty");
  Fields top(*this, root, "", {"cluster", "head", "models", "nodes", "scheduler", "autoscale"});
  std::optional<int32_t> max_replicas;
  if (top.is_map()) {
    // Order matters: workers are checked against models (tensor_parallel_size, speculative).
    parse_cluster(top.get("cluster") ? *top.get("cluster") : YAML::Node(YAML::NodeType::Map));
    if (const YAML::Node* h = top.get("head")) parse_head(*h);
    if (endpoint_only) {
      if (findings_.empty()) return std::move(topo_);
      std::string msg;
      for (const Finding& fd : findings_) msg += (msg.empty() ? "" : "\n") + fd.text;
      return Status(findings_.front().code, msg);
    }
    if (const YAML::Node* m = top.get("models")) {
      parse_models(*m);
    } else {
      missing(top, "models", "at least models.target");
    }
    if (const YAML::Node* nd = top.get("nodes")) {
      parse_nodes(*nd);
    } else {
      missing(top, "nodes", "at least one node with a target_shard worker");
    }
    if (const YAML::Node* s = top.get("scheduler")) parse_scheduler(*s);
    if (const YAML::Node* a = top.get("autoscale")) parse_autoscale(*a, &max_replicas);
  }
  // NOTE: cross-field checks run only on a topology whose fields all parsed: on a broken one
  // they would mostly repeat the first error in other words.
  if (findings_.empty()) check_topology(max_replicas);
  if (findings_.empty()) return std::move(topo_);
  std::string msg;
  for (const Finding& fd : findings_) msg += (msg.empty() ? "" : "\n") + fd.text;
  return Status(findings_.front().code, msg);
}

}  // namespace topology_internal
}  // namespace specserve
