// specserve CLI: shared pieces of the subcommands — model loading and the default model.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "model/backend.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model/transformer.h"

namespace specserve::cli {

/// The default model's path: $SPECSERVE_MODEL, else the first existing of
/// <source>/models/SmolLM2-135M-Instruct.Q4_1.gguf and ~/.cache/specserve/models/...; when none
/// exists, the first candidate (so the error names where it was looked for).
std::string default_model_path();

/// A GGUF file, its tokenizer and its transformer on a backend.
struct LoadedModel {
  std::unique_ptr<GgufFile> file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Transformer> model;
  double load_seconds = 0;
};

/// Loads `path` onto `backend`. Errors name the file (and field for corrupt files).
Expected<LoadedModel> load_model(const std::string& path, Backend& backend, bool quiet = false);

}  // namespace specserve::cli
