#include "actors/gpu_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "actors/backend_factory.h"

namespace specserve {
namespace {

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string fraction(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

}  // namespace

int64_t kv_block_bytes(int64_t num_layers, int64_t kv_dim, int64_t block_size) {
  return 2 * num_layers * kv_dim * block_size * static_cast<int64_t>(sizeof(float));
}

int64_t forward_activation_bytes(const ModelConfig& c, int64_t rows) {
  return rows * 4 * (3 * c.hidden_size + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.ffn_size + c.vocab_size) * 5 / 4;
}

Expected<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryInputs& in) {
  const double u = in.gpu_memory_utilization;
  if (!(u > 0.0 && u <= 1.0)) {
    return invalid_argument(in.utilization_field + " = " + fraction(u) + ": must be in (0, 1] (a fraction of " + in.device +
                            "'s total memory)");
  }
  if (in.target_block_bytes < 0 || in.draft_block_bytes < 0 || in.target_block_bytes + in.draft_block_bytes <= 0) {
    return invalid_argument(in.device + ": memory planning without a KV block to size (target " +
                            std::to_string(in.target_block_bytes) + " B, draft " + std::to_string(in.draft_block_bytes) + " B)");
  }
  if (in.block_size < 1 || in.max_model_len < 1 || in.max_num_seqs < 1) {
    return invalid_argument(in.device + ": memory planning needs block_size, max_model_len and max_num_seqs >= 1 (got " +
                            std::to_string(in.block_size) + ", " + std::to_string(in.max_model_len) + ", " +
                            std::to_string(in.max_num_seqs) + ")");
  }
  const int64_t allowed = static_cast<int64_t>(std::floor(static_cast<double>(in.total_bytes) * u));
  const int64_t in_use = in.weight_bytes + in.draft_weight_bytes;
  const int64_t overhead = in.activation_bytes + in.reserved_bytes;
  const int64_t by_fraction = allowed - in_use - overhead;
  // NOTE: vLLM refuses to start when free memory is below the fraction; here the pools shrink to
  // what is free instead (and the plan says so), since the weights are loaded already and a
  // smaller pool that runs beats a refusal. Not fitting one sequence is still an error below.
  const int64_t by_free = in.free_bytes - overhead;
  GpuMemoryPlan p;
  p.limited_by_free = by_free < by_fraction;
  p.budget_bytes = std::max<int64_t>(0, std::min(by_fraction, by_free));
  const int64_t per_block = in.target_block_bytes + in.draft_block_bytes;
  const int64_t fit = p.budget_bytes / per_block;
  const int64_t blocks_per_seq = (in.max_model_len + in.block_size - 1) / in.block_size;
  const std::string parts = in.utilization_field + " " + fraction(u) + " of " + mib(in.total_bytes) + " = " + mib(allowed) +
                            ", less " + mib(in.weight_bytes) + " of weights" +
                            (in.draft_weight_bytes ? " and " + mib(in.draft_weight_bytes) + " of draft weights" : std::string()) +
                            ", " + mib(in.activation_bytes) + " of activations and " + mib(in.reserved_bytes) + " reserved";
  if (fit < blocks_per_seq) {
    const int64_t need = blocks_per_seq * per_block;
    std::string msg = in.device + ": no room for the KV cache of one sequence of " + in.max_model_len_field + " " +
                      std::to_string(in.max_model_len) + " tokens: it needs " + mib(need) + " (" +
                      std::to_string(blocks_per_seq) + " blocks of " + std::to_string(per_block >> 10) + " KiB" +
                      (in.draft_block_bytes ? ", target and draft" : "") + ") but " +
                      mib(p.budget_bytes) + " remain (" + parts + "; " + mib(in.free_bytes) + " free on the device";
    if (p.limited_by_free) {
      msg += ", less than the fraction allows: other processes hold memory on " + in.device + "); free memory on " +
             in.device + ", or lower " + in.max_model_len_field + " or max_num_batched_tokens";
    } else {
      msg += "); raise " + in.utilization_field + ", or lower " + in.max_model_len_field + " or max_num_batched_tokens";
    }
    return resource_exhausted(msg);
  }
  p.num_kv_blocks = std::min(fit, blocks_per_seq * in.max_num_seqs);
  p.kv_bytes = p.num_kv_blocks * per_block;
  p.summary = in.device + ": " + std::to_string(p.num_kv_blocks) + " KV blocks of " + std::to_string(in.block_size) +
              " tokens" + (in.draft_block_bytes && in.target_block_bytes ? " each for the target and the draft" : "") + " (" +
              mib(p.kv_bytes) + " of " + mib(p.budget_bytes) + " available: " + parts + "; " + mib(in.free_bytes) +
              " free" + (p.limited_by_free ? ", less than the fraction allows" : "") + ")";
  return p;
}

DeviceMemoryBudget::DeviceMemoryBudget(const std::string& device, double util, std::string field)
    : device_(device), utilization_field_(std::move(field)), utilization_(util) {
  active_ = device_memory(device).ok();
}

void DeviceMemoryBudget::target_loaded(const Backend& backend) {
  backend_ = &backend;
  target_weight_bytes_ = backend.weight_bytes();
}

Expected<GpuMemoryPlan> DeviceMemoryBudget::plan(GpuMemoryInputs in) const {
  if (!backend_) return internal_error(device_ + ": memory planning before the target's weights were loaded (a bug)");
  auto m = device_memory(device_);
  if (!m.ok()) return m.status();
  in.device = device_;
  in.total_bytes = m->total_bytes;
  in.free_bytes = m->free_bytes;
  in.gpu_memory_utilization = utilization_;
  in.utilization_field = utilization_field_;
  in.weight_bytes = target_weight_bytes_;
  in.draft_weight_bytes = std::max<int64_t>(0, backend_->weight_bytes() - target_weight_bytes_);
  return plan_gpu_memory(in);
}

GpuMemoryInputs engine_memory_inputs(const ModelConfig& c, const EngineOptions& o, int32_t tp_size) {
  GpuMemoryInputs in;
  const int64_t tp = std::max<int32_t>(1, tp_size);
  in.target_block_bytes = kv_block_bytes(c.num_layers, c.kv_dim() / tp, o.block_size);
  in.activation_bytes = forward_activation_bytes(c, o.max_num_batched_tokens);
  in.block_size = o.block_size;
  in.max_model_len = o.max_model_len > 0 ? std::min<int64_t>(o.max_model_len, c.context_length) : c.context_length;
  in.max_num_seqs = o.max_num_seqs;
  return in;
}

Status EngineKvPlanner::apply(const GpuMemoryInputs& in) {
  auto p = budget_.plan(in);
  if (!p.ok()) return p.status();
  options_->num_kv_blocks = p->num_kv_blocks;
  summary_ = p->summary;
  planned_ = true;
  return Status();
}

DraftKvPlanner EngineKvPlanner::draft_planner() {
  if (!budget_.active()) return {};
  return [this](int64_t draft_block_bytes, int64_t draft_activation_bytes) -> Expected<int64_t> {
    GpuMemoryInputs in = target_;
    in.draft_block_bytes = draft_block_bytes;
    in.activation_bytes += draft_activation_bytes;
    SPECSERVE_RETURN_IF_ERROR(apply(in));
    return options_->num_kv_blocks;
  };
}

Status EngineKvPlanner::finish() {
  if (!budget_.active() || planned_ || target_.target_block_bytes == 0) return Status();
  return apply(target_);
}

}  // namespace specserve
