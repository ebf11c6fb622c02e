// specserve CLI: shared pieces of the subcommands — model loading and the default model.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "cpu/tensor_parallel.h"
#include "model/backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "model/model_loader.h"

namespace specserve::cli {

/// The default model's path: $SPECSERVE_MODEL, else the first existing of
/// <source>/models/SmolLM2-135M-Instruct.Q4_1.gguf and ~/.cache/specserve/models/...; when none
/// exists, the first candidate (so the error names where it was looked for).
std::string default_model_path();

/// The process exit status for a failed command: 2 when `st` is bad input the user can fix
/// (kInvalidArgument, kNotFound, kCorruptData, kOutOfRange: a flag, a JSON field, a missing or
/// corrupt file, a prompt past the context), 1 otherwise (a failure of the run itself).
inline int exit_status_for(const Status& st) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kCorruptData:
    case StatusCode::kOutOfRange:
      return 2;
    default:
      return 1;
  }
}

using specserve::LoadedModel;
using specserve::load_model;

/// A model on the local CPU at a tensor-parallel size (vLLM's --tensor-parallel-size): 1 is
/// one CpuBackend (or, from load_model_on_device, one CudaBackend); N > 1 is N ranks as threads (cpu/tensor_parallel.h), the CPU threads split
/// between them, rank 0's model in `lm`. Members are destroyed model first.
struct CpuModel {
  std::unique_ptr<Backend> own_backend;              ///< tp == 1
  std::unique_ptr<ThreadedTensorParallel> group;     ///< tp > 1
  LoadedModel lm;
  /// Rank 0's backend (the one the model's replicated weights live on).
  Backend& backend() { return group ? group->backend() : *own_backend; }
};

/// Loads `path` with `threads` CPU threads in all (0: every core) over `tensor_parallel_size`
/// ranks. Errors: those of load_model and ThreadedTensorParallel::create (a size above the
/// model's kv heads names tensor_parallel_size and its value).
Expected<std::unique_ptr<CpuModel>> load_cpu_model(const std::string& path, int threads, int tensor_parallel_size);

/// The model on `device` ("cpu" or "cuda:N": actors/backend_factory.h): on the CPU as
/// load_cpu_model; on a GPU one CudaBackend in own_backend (tensor_parallel_size must be 1: NCCL
/// is not built). Errors: those of load_cpu_model and make_backend_for_device (naming --device),
/// kInvalidArgument for cuda:N with tensor_parallel_size > 1.
Expected<std::unique_ptr<CpuModel>> load_model_on_device(const std::string& path, const std::string& device, int threads,
                                                         int tensor_parallel_size);

}  // namespace specserve::cli
