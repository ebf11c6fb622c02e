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

/// kInvalidArgument when `file` is a draft-head file (general.architecture "medusa" or "eagle",
/// spec/head_common.h) rather than a model: "<path>: this is a medusa head
/// (general.architecture=medusa), not a target model; pass it in --speculative-config ...".
/// OK for anything else (an unsupported architecture is ModelConfig::from_gguf's to report).
Status check_not_head_file(const GgufFile& file);

/// The checks load_model() makes on `file` before reading any weight: not a head file
/// (check_not_head_file), then a supported architecture with consistent hyper-parameters and
/// tensor shapes (ModelConfig::from_gguf). Errors: theirs (kInvalidArgument, kUnsupported naming
/// general.architecture and the supported ones, kCorruptData).
Status check_model_file(const GgufFile& file);

/// Loads `path` onto `backend`; logs the model's shape unless `quiet`. `options`: as
/// Transformer::load (a tensor-parallel shard: tp_rank, tp_size, communicator). Errors name the
/// file (and the field for corrupt files); a missing default model says how to fetch it; a
/// Medusa / EAGLE head file is refused first (check_not_head_file), before its missing tokenizer.
Expected<LoadedModel> load_model(const std::string& path, Backend& backend, bool quiet = false,
                                 const LoadOptions& options = {});

}  // namespace specserve
