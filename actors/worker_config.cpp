#include "actors/worker_config.h"

#include <unistd.h>

#include <cstdio>
#include <optional>

#include "actors/backend_factory.h"
#include "actors/proposer_factory.h"
#include "model/gguf.h"
#include "model/model_loader.h"

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
  h.compute = compute_description(cfg.device.to_string());
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
    o.disable_by_goodput = s.disable_by_goodput;
    o.typical_acceptance = s.typical_acceptance;
    o.posterior_threshold = s.posterior_threshold;
    o.posterior_alpha = s.posterior_alpha;
  }
  SPECSERVE_RETURN_IF_ERROR(o.validate());
  return o;
}

Status check_kv_fits_memory(const Topology& t) {
  const int64_t pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0 && t.scheduler.kv_cache_bytes > pages * page) {
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f GiB", static_cast<double>(pages * page) / (1LL << 30));
    return invalid_argument(t.where("scheduler.kv_cache_bytes") + ": scheduler.kv_cache_bytes = " +
                            std::to_string(t.scheduler.kv_cache_bytes) + " is more than this machine's memory (" + gib + ")");
  }
  return Status();
}

Status check_kv_holds_one_sequence(const Topology& t, const EngineOptions& o, const ModelConfig& m) {
  const int64_t max_len = o.max_model_len > 0 ? o.max_model_len : m.context_length;
  if (max_len <= 0 || o.block_size <= 0) return Status();
  const int64_t need = (max_len + o.block_size - 1) / o.block_size;
  if (o.num_kv_blocks >= need) return Status();
  const int64_t per_block = 2 * m.num_layers * m.kv_dim() * static_cast<int64_t>(sizeof(float)) * o.block_size;
  const int64_t holds = o.num_kv_blocks * o.block_size;
  const std::string len_src = t.where("models.target.max_model_len");
  const std::string len_name = len_src.rfind("--", 0) == 0 ? len_src : std::string("models.target.max_model_len");
  char mib[32];
  std::snprintf(mib, sizeof mib, "%.1f MiB", static_cast<double>(need * per_block) / (1 << 20));
  return invalid_argument(
      t.where("scheduler.kv_cache_bytes") + ": scheduler.kv_cache_bytes = " + std::to_string(t.scheduler.kv_cache_bytes) +
      " holds " + std::to_string(o.num_kv_blocks) + (o.num_kv_blocks == 1 ? " KV block of " : " KV blocks of ") + std::to_string(o.block_size) + " tokens (" +
      std::to_string(holds) + " tokens), fewer than one sequence of max_model_len " + std::to_string(max_len) +
      (o.max_model_len > 0 ? "" : " (the model's context length)") + " needs (" + std::to_string(need) +
      " blocks): raise it to at least " + std::to_string(need * per_block) + " (" + mib + ") or set " + len_name +
      " to at most " + std::to_string(holds));
}

Status check_target_fits(const Topology& t, const ModelConfig& m, const std::string& model_path, bool cpu_pool,
                         bool check_memory) {
  const auto& len = t.models.target.max_model_len;
  if (len && m.context_length > 0 && *len > m.context_length) {
    const std::string where = t.where("models.target.max_model_len");
    const std::string field = where.rfind("--", 0) == 0 ? where : where + ": models.target.max_model_len";
    return invalid_argument(field + " = " + std::to_string(*len) + " exceeds the model's context length " +
                            std::to_string(m.context_length) + " (" + model_path + ")");
  }
  if (!cpu_pool) return Status();
  auto eo = engine_options_for(t, m);
  if (!eo.ok()) return eo.status();
  SPECSERVE_RETURN_IF_ERROR(check_kv_holds_one_sequence(t, *eo, m));
  return check_memory ? check_kv_fits_memory(t) : Status();
}

std::vector<ModelFileProblem> check_model_files(const Topology& t, bool cpu_pool, bool check_memory) {
  std::vector<ModelFileProblem> problems;
  const std::string& target_path = t.models.target.path;
  std::optional<GgufFile> target;
  if (auto f = GgufFile::open(target_path); !f.ok()) {
    problems.push_back({"models.target.path", target_path, f.status()});
  } else {
    target.emplace(std::move(*f));
    if (Status st = check_model_file(*target); !st.ok()) {
      problems.push_back({"models.target.path", target_path, st});
    } else if (auto cfg = ModelConfig::from_gguf(*target); cfg.ok()) {
      if (Status st = check_target_fits(t, *cfg, target_path, cpu_pool, check_memory); !st.ok()) {
        problems.push_back({"", "", st});
      }
    }
  }
  if (t.models.speculative) {
    const SpeculativeSpec& sp = *t.models.speculative;
    for (const SpeculativeFileProblem& p : check_speculative_files(sp, target ? &*target : nullptr)) {
      if (p.field != "model" && p.field != "speculative_token_tree") {  // "<field> = <value>: ..." already
        const std::string key = "models.speculative." + p.field;
        problems.push_back({"", "", Status(p.status.code(), t.where(key) + ": models.speculative." + p.status.message())});
        continue;
      }
      const std::string value = p.field == "model" ? sp.model : "\"" + sp.speculative_token_tree + "\"";
      problems.push_back({"models.speculative." + p.field, value, p.status});
    }
  }
  return problems;
}

}  // namespace specserve
