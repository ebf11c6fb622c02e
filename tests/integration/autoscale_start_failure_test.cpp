// A cold start that cannot succeed, with real processes: `specserve up` under scale from zero
// whose model file is removed after it started. The worker exits kExitConfig with its reason
// (cluster/process.h); the launcher hands the reason to the head, which parks the replica at once:
// the waiting request fails now, naming the cause, instead of after 5 failed starts with only
// "exited". Once the file is back, a request after the backoff is served.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "tests/integration/up_process.h"

namespace specserve {
namespace {

using namespace cluster_testing;  // NOLINT: test helpers (tests/integration/up_process.h)
namespace fs = std::filesystem;

TEST(AutoscaleStartFailure, AModelFileGoneFailsTheWaitingRequestAtOnceWithTheWorkersReason) {
  fs::path model;
  UpProcess up([&](const std::string& dir, int port, int http) {
    model = fs::path(dir) / "m.gguf";  // relative in the topology: resolved from its folder
    fs::create_symlink(testing::default_model_path(), model);
    return "cluster: { name: startfail, token_file: " + dir + "/token }\n" +
           "head: { host: 127.0.0.1, actor_port: " + std::to_string(port) + ", http_port: " + std::to_string(http) + " }\n" +
           "models:\n  target: { path: m.gguf, max_model_len: 256 }\n"
           "nodes:\n  - { name: n0, host: 127.0.0.1, devices: [cpu], workers: [ { role: target_shard, replica: 0, device: cpu } ] }\n"
           "scheduler: { max_num_seqs: 2, kv_cache_bytes: 16MiB }\n"
           "autoscale: { min_replicas: 0, max_replicas: 1, warm_pool: 0, start_backoff_s: 4, start_backoff_max_s: 4 }\n";
  });
  Client* c = up.connect();
  ASSERT_NE(c, nullptr);

  fs::remove(model);
  const auto prompt = prompt_ids()[0];
  auto refused = c->generate(greedy(prompt, 4));
  ASSERT_FALSE(refused.ok()) << "served without its model file";
  const std::string m = refused.status().message();
  EXPECT_NE(m.find("no replica is left"), std::string::npos) << m;
  EXPECT_NE(m.find("exited with code 78"), std::string::npos) << m;
  EXPECT_NE(m.find("models.target.path: 'm.gguf'"), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
  EXPECT_NE(m.find("; it is tried again in "), std::string::npos) << m;
  auto st = c->status();
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  ASSERT_EQ(st->replicas.size(), 1u);
  // One failed start, not kMaxStartFailures (5) waited for: the next would come 4 s later.
  EXPECT_EQ(st->replicas[0].num_start_failures, 1) << st->replicas[0].last_start_error;
  EXPECT_NE(st->replicas[0].last_start_error.find("No such file or directory"), std::string::npos)
      << st->replicas[0].last_start_error;

  // The file back: a request after the backoff starts the replica again and is served.
  fs::create_symlink(testing::default_model_path(), model);
  const auto expected = testing::greedy_reference(prompt, 4);
  Expected<GenerateResult> served = refused.status();
  ASSERT_TRUE(until(60, [&] {
    served = c->generate(greedy(prompt, 4));
    return served.ok();
  })) << served.status().to_string();
  EXPECT_EQ(served->tokens, expected);
  EXPECT_EQ(up.terminate(60), 0);
}

}  // namespace
}  // namespace specserve
