// specserve config: the cluster topology file (YAML) -> validated plain structs.
//
// A topology names the cluster, where the head listens, the target model and its proposer,
// the nodes with their devices and the workers each runs, the scheduler's budgets and the
// autoscaler's bounds (DESIGN.md sections 5 and 8). Keys follow vLLM (models, scheduler) and
// Ray Serve (autoscale) so that a user of either recognises them. The reference of every key,
// its default and its checks is the comment in examples/cluster-local.yaml and the README.
//
// Parsing is strict: an unknown key, a value of the wrong type or out of range, or a
// topology that cannot run (ranks that do not cover tensor_parallel_size, workers sharing one
// GPU whose gpu_memory_utilization fractions sum past 1, a model file that cannot be read) is an
// error naming `file:line:column`, the field
// path (`nodes[0].workers[1].device`) and the offending value. Every error found is reported,
// one per line, not only the first.
//
// Pure data and file-system checks; no actors, no threads. Thread-safety: the functions are
// reentrant; `check_ports_free` binds sockets for an instant.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace specserve {

// ---------------------------------------------------------------- the structs

enum class DeviceKind { kCpu, kCuda };

/// A compute device on one node: `cpu` or `cuda:N`.
struct DeviceSpec {
  DeviceKind kind = DeviceKind::kCpu;
  int32_t index = 0;  ///< CUDA ordinal on its node; 0 for the CPU
  /// "cpu" or "cuda:N".
  std::string to_string() const;
  bool operator==(const DeviceSpec&) const = default;
};

enum class WorkerRole { kTargetShard, kDraftWorker, kPrefillWorker };
/// "target_shard", "draft_worker", "prefill_worker".
const char* worker_role_name(WorkerRole role);

/// vLLM's `speculative_config.method` values.
enum class SpeculativeMethod { kNgram, kDraftModel, kLayerSkip, kMedusa, kEagle };
/// "ngram", "draft_model", "layer_skip", "medusa", "eagle".
const char* speculative_method_name(SpeculativeMethod method);

/// `cluster:` — identity and the shared secret peers present on the actor port.
struct ClusterSpec {
  std::string name = "specserve";
  /// Absolute path (~ expanded, relative paths taken from the YAML file's folder). The runtime
  /// reads the token from it; parsing does not require it to exist yet.
  std::string token_file;
};

/// `head:` — where the head process (scheduler, HTTP front end, autoscaler) listens.
struct HeadSpec {
  std::string host = "127.0.0.1";
  int32_t actor_port = 7420;  ///< CAF middleman port, 1..65535
  int32_t http_port = 8000;   ///< OpenAI-compatible HTTP port, 1..65535
};

/// `models.target:` — the model every replica serves.
struct TargetModelSpec {
  std::string path;                      ///< absolute path of a readable GGUF file
  int32_t tensor_parallel_size = 1;      ///< target_shard workers per replica (ranks 0..tp-1)
  std::optional<int32_t> max_model_len;  ///< tokens; unset: the model's context length
  /// vLLM's dtype (core/dtype.h): the matmul arithmetic of every worker process of the cluster
  /// (target shards, prefill and draft workers; each applies it for its own device when it
  /// starts, actors/backend_factory.h apply_compute_dtype). One value per topology, so workers
  /// that continue each other's sequences compute alike.
  ComputeDtype dtype = ComputeDtype::kAuto;
};

