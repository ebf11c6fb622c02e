// specserve actors: GPU memory planning — how many KV blocks a worker on cuda:N allocates once
// its weights (the target's, and an in-process draft's or heads') are on the device.
//
// Semantics of `gpu_memory_utilization` follow vLLM (vllm/config/cache.py, v1/worker/
// gpu_worker.py determine_available_memory): the fraction of the device's TOTAL memory this worker
// may use, default 0.9. The KV budget is
//     total * gpu_memory_utilization - (memory this worker already holds) - activations - reserve
// and never more than the device has free now (other processes' memory is not ours to take).
// Several workers sharing one device (a target shard and a draft worker on the same cuda:N) each
// stay within their own fraction; the topology checks that their fractions sum to at most 1.
//
// A target and an in-process draft that keeps its own KV (draft_model, layer_skip, EAGLE) get the
// same number of blocks, of the same block_size: every token a sequence holds in the target's
// cache it also holds in the draft's. So the budget is split in proportion to their block sizes,
// as vLLM v0's spec-decode worker did (spec_decode_worker.py split_num_cache_blocks_evenly).
//
// plan_gpu_memory is pure arithmetic (CPU-testable); DeviceMemoryBudget measures the device.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "model/backend.h"
#include "model/model_config.h"
#include "spec/engine.h"

namespace specserve {

/// vLLM's default `gpu_memory_utilization`.
inline constexpr double kDefaultGpuMemoryUtilization = 0.9;

/// Bytes of a worker not counted by the planner's inputs and kept free: its CUDA context, cuBLAS
/// handle and workspace, allocator rounding (vLLM measures these as "non-torch memory"; here
/// they are not measured, so they are reserved).
inline constexpr int64_t kGpuReservedBytes = int64_t{1} << 30;

/// What a worker has and wants on its device. Sizes in bytes, lengths in tokens.
struct GpuMemoryInputs {
  std::string device;                 ///< "cuda:N", for messages
  int64_t total_bytes = 0;            ///< the device's memory
  int64_t free_bytes = 0;             ///< free on the device now, this worker's weights already loaded
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;  ///< (0, 1]: this worker's share of total_bytes
  int64_t weight_bytes = 0;           ///< this worker's target weights on the device
  int64_t draft_weight_bytes = 0;     ///< an in-process draft model's or heads' weights; 0: none
  int64_t activation_bytes = 0;       ///< scratch of one forward pass of max_num_batched_tokens rows
  int64_t reserved_bytes = kGpuReservedBytes;
  int64_t target_block_bytes = 0;     ///< one target KV block (K and V, its layers); 0: no target KV (a draft worker)
  int64_t draft_block_bytes = 0;      ///< one draft KV block of the same block_size; 0: no draft KV
  int32_t block_size = 16;            ///< tokens per block, >= 1
  int64_t max_model_len = 0;          ///< the longest sequence, >= 1
  int64_t max_num_seqs = 1;           ///< sequences running at once, >= 1
  /// Names of the settings a message tells the user to change (the flag or the YAML field).
  std::string utilization_field = "gpu_memory_utilization";
  std::string max_model_len_field = "max_model_len";
};

struct GpuMemoryPlan {
  /// Blocks of the target's pool and, when draft_block_bytes > 0, of the draft's (the same count).
  int64_t num_kv_blocks = 0;
  int64_t budget_bytes = 0;   ///< bytes the KV pools could take
  int64_t kv_bytes = 0;       ///< bytes they do take: num_kv_blocks * (target + draft block bytes)
  /// The device had less free memory than this worker's fraction allows (another process holds it).
  bool limited_by_free = false;
  std::string summary;        ///< one line for the log: device, fraction, MiB of each part, blocks
};

/// The number of KV blocks for the target's pool (and an in-process draft's) on one device:
/// budget = min(total * utilization - weights - draft weights, free) - activations - reserve,
/// blocks = budget / (target_block_bytes + draft_block_bytes), at most max_num_seqs sequences of
/// max_model_len (more would only hold prefix cache nobody admitted can use; the rest of the
/// fraction stays free).
/// Errors: kInvalidArgument for inputs out of range (utilization outside (0, 1], no block bytes,
/// block_size, max_model_len or max_num_seqs < 1); kResourceExhausted when one sequence of
/// max_model_len tokens does not fit (vLLM's check), with a message naming the device, the MiB
/// free and needed, each part of the sum, and the fields to change (utilization_field,
/// max_model_len_field, max_num_batched_tokens).
Expected<GpuMemoryPlan> plan_gpu_memory(const GpuMemoryInputs& in);

/// Bytes of one KV block: K and V, `num_layers` layers, `block_size` slots of `kv_dim` fp32
/// (the layout of CpuBackend's and CudaBackend's KvStorage).
int64_t kv_block_bytes(int64_t num_layers, int64_t kv_dim, int64_t block_size);

/// Scratch of one forward pass of `rows` rows of `c` (model/transformer.cpp's buffers: hidden,
/// q, k, v, attention output, MLP, and every row's logits, in fp32), with the 1.25x the
/// transformer allocates them with.
int64_t forward_activation_bytes(const ModelConfig& c, int64_t rows);

/// Called by a proposer with its own KV once its weights are on the device and before its KV is
/// allocated, with the bytes of one draft KV block (of the engine's block_size) and of the
/// draft's activations; returns the draft's num_kv_blocks. Errors pass through (the proposer's
/// build fails with them).
using DraftKvPlanner = std::function<Expected<int64_t>(int64_t draft_block_bytes, int64_t draft_activation_bytes)>;

/// A worker's memory on its device. Call target_loaded() once the target's weights are on the
/// worker's backend, then plan(). What the worker holds is counted from its backend
/// (Backend::weight_bytes: the target's weights, then an in-process draft's or heads', loaded on
/// the same backend), not from the device's free memory, so workers loading side by side on one
/// GPU do not count each other's memory as their own (vLLM counts its own process's allocations
/// the same way). On the CPU it is inactive and plan() is never needed. Not thread-safe.
class DeviceMemoryBudget {
 public:
  /// `device`: "cpu" or "cuda:N". Inactive on the CPU, or when the device's memory cannot be read
  /// (the backend's creation then fails with the reason).
  DeviceMemoryBudget(const std::string& device, double gpu_memory_utilization, std::string utilization_field);

