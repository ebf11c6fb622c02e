// `specserve bench-actors`: the two measurements and the topology they share — the control
// overhead at batch 1 (the same greedy requests through the direct Engine and the actor paths,
// interleaved and repeated) and output tokens/s against the number of concurrent clients — with
// the command's flags (BenchArgs) they read. Each writes its topology as YAML and parses it back
// (the code `up` uses), so every path runs with the same engine options. The command (flags,
// questions, report) is in bench_actors.cpp; the paths and sweeps in bench_actors_paths.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/topology.h"
#include "core/status.h"
#include "model/backend.h"
#include "tools/cli/bench_actors_lib.h"
#include "tools/cli/common.h"
#include "tools/cli/spec_config_lib.h"

namespace specserve::cli::bench_actors {

/// The flags of `specserve bench-actors` (add_bench_actors in bench_actors.cpp registers them).
struct BenchArgs {
  std::string model;
  std::string questions = std::string(SPECSERVE_SOURCE_DIR) + "/../shared/data/spec_bench/question.jsonl";
  std::string mode = "all";
  int threads = 0;
  int max_tokens = 128;
  int repeats = 5;
  int num_prompts = 2;
  int max_prompt_tokens = 256;
  std::vector<int> concurrency = {1, 2, 4, 8, 16, 32};
  int sweep_max_tokens = 64;
  int requests_per_client = 1;
  int min_requests = 4;
  bool processes = false;
  bool no_network = false;
  std::vector<std::string> paths = {"direct", "actor", "network"};
  bool no_sweep_direct = false;
  bool sweep_speculative = false;
  int max_num_seqs = 64;
  int max_num_batched_tokens = 2048;
  int max_model_len = 4096;
  int scheduler_threads = 0;
  double quiet_cores = 0.1;
  int retries = 1;
  double quiet_wait_s = 30;
  std::string kv_cache_bytes = "2GiB";
  std::string out;
  SpecArgs spec;
};

/// A configuration the overhead runs with: "off" (no speculation) or the speculative one.
struct OverheadConfig {
  std::string name;
  std::optional<SpeculativeSpec> spec;
};

/// The overhead at batch 1 for one configuration: starts the direct Engine (the peer) and the
/// actor paths `a.paths` names, warms them up, then runs `a.repeats` x `a.num_prompts` units
/// (one prompt through every path back to back, order rotated; noisy units run again up to
/// `a.retries` times). Appends its rows of the Markdown table to *markdown; returns the JSON
/// record (runs, summaries, machine load). Errors: a path that fails to start or to run, a run
/// without steps, no actor path named in --paths.
Expected<json> run_overhead(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                            const std::vector<Question>& questions, const OverheadConfig& cfg, std::string* markdown);

/// Output tokens/s against concurrent clients: at each level of `a.concurrency`, N closed-loop
/// clients through the actor path (in this process, or `up` with --processes) and, unless
/// --no-sweep-direct, the Engine driven directly with the same loop. Appends its rows of the
/// Markdown table to *markdown; returns the JSON record. Errors: a path that fails to start, a
/// failed request.
Expected<json> run_concurrency(const BenchArgs& a, const std::string& model, int threads, LoadedModel* lm, Backend* backend,
                               const std::vector<Question>& qs, const std::optional<SpeculativeSpec>& spec,
                               std::string* markdown);

}  // namespace specserve::cli::bench_actors
