// `specserve bench-actors`: the pure parts — the records one run leaves (a request's sample,
// CPU counters, a concurrency level), their statistics and per-path summary, the Spec-Bench task
// of a category, and the `models.speculative` YAML a configuration is written as. No sockets, no
// threads: part of specserve_cli_lib, so tests/tools/ can check them without a cluster.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/topology.h"

namespace specserve::cli::bench_actors {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

/// Seconds from `t0` to now.
double since(Clock::time_point t0);

/// CPU seconds (all cores) from /proc/stat, and of this process tree from /proc/<pid>/stat.
struct CpuSample {
  Clock::time_point at = Clock::now();
  double busy_s = 0;   ///< user + nice + system + irq + softirq, every core
  double steal_s = 0;
  double ours_s = 0;   ///< this process and its descendants (the `up` tree)
};

/// CPU seconds and context switches of this process tree (every thread of it), per run.
struct TreeCounters {
  Clock::time_point at = Clock::now();
  double busy_s = 0;        ///< the whole machine (/proc/stat)
  double cpu_s = 0;
  int64_t voluntary = 0;    ///< a thread blocked (futex, sleep, poll)
  int64_t involuntary = 0;  ///< a thread was preempted
};

/// What the rest of the machine did between two samples, in cores (1.0 = one core busy).
json others_between(const CpuSample& a, const CpuSample& b);

/// A Spec-Bench question, ready to send.
struct Question {
  int id = 0;
  std::string task;
  std::string text;               ///< first turn
  std::vector<int32_t> prompt;    ///< chat template applied, tokenized as the head does
};

/// The Spec-Bench task of a question `category`: translation, summarization, qa, math_reasoning,
/// rag as themselves, any other (MT-bench's categories) "mt_bench".
std::string task_of(const std::string& category);

/// The `models.speculative` line of a topology file for `s` ("" when nullopt): method, k, and
/// each option that is set, in config/topology.h's keys.
std::string speculative_yaml(const std::optional<SpeculativeSpec>& s);

/// A short name for a speculative configuration, e.g. "ngram k=4 lookup 1..5".
std::string spec_name(const SpeculativeSpec& s);

/// One request through one path: what it took and produced.
struct Sample {
  std::string path;
  double seconds = 0;      ///< submit / add_request to the last token
  double ttft_s = 0;       ///< to the first token
  int64_t tokens = 0;
  int64_t steps = 0;       ///< engine steps this request took (batch 1: all of them)
  double forward_s = 0;    ///< target forward passes (EngineStats / ShardLoad)
  double draft_s = 0;      ///< proposer
  TreeCounters cost;       ///< CPU and context switches of the whole process tree during the run
  double others_cores = 0; ///< CPU other processes used meanwhile (cores)
  std::vector<int32_t> output;
};

/// Mean, median, min, max and sample standard deviation of a set of values.
struct Spread {
  double mean = 0, median = 0, min = 0, max = 0, stdev = 0;
  json to_json() const { return {{"mean", mean}, {"median", median}, {"min", min}, {"max", max}, {"stdev", stdev}}; }
};

/// The spread of `v`; all zero when empty (median: the mean of the middle two for an even size).
Spread spread(const std::vector<double>& v);

/// One prompt of one repeat: the same request through every path, back to back.
struct Unit {
  int repeat = 0;
  size_t prompt = 0;
  int64_t decode_steps_offset = 1;  ///< steps up to the first token (the direct Engine's count)
  std::map<std::string, Sample> s;  ///< by path
  double others_max = 0;            ///< the most CPU other processes used during one of its runs
  bool quiet = false;
};

/// Per path over `units` (only the quiet ones when `quiet_only`): times per token and per step,
/// where the step time goes, and the overhead against the direct Engine of the same unit.
json summarize(const std::vector<Unit>& units, const std::vector<std::string>& paths, bool quiet_only);

/// One concurrency level through one path: clients, requests, tokens, wall time and TTFTs.
struct LevelResult {
  int clients = 0;
  int requests = 0;
  int64_t tokens = 0;
  double seconds = 0;
  std::vector<double> ttft;
  int errors = 0;
  json to_json() const {
    const Spread t = spread(ttft);
    std::vector<double> s = ttft;
    std::sort(s.begin(), s.end());
    return {{"clients", clients}, {"requests", requests}, {"tokens", tokens}, {"seconds", seconds},
            {"tokens_per_s", seconds > 0 ? tokens / seconds : 0.0}, {"mean_ttft_s", t.mean},
            {"p50_ttft_s", s.empty() ? 0.0 : s[s.size() / 2]}, {"max_ttft_s", t.max}, {"errors", errors}};
  }
};

}  // namespace specserve::cli::bench_actors
