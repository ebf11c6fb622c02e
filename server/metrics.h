// specserve server: Prometheus metrics — counters, gauges and histograms rendered in the
// Prometheus text exposition format (version 0.0.4,
// https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Names follow vLLM's metrics with the `specserve:` prefix (vLLM's meanings: see
// docs.vllm.ai "Metrics"); counters end in `_total`. Pure: no sockets, no actors; thread-safe
// (one mutex per registry: an observation is a few additions).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace specserve {

/// Label set, e.g. {{"model_name", "smollm"}, {"position", "0"}}: rendered in this order.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

/// A histogram with fixed upper bounds (seconds or tokens); `+Inf` is implicit.
struct Histogram {
  std::vector<double> bounds;    ///< ascending upper bounds
  std::vector<uint64_t> counts;  ///< [bounds.size() + 1], NOT cumulative (the last: > every bound)
  double sum = 0;
  uint64_t count = 0;
  explicit Histogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  /// Adds `value` `times` times (NaN is ignored).
  void observe(double value, uint64_t times = 1);
};

/// Bucket bounds (seconds) vLLM uses for time to first token.
std::vector<double> ttft_buckets();
/// Bucket bounds (seconds) vLLM uses for inter-token latency.
std::vector<double> itl_buckets();
/// Bucket bounds (seconds) vLLM uses for end-to-end request latency.
std::vector<double> e2e_buckets();

/// A set of metric families. Families keep the order in which they were first declared.
class MetricsRegistry {
 public:
  enum class Kind { kCounter, kGauge, kHistogram };

  /// Declares a family (idempotent): `name` without the `_total` suffix for counters (it is
  /// added in the exposition), `help` one line.
  void declare(const std::string& name, Kind kind, const std::string& help, std::vector<double> buckets = {});
  /// Counter += `delta` (delta >= 0; negative deltas are ignored).
  void add(const std::string& name, const MetricLabels& labels, double delta);
  /// Counter = max(current, `value`): for totals read from elsewhere (the workers' counters),
  /// so that a restarted worker never makes a counter go backwards.
  void set_counter_at_least(const std::string& name, const MetricLabels& labels, double value);
  /// Gauge = `value`.
  void set(const std::string& name, const MetricLabels& labels, double value);
  /// Histogram observation, `times` times.
  void observe(const std::string& name, const MetricLabels& labels, double value, uint64_t times = 1);

  /// The whole registry in the text format: `# HELP`, `# TYPE`, then one line per sample
  /// (`name{labels} value`); histograms as cumulative `_bucket{le=...}`, `_sum`, `_count`.
  std::string render() const;

 private:
  struct Family {
    Kind kind = Kind::kCounter;
    std::string help;
    std::vector<double> buckets;
    std::map<MetricLabels, double> values;
    std::map<MetricLabels, Histogram> histograms;
  };
  Family* find(const std::string& name, Kind kind);
  mutable std::mutex mu_;
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
};

/// Formats a sample value the way Prometheus parses it ("+Inf", "NaN", shortest round-trip).
std::string format_metric_value(double v);
/// Escapes a label value (backslash, double quote, newline).
std::string escape_label_value(const std::string& v);

}  // namespace specserve