/// `models.speculative:` — the proposer (vLLM's speculative_config keys).
struct SpeculativeSpec {
  SpeculativeMethod method = SpeculativeMethod::kNgram;
  std::string model;                      ///< absolute path; set exactly for draft_model, medusa, eagle
  int32_t num_speculative_tokens = 0;     ///< k, 1..64
  /// ngram: the lookup's n-gram lengths, 1 <= min <= max; vLLM's defaults 5 and 5 (one given
  /// sets the other). Other methods: used when lookup_first is set.
  int32_t prompt_lookup_min = 5;
  int32_t prompt_lookup_max = 5;
  /// Not ngram: prompt lookup first, the method's proposer where it finds nothing
  /// (spec/lookup_first_proposer.h). Set by giving prompt_lookup_min / prompt_lookup_max with a
  /// model-based method.
  bool lookup_first = false;
  /// ngram, or with lookup_first: the outputs of this many earlier finished requests of the same
  /// worker are searched too, and the longer match (own text or earlier output) drafts
  /// (spec/lookup_history.h; after SuffixDecoding), 0..10000. 0: off (the default).
  int32_t lookup_cached_requests = 0;
  std::optional<int32_t> num_layers;      ///< layer_skip only; unset: half the target's layers
  /// medusa / eagle only: vLLM's static tree, e.g. "[(0,), (0, 0), (0, 1)]" (paths of candidate
  /// ranks; spec/token_tree.h parses it when the proposer is built). Empty: medusa uses Medusa's
  /// mc_sim_7b_63 tree, eagle its dynamic EAGLE-2 tree. Trimmed to num_speculative_tokens nodes.
  std::string speculative_token_tree;
  std::optional<int32_t> eagle_topk;      ///< eagle's dynamic tree: children per expanded node, 1..64
  std::optional<int32_t> eagle_depth;     ///< eagle's dynamic tree: deepest level, 1..64
  /// medusa / eagle only: the heads score token ids below this only (a prefix of the output
  /// head: cheaper drafting, still exact after verification); unset: the proposer's default.
  std::optional<int32_t> draft_vocab_size;
  /// Not for ngram: in [0, 1]; a draft token is proposed only when the proposer's path probability
  /// of it (its estimate of the token's acceptance) is at least this (EagleOptions::draft_p_min,
  /// MedusaOptions::draft_p_min, DrafterOptions::draft_p_min). Unset: 0, no limit.
  std::optional<float> draft_p_min;
  std::optional<int32_t> disable_by_batch_size;  ///< no speculation while more sequences run
  /// vLLM's speculative_config max_model_len: the DRAFT's maximum length in tokens (draft_model,
  /// layer_skip, medusa, eagle; ngram keeps no draft context and ignores it). A sequence longer
  /// than this gets no drafts (plain decoding); the target's own limit is
  /// models.target.max_model_len (--max-model-len). Unset: the target's limit.
  std::optional<int32_t> max_model_len;
  int32_t draft_tensor_parallel_size = 1;
  bool adaptive_k = true;                 ///< per-sequence k follows observed acceptance (chain proposers; EngineOptions::adaptive_k)
  /// Per step, only sequences whose drafts pay for their time draft (EngineOptions::disable_by_goodput).
  bool disable_by_goodput = false;
  /// Medusa's typical acceptance for sampled requests (EngineOptions::typical_acceptance):
  /// LOSSY, off by default.
  bool typical_acceptance = false;
  float posterior_threshold = 0.09f;      ///< in (0, 1]
  float posterior_alpha = 0.3f;           ///< in [0, 1]
};

struct ModelsSpec {
  TargetModelSpec target;
  std::optional<SpeculativeSpec> speculative;  ///< unset: plain decoding
};

/// One persistent worker process (actor) on a node.
struct WorkerSpec {
  WorkerRole role = WorkerRole::kTargetShard;
  /// Which entry of `models:` it runs: "target" (target_shard, prefill_worker) or
  /// "speculative" (draft_worker); defaults by role.
  std::string model;
  int32_t replica = 0;  ///< the replica it serves, >= 0
  int32_t rank = 0;     ///< tensor-parallel rank within its replica (target_shard only)
  DeviceSpec device;
  /// cuda:N only: the fraction of the device's total memory this worker may use (weights,
  /// activations and KV), in (0, 1]; vLLM's gpu_memory_utilization and default. Workers sharing
  /// a device must have fractions summing to at most 1. Ignored on the CPU.
  double gpu_memory_utilization = 0.9;
};

/// `nodes[i]:` — one node daemon: a host, the devices it offers, the workers it runs.
struct NodeSpec {
  std::string name;
  std::string host = "127.0.0.1";
  std::vector<DeviceSpec> devices;
  std::vector<WorkerSpec> workers;  ///< may be empty: a node that only offers devices
};

