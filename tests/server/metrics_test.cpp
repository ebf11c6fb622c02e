// Prometheus exposition of server/metrics.h: counters, gauges, cumulative histogram buckets.
#include "server/metrics.h"

#include <gtest/gtest.h>

namespace specserve {
namespace {

TEST(Metrics, HistogramBucketsAreLessOrEqualAndCumulative) {
  MetricsRegistry r;
  r.declare("specserve:ttft_seconds", MetricsRegistry::Kind::kHistogram, "TTFT.", {0.1, 1.0});
  const MetricLabels l = {{"model_name", "m"}};
  r.observe("specserve:ttft_seconds", l, 0.1);   // le=0.1 (bounds are inclusive)
  r.observe("specserve:ttft_seconds", l, 0.5);   // le=1
  r.observe("specserve:ttft_seconds", l, 7.0, 2);  // +Inf, twice
  const std::string text = r.render();
  EXPECT_NE(text.find("# TYPE specserve:ttft_seconds histogram\n"), std::string::npos) << text;
  EXPECT_NE(text.find("specserve:ttft_seconds_bucket{model_name=\"m\",le=\"0.1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("specserve:ttft_seconds_bucket{model_name=\"m\",le=\"1\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("specserve:ttft_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("specserve:ttft_seconds_sum{model_name=\"m\"} 14.6\n"), std::string::npos) << text;
  EXPECT_NE(text.find("specserve:ttft_seconds_count{model_name=\"m\"} 4\n"), std::string::npos) << text;
}

TEST(Metrics, CountersGetTotalSuffixAndNeverGoBack) {
  MetricsRegistry r;
  r.declare("specserve:spec_decode_num_drafts", MetricsRegistry::Kind::kCounter, "Drafts.");
  r.set_counter_at_least("specserve:spec_decode_num_drafts", {}, 10);
  r.set_counter_at_least("specserve:spec_decode_num_drafts", {}, 4);  // a restarted worker: stays 10
  r.add("specserve:spec_decode_num_drafts", {}, 2);
  r.add("specserve:spec_decode_num_drafts", {}, -5);  // ignored
  const std::string text = r.render();
  EXPECT_NE(text.find("# TYPE specserve:spec_decode_num_drafts_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nspecserve:spec_decode_num_drafts_total 12\n"), std::string::npos) << text;
}

TEST(Metrics, GaugesLabelsEscapedAndUndeclaredIgnored) {
  MetricsRegistry r;
  r.declare("specserve:kv_cache_usage_perc", MetricsRegistry::Kind::kGauge, "KV use.");
  r.set("specserve:kv_cache_usage_perc", {{"model_name", "a\"b\\c\nd"}}, 0.25);
  r.set("specserve:not_declared", {}, 1);
  r.add("specserve:kv_cache_usage_perc", {}, 1);  // wrong kind: ignored
  const std::string text = r.render();
  EXPECT_NE(text.find("specserve:kv_cache_usage_perc{model_name=\"a\\\"b\\\\c\\nd\"} 0.25\n"), std::string::npos) << text;
  EXPECT_EQ(text.find("not_declared"), std::string::npos);
  EXPECT_EQ(format_metric_value(1.0 / 0.0), "+Inf");
  EXPECT_EQ(format_metric_value(0.001), "0.001");
  EXPECT_EQ(format_metric_value(3), "3");
}

}  // namespace
}  // namespace specserve
