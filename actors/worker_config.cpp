#include "actors/worker_config.h"

#include <unistd.h>

namespace specserve {

WorkerHello worker_hello(const WorkerConfig& cfg, const caf::actor& self, const std::string& state, const std::string& error) {
  WorkerHello h;
  h.token = cfg.token;
  h.node = cfg.node;
  h.role = worker_role_name(cfg.role);
  h.replica = cfg.replica;
  h.rank = cfg.rank;
  h.pid = static_cast<int32_t>(::getpid());
  h.state = state;
  h.error = error;
  h.self = self;
  return h;
}

Expected<EngineOptions> engine_options_for(const Topology& t, const ModelConfig& m) {
  EngineOptions o;
  o.max_num_seqs = t.scheduler.max_num_seqs;
  o.max_num_batched_tokens = t.scheduler.max_num_batched_tokens;
  o.block_size = t.scheduler.block_size;
  o.enable_prefix_caching = t.scheduler.enable_prefix_caching;
  if (t.models.target.max_model_len) o.max_model_len = *t.models.target.max_model_len;
  const int64_t per_token = 2 * m.num_layers * m.kv_dim() * static_cast<int64_t>(sizeof(float));
  const int64_t per_block = per_token * o.block_size;
  o.num_kv_blocks = per_block > 0 ? t.scheduler.kv_cache_bytes / per_block : 0;
  if (o.num_kv_blocks < 1) {
    return invalid_argument(t.where("scheduler.kv_cache_bytes") + ": scheduler.kv_cache_bytes = " +
                            std::to_string(t.scheduler.kv_cache_bytes) + " holds no KV block of " +
                            std::to_string(per_block) + " bytes for this model");
  }
  if (t.models.speculative) {
    const SpeculativeSpec& s = *t.models.speculative;
    o.num_speculative_tokens = s.num_speculative_tokens;
    o.disable_by_batch_size = s.disable_by_batch_size.value_or(0);
    o.adaptive_k = s.adaptive_k;
    o.typical_acceptance = s.typical_acceptance;
    o.posterior_threshold = s.posterior_threshold;
    o.posterior_alpha = s.posterior_alpha;
  }
  SPECSERVE_RETURN_IF_ERROR(o.validate());
  return o;
}

}  // namespace specserve