/// `scheduler:` — continuous-batching budgets (vLLM's names and meanings).
struct SchedulerSpec {
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;  ///< >= max_num_seqs
  int32_t block_size = 16;                ///< KV block size in tokens
  int64_t kv_cache_bytes = int64_t{1} << 30;  ///< per replica
  bool enable_prefix_caching = true;      ///< automatic prefix caching (vLLM V1's default: on)
  /// Running sequences move (with their KV) from a replica holding more than its share to one
  /// with room, e.g. right after a scale-up promotes a replica (scheduler/rebalance.h rule 2).
  bool rebalance_running = true;
  /// Static topologies (no autoscaler): times a node process restarts one of its workers that a
  /// signal killed (SIGKILL, SIGSEGV, SIGABRT, ...; not a worker that exited, or one stopped with
  /// SIGTERM/SIGINT), with backoff 1, 2, 4 ... s; 0 (the default): never. Not for tensor-parallel
  /// replicas (a group lives whole): their ranks are never restarted.
  int32_t worker_restarts = 0;
  /// With worker_restarts > 0: how long the requests of a replica whose target shard died wait
  /// for it to come back when no other replica serves them, before they fail (seconds, >= 0).
  double worker_restart_timeout_s = 60.0;
};

/// `autoscale:` — replica bounds and the autoscaler's signals (Ray Serve's names and meanings
/// where Ray Serve has the knob; the policy is scheduler/autoscale_policy.h). The autoscaler
/// runs when the section is given with max_replicas > min_replicas or warm_pool > 0 (enabled()).
struct AutoscaleSpec {
  int32_t min_replicas = 1;  ///< ready (routed) replicas kept at least; 0 allowed (scale to zero)
  int32_t max_replicas = 1;  ///< ready replicas at most; default: max(min_replicas, declared replicas - warm_pool, 1)
  int32_t warm_pool = 0;     ///< standby replicas kept loaded and warmed (not routed)
  double upscale_delay_s = 30.0;    ///< pressure must hold this long before a scale-up
  double downscale_delay_s = 600.0; ///< idle must hold this long before a scale-down
  double target_ongoing_requests = 2.0;  ///< > 0: queued + running requests per ready replica
  double ttft_slo_ms = 0;                ///< >= 0; 0: no TTFT / queue-wait signal
  double target_kv_cache_usage = 0.9;    ///< (0, 1]: mean KV usage of ready replicas above it is pressure
  double look_back_period_s = 30.0;      ///< > 0: TTFT samples window
  double new_replica_grace_s = 10.0;     ///< >= 0: TTFT samples of a replica ready for less are ignored
  double start_timeout_s = 300.0;        ///< > 0: a replica starting/loading/warming this long without progress is stopped
  /// A replica whose start failed is started again after start_backoff_s * 2^(failures in a row - 1)
  /// seconds, at most start_backoff_max_s (Kubernetes' CrashLoopBackOff); after 5 in a row the
  /// queue no longer waits for it, but it is still tried at that pace.
  double start_backoff_s = 1.0;
  double start_backoff_max_s = 60.0;
  /// The file has an `autoscale:` section. Without one every declared replica serves (static).
  bool configured = false;
  /// True when the head runs the autoscaler: an `autoscale:` section with
  /// max_replicas > min_replicas or warm_pool > 0.
  bool enabled() const { return configured && (max_replicas > min_replicas || warm_pool > 0); }
};

/// A whole, validated topology file.
struct Topology {
  std::string source;  ///< the file (or name) it was parsed from, for messages
  ClusterSpec cluster;
  HeadSpec head;
  ModelsSpec models;
  std::vector<NodeSpec> nodes;
  SchedulerSpec scheduler;
  AutoscaleSpec autoscale;
  /// Things allowed but worth a line in the log, each "file:line:column: path: ...": a head or
  /// node host that is not loopback (the actor port then accepts remote peers, which must
  /// present the cluster token).
  std::vector<std::string> notes;
  /// "file:line:column" of every field and list entry read, by field path ("head.actor_port",
  /// "nodes[0].workers[1]"), so later failures (a port taken, a model that fails to load) can
  /// point at the line that asked for it.
  std::map<std::string, std::string> locations;

