// specserve model: one GGUF file opened, its tokenizer built and its transformer loaded onto a
// backend — what every process that serves a model does first.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace specserve {

/// A GGUF file, its tokenizer and its transformer on a backend. The file stays mapped: the
/// tokenizer and chat template read it.
struct LoadedModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Transformer> model;
  double load_seconds = 0;  ///< wall time of open + tokenizer + weights
};

/// Loads `path` onto `backend`; logs the model's shape unless `quiet`. `options`: as
/// Transformer::load (a tensor-parallel shard: tp_rank, tp_size, communicator). Errors name the
/// file (and the field for corrupt files); a missing default model says how to fetch it.
Expected<LoadedModel> load_model(const std::string& path, Backend& backend, bool quiet = false,
                                 const LoadOptions& options = {});

}  // namespace specserve