  bool active() const { return active_; }
  /// Marks the end of the target's weights on `backend`, which must outlive this object and
  /// hold every weight of the worker: weights loaded after this count as the draft's.
  void target_loaded(const Backend& backend);
  /// Fills device, total, free, utilization, weight and draft weight bytes of `in` (the device
  /// now, the backend's weights) and runs plan_gpu_memory. Errors: those of plan_gpu_memory;
  /// kUnavailable when the device's memory cannot be read; kInternal before target_loaded() (a
  /// bug).
  Expected<GpuMemoryPlan> plan(GpuMemoryInputs in) const;

 private:
  std::string device_;
  std::string utilization_field_;
  double utilization_ = kDefaultGpuMemoryUtilization;
  bool active_ = false;
  const Backend* backend_ = nullptr;
  int64_t target_weight_bytes_ = 0;
};

/// The GpuMemoryInputs of an engine with `options` over `model` whose KV heads are split over
/// `tp_size` ranks (this rank holds 1/tp_size of them): target block bytes, activations of
/// max_num_batched_tokens rows, block_size, max_model_len (the model's context length when
/// options.max_model_len is 0) and max_num_seqs. The device fields are left for
/// DeviceMemoryBudget::plan.
GpuMemoryInputs engine_memory_inputs(const ModelConfig& model, const EngineOptions& options, int32_t tp_size = 1);

/// Sizes one engine's KV pool and its in-process draft's on a GPU, in the order a worker loads:
/// hand draft_planner() to the proposer's build (ProposerBuildOptions::plan_kv), then call
/// finish() before Engine::create. Both write options->num_kv_blocks. With an inactive budget
/// (the CPU) neither changes anything. `budget` and `options` must outlive it.
class EngineKvPlanner {
 public:
  EngineKvPlanner(const DeviceMemoryBudget& budget, GpuMemoryInputs target, EngineOptions* options)
      : budget_(budget), target_(std::move(target)), options_(options) {}

  /// Unset (empty) on an inactive budget. Else plans the target and the draft together: the
  /// draft's blocks are returned, the target's (the same count) set in options->num_kv_blocks.
  DraftKvPlanner draft_planner();
  /// When draft_planner() did not run (no proposer, or one without KV): plans the target alone
  /// (target.target_block_bytes 0, a draft worker: nothing to plan). Errors: plan_gpu_memory's.
  Status finish();
  /// The last plan's summary line ("" when none ran).
  const std::string& summary() const { return summary_; }

 private:
  Status apply(const GpuMemoryInputs& in);

  const DeviceMemoryBudget& budget_;
  GpuMemoryInputs target_;
  EngineOptions* options_;
  bool planned_ = false;
  std::string summary_;
};

}  // namespace specserve
