// actors/worker_config.h engine_options_for: a worker's engine gets the speculation settings of
// its topology (models.speculative), not the engine's defaults.
#include "actors/worker_config.h"

#include <gtest/gtest.h>

namespace specserve {
namespace {

ModelConfig small_model() {
  ModelConfig m;
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = 16;
  m.vocab_size = 100;
  m.context_length = 256;
  return m;
}

Topology topology() {
  Topology t;
  t.source = "(test)";
  t.scheduler.kv_cache_bytes = int64_t{8} << 20;
  return t;
}

TEST(WorkerConfig, SpeculationSettingsReachTheEngine) {
  Topology t = topology();
  auto plain = engine_options_for(t, small_model());
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  EXPECT_EQ(plain->num_speculative_tokens, 0);
  EXPECT_FALSE(plain->disable_by_goodput);
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kNgram;
  s.num_speculative_tokens = 5;
  s.disable_by_batch_size = 3;
  s.adaptive_k = false;
  s.disable_by_goodput = true;
  t.models.speculative = s;
  auto eo = engine_options_for(t, small_model());
  ASSERT_TRUE(eo.ok()) << eo.status().to_string();
  EXPECT_EQ(eo->num_speculative_tokens, 5);
  EXPECT_EQ(eo->disable_by_batch_size, 3);
  EXPECT_FALSE(eo->adaptive_k);
  EXPECT_TRUE(eo->disable_by_goodput);
}

}  // namespace
}  // namespace specserve
