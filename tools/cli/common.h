// specserve CLI: shared pieces of the subcommands — model loading and the default model.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
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

using specserve::LoadedModel;
using specserve::load_model;

}  // namespace specserve::cli
