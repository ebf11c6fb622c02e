#include "server/metrics.h"

#include <charconv>
#include <cmath>

namespace specserve {

void Histogram::observe(double value, uint64_t times) {
  if (std::isnan(value) || times == 0) return;
  size_t i = 0;
  while (i < bounds.size() && value > bounds[i]) ++i;  // Prometheus buckets are `le` (<=)
  counts[i] += times;
  sum += value * static_cast<double>(times);
  count += times;
}

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> itl_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> e2e_buckets() {
  return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
          1920.0, 7680.0};
}

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string escape_label_value(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

namespace {

std::string render_labels(const MetricLabels& labels, const std::string& extra_key = "", const std::string& extra_value = "") {
  if (labels.empty() && extra_key.empty()) return "";
  std::string s = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    s += (first ? "" : ",") + k + "=\"" + escape_label_value(v) + "\"";
    first = false;
  }
  if (!extra_key.empty()) s += (first ? "" : ",") + extra_key + "=\"" + extra_value + "\"";
  return s + "}";
}

}  // namespace

void MetricsRegistry::declare(const std::string& name, Kind kind, const std::string& help, std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  if (families_.count(name)) return;
  Family f;
  f.kind = kind;
  f.help = help;
  f.buckets = std::move(buckets);
  families_.emplace(name, std::move(f));
  order_.push_back(name);
}

MetricsRegistry::Family* MetricsRegistry::find(const std::string& name, Kind kind) {
  auto it = families_.find(name);
  // NOTE: an undeclared or mistyped family is a programming error in the server; observations
  // are dropped rather than aborting a serving process.
  if (it == families_.end() || it->second.kind != kind) return nullptr;
  return &it->second;
}

void MetricsRegistry::add(const std::string& name, const MetricLabels& labels, double delta) {
  if (!(delta >= 0)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (Family* f = find(name, Kind::kCounter)) f->values[labels] += delta;
}

void MetricsRegistry::set_counter_at_least(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Family* f = find(name, Kind::kCounter)) {
    double& v = f->values[labels];
    if (value > v) v = value;
  }
}

void MetricsRegistry::set(const std::string& name, const MetricLabels& labels, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Family* f = find(name, Kind::kGauge)) f->values[labels] = value;
}

void MetricsRegistry::observe(const std::string& name, const MetricLabels& labels, double value, uint64_t times) {
  std::lock_guard<std::mutex> lock(mu_);
  Family* f = find(name, Kind::kHistogram);
  if (!f) return;
  auto it = f->histograms.find(labels);
  if (it == f->histograms.end()) it = f->histograms.emplace(labels, Histogram(f->buckets)).first;
  it->second.observe(value, times);
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const std::string& name : order_) {
    const Family& f = families_.at(name);
    const std::string full = f.kind == Kind::kCounter ? name + "_total" : name;
    const char* type = f.kind == Kind::kCounter ? "counter" : f.kind == Kind::kGauge ? "gauge" : "histogram";
    out += "# HELP " + full + " " + f.help + "\n";
    out += "# TYPE " + full + " " + type + "\n";
    if (f.kind != Kind::kHistogram) {
      for (const auto& [labels, v] : f.values) out += full + render_labels(labels) + " " + format_metric_value(v) + "\n";
      continue;
    }
    for (const auto& [labels, h] : f.histograms) {
      uint64_t cumulative = 0;
      for (size_t i = 0; i < h.bounds.size(); ++i) {
        cumulative += h.counts[i];
        out += name + "_bucket" + render_labels(labels, "le", format_metric_value(h.bounds[i])) + " " +
               std::to_string(cumulative) + "\n";
      }
      cumulative += h.counts.back();
      out += name + "_bucket" + render_labels(labels, "le", "+Inf") + " " + std::to_string(cumulative) + "\n";
      out += name + "_sum" + render_labels(labels) + " " + format_metric_value(h.sum) + "\n";
      out += name + "_count" + render_labels(labels) + " " + std::to_string(h.count) + "\n";
    }
  }
  return out;
}

}  // namespace specserve