  /// locations[path], or `source` when the path was not in the file (a default).
  std::string where(const std::string& path) const;
  /// Distinct replica ids of the target_shard workers, ascending.
  std::vector<int32_t> replica_ids() const;
};

// ---------------------------------------------------------------- parsing

/// Reads and validates the topology file at `path`. Relative paths inside it resolve from the
/// file's folder. kNotFound when the file cannot be read, kInvalidArgument for a directory;
/// otherwise as parse_topology.
Expected<Topology> load_topology_file(const std::string& path);

/// A topology file's bytes as read once, with the names parse_topology takes for them: `path`
/// as given (for messages), `base_dir` the file's absolute folder (relative paths inside resolve
/// from it). load_topology_file is parse_topology(text, path, base_dir) of this.
struct TopologySource {
  std::string path;
  std::string absolute_path;
  std::string base_dir;
  std::string text;
};
/// Reads the topology file at `path`. Errors: kNotFound when it cannot be read,
/// kInvalidArgument for a directory (each naming the path).
Expected<TopologySource> read_topology_source(const std::string& path);

/// What a client of the head needs from the topology file at `path`: only `cluster` (the token
/// file) and `head` (host, ports) are read, with load_topology_file's rules and defaults (unknown
/// top-level keys are still named); the models, nodes, scheduler and autoscale sections are not
/// checked — a host that only submits or asks for status may lack the model files, or a device
/// the nodes list. Errors: as load_topology_file, for those two sections.
Expected<Topology> load_topology_endpoint(const std::string& path);

/// Validates `yaml_text`. `name_for_errors` is the file name the messages start with;
/// relative paths inside resolve from `base_dir` (empty: the current directory).
/// Errors: kInvalidArgument (malformed YAML, unknown key, wrong type, out of range, an
/// inconsistent topology) or kNotFound (a model file that is missing or unreadable), with one
/// line "file:line:column: field.path: ... 'value' ..." per problem found.
/// Does not touch the network: call check_ports_free for that.
Expected<Topology> parse_topology(const std::string& yaml_text, const std::string& name_for_errors,
                                  const std::string& base_dir = "");

/// Checks that head.actor_port and head.http_port can be bound on head.host right now (a TCP
/// socket with SO_REUSEADDR, bound and closed at once). kUnavailable naming the field, the
/// host:port, its location in the file and the errno name (EADDRINUSE when another process
/// listens there); kInvalidArgument when head.host does not resolve.
/// `include_http` false: only head.actor_port (while no HTTP front end listens).
Status check_ports_free(const Topology& topology, bool include_http = true);

// ---------------------------------------------------------------- helpers (also for tests)

/// Parses a byte count: a plain integer ("1073741824") or a number with a unit, binary
/// ("KiB", "MiB", "GiB", "TiB", or "Ki".."Ti") or decimal ("KB", "MB", "GB", "TB", or
/// "K".."T"), case-insensitive, optional space, optional fraction ("1.5GiB", rounded down).
/// kInvalidArgument for anything else, a negative value or one past int64.
Expected<int64_t> parse_byte_size(std::string_view text);

/// Parses "cpu" or "cuda:N" (N >= 0). kInvalidArgument otherwise.
Expected<DeviceSpec> parse_device(std::string_view text);

/// Expands a leading "~" or "~/" (from $HOME, else the password database) and "~user/".
/// Other paths come back unchanged. kNotFound when the home folder cannot be found.
Expected<std::string> expand_user_path(const std::string& path);

/// True for "localhost", 127.0.0.0/8 and ::1.
bool is_loopback_host(const std::string& host);

/// `models.speculative` in one line: "ngram, num_speculative_tokens 4, prompt_lookup 1..5,
/// lookup_cached_requests 1000" (the method, k, model, the draft limits, the lookup bounds and the
/// history), or "none (plain decoding)". Shown by `up --dry-run`, the serve log and `status`.
std::string describe_speculative(const Topology& topology);

}  // namespace specserve
