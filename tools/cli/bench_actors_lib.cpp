// `specserve bench-actors`: the pure parts (bench_actors_lib.h).
#include "tools/cli/bench_actors_lib.h"

#include <cmath>
#include <iomanip>
#include <numeric>
#include <set>
#include <sstream>

namespace specserve::cli::bench_actors {


double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

json others_between(const CpuSample& a, const CpuSample& b) {
  const double wall = std::chrono::duration<double>(b.at - a.at).count();
  const double others = std::max(0.0, (b.busy_s - a.busy_s) - (b.ours_s - a.ours_s));
  return {{"wall_s", wall},
          {"other_processes_cores", wall > 0 ? others / wall : 0.0},
          {"this_benchmark_cores", wall > 0 ? (b.ours_s - a.ours_s) / wall : 0.0},
          {"steal_cores", wall > 0 ? (b.steal_s - a.steal_s) / wall : 0.0}};
}

std::string task_of(const std::string& category) {
  static const std::set<std::string> kOwn = {"translation", "summarization", "qa", "math_reasoning", "rag"};
  return kOwn.count(category) ? category : "mt_bench";
}

std::string speculative_yaml(const std::optional<SpeculativeSpec>& s) {
  if (!s) return "";
  std::ostringstream o;
  o << "  speculative: { method: " << speculative_method_name(s->method)
    << ", num_speculative_tokens: " << s->num_speculative_tokens;
  if (s->method == SpeculativeMethod::kNgram || s->lookup_first) {
    o << ", prompt_lookup_min: " << s->prompt_lookup_min << ", prompt_lookup_max: " << s->prompt_lookup_max;
    if (s->lookup_cached_requests > 0) o << ", lookup_cached_requests: " << s->lookup_cached_requests;
  }
  if (!s->model.empty()) o << ", model: \"" << s->model << "\"";
  if (s->num_layers) o << ", num_layers: " << *s->num_layers;
  if (!s->speculative_token_tree.empty()) o << ", speculative_token_tree: \"" << s->speculative_token_tree << "\"";
  if (s->eagle_topk) o << ", eagle_topk: " << *s->eagle_topk;
  if (s->eagle_depth) o << ", eagle_depth: " << *s->eagle_depth;
  if (s->draft_vocab_size) o << ", draft_vocab_size: " << *s->draft_vocab_size;
  if (s->draft_p_min) o << ", draft_p_min: " << std::setprecision(9) << *s->draft_p_min << std::setprecision(6);
  if (s->disable_by_batch_size && *s->disable_by_batch_size > 0) o << ", disable_by_batch_size: " << *s->disable_by_batch_size;
  if (s->disable_by_goodput) o << ", disable_by_goodput: true";
  o << ", adaptive_k: " << (s->adaptive_k ? "true" : "false") << " }\n";
  return o.str();
}

std::string spec_name(const SpeculativeSpec& s) {
  std::string n = speculative_method_name(s.method);
  n += " k=" + std::to_string(s.num_speculative_tokens);
  if (s.method == SpeculativeMethod::kNgram) {
    n += " lookup " + std::to_string(s.prompt_lookup_min) + ".." + std::to_string(s.prompt_lookup_max);
  } else if (s.lookup_first) {
    n += " lookup first " + std::to_string(s.prompt_lookup_min) + ".." + std::to_string(s.prompt_lookup_max);
  }
  if (s.lookup_cached_requests > 0) n += " history " + std::to_string(s.lookup_cached_requests);
  if (!s.adaptive_k) n += " fixed k";
  if (s.disable_by_goodput) n += " goodput";
  return n;
}

Spread spread(const std::vector<double>& v) {
  Spread s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.min = *std::min_element(v.begin(), v.end());
  s.max = *std::max_element(v.begin(), v.end());
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.stdev = v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) : 0.0;
  std::vector<double> sorted = v;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  s.median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  return s;
}

json summarize(const std::vector<Unit>& units, const std::vector<std::string>& paths, bool quiet_only) {
  json summary;
  for (const auto& p : paths) {
    double seconds = 0, decode_seconds = 0, forward_s = 0, draft_s = 0, ttft_s = 0;
    int64_t tokens = 0, steps = 0, decode_steps = 0, n = 0;
    TreeCounters cost;
    std::vector<double> overhead, decode_overhead, per_step_us;
    for (const Unit& u : units) {
      if (quiet_only && !u.quiet) continue;
      const Sample& x = u.s.at(p);
      const Sample& d = u.s.at("direct");
      ++n;
      seconds += x.seconds;
      decode_seconds += x.seconds - x.ttft_s;
      forward_s += x.forward_s;
      draft_s += x.draft_s;
      ttft_s += x.ttft_s;
      tokens += x.tokens;
      steps += x.steps;
      decode_steps += x.steps - u.decode_steps_offset;
      cost.cpu_s += x.cost.cpu_s;
      cost.voluntary += x.cost.voluntary;
      cost.involuntary += x.cost.involuntary;
      overhead.push_back(x.seconds / d.seconds - 1);
      decode_overhead.push_back((x.seconds - x.ttft_s) / (d.seconds - d.ttft_s) - 1);
      per_step_us.push_back((x.seconds - d.seconds) / static_cast<double>(x.steps) * 1e6);
    }
    json js;
    js["units"] = n;
    if (n == 0) {
      summary[p] = js;
      continue;
    }
    const double st = static_cast<double>(steps);
    js["ms_per_output_token"] = seconds / static_cast<double>(tokens) * 1e3;
    js["ms_per_step"] = seconds / st * 1e3;
    js["ms_per_decode_step"] = decode_seconds / static_cast<double>(std::max<int64_t>(1, decode_steps)) * 1e3;
    js["steps_per_request"] = st / static_cast<double>(n);
    js["tokens_per_step"] = static_cast<double>(tokens) / st;
    js["mean_ttft_ms"] = ttft_s / static_cast<double>(n) * 1e3;
    js["forward_ms_per_step"] = forward_s / st * 1e3;
    js["draft_ms_per_step"] = draft_s / st * 1e3;
    // Wall time per step outside the target's forward pass and the proposer: the engine's own
    // bookkeeping, plus (actor paths) messaging and waiting.
    js["outside_engine_ms_per_step"] = (seconds - forward_s - draft_s) / st * 1e3;
    js["cpu_ms_per_step"] = cost.cpu_s / st * 1e3;
    js["cpu_cores_busy"] = cost.cpu_s / seconds;
    js["voluntary_context_switches_per_step"] = static_cast<double>(cost.voluntary) / st;
    js["involuntary_context_switches_per_step"] = static_cast<double>(cost.involuntary) / st;
    js["overhead_vs_direct"] = spread(overhead).to_json();
    js["decode_overhead_vs_direct"] = spread(decode_overhead).to_json();
    js["overhead_us_per_step"] = spread(per_step_us).to_json();
    summary[p] = js;
  }
  return summary;
}

}  // namespace specserve::cli::bench_actors
