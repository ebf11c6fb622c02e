// Helpers of the topology YAML tests (topology_test.cpp, topology_values_test.cpp): the valid
// base topology the bad cases edit, and parsing with the default model standing for MODEL.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "config/topology.h"
#include "tests/test_util.h"

namespace specserve::topology_testing {

namespace fs = std::filesystem;

// The default model, referenced by file name from its own folder (base_dir), so its path's
// length never moves the columns below.
inline std::string model_dir() { return fs::path(testing::default_model_path()).parent_path().string(); }
inline std::string model_name() { return fs::path(testing::default_model_path()).filename().string(); }

// A valid topology; each bad case below edits one line of it. Locations are 1-based
// line:column of the offending value (or key, for an unknown key); a missing field is reported
// at its mapping, which yaml-cpp places at the `{` of a flow mapping or the first key of a
// block mapping. The expected columns were counted by hand, not copied from the output.
inline std::string base_yaml() {
  return "cluster: {name: t, token_file: /tmp/specserve-test-token}\n"                                      // 1
         "head: {host: 127.0.0.1, actor_port: 7420, http_port: 8000}\n"                                    // 2
         "models:\n"                                                                                        // 3
         "  target: {tensor_parallel_size: 1, path: MODEL}\n"                                               // 4
         "  speculative: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 1, prompt_lookup_max: 5}\n"  // 5
         "nodes:\n"                                                                                         // 6
         "  - name: node0\n"                                                                                // 7
         "    host: 127.0.0.1\n"                                                                            // 8
         "    devices: [cpu, cuda:0, cuda:1]\n"                                                             // 9
         "    workers:\n"                                                                                   // 10
         "      - {role: target_shard, rank: 0, device: cuda:0}\n"                                          // 11
         "      - {role: draft_worker, device: cpu}\n"                                                      // 12
         "scheduler: {max_num_seqs: 64, max_num_batched_tokens: 2048, block_size: 16, kv_cache_bytes: 1GiB}\n"  // 13
         "autoscale: {min_replicas: 0, max_replicas: 1, warm_pool: 0}\n";                                  // 14
}

inline std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the base YAML";
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << "'" << from << "' is ambiguous";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// Parses as "t.yaml", with MODEL (when present) standing for the default model.
inline Expected<Topology> parse(std::string yaml) {
  if (const size_t at = yaml.find("MODEL"); at != std::string::npos) yaml.replace(at, 5, model_name());
  return parse_topology(yaml, "t.yaml", model_dir());
}


}  // namespace specserve::topology_testing
