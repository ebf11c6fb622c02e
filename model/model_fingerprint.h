// specserve model: a 64-bit fingerprint of a GGUF model, for checking that two workers hold the
// same model before one imports the other's KV cache (kv/transfer.h's KvBlockHeader).
//
// The fingerprint is XXH3-64 over, in order: general.architecture; every `<arch>.*` metadata key
// (hyper-parameters: layers, heads, rope, norm eps, ...) with its type and value; every tensor's
// name, GGML type and shape; and a sample of each tensor's bytes (its first and last 4 KiB).
// Two files that differ only in names outside `<arch>.*` (general.name, tokenizer, chat template)
// fingerprint the same: their KV caches are interchangeable.
#pragma once

#include <cstdint>

#include "model/gguf.h"

namespace specserve {

/// The fingerprint of `file` (see above). Deterministic across processes, hosts and runs;
/// reads at most 8 KiB of each tensor's data.
/// NOTE: the sampled bytes are what tells two fine-tunes of one architecture apart (same names,
/// types and shapes); hashing every byte would read the whole model (gigabytes) at start-up,
/// while a fine-tune changes every tensor, its first and last bytes included.
uint64_t model_fingerprint(const GgufFile& file);

}  // namespace specserve
