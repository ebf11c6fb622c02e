// specserve kv: the chain hash that names a full KV block for automatic prefix caching.
//
// A block's hash covers its own token ids and, through its parent's hash, every token before
// it, so equal hashes mean equal prefixes (up to 64-bit collisions) and the KV of the block is
// the same wherever it was computed. Source: vLLM V1's automatic prefix caching
// (vllm/v1/core/kv_cache_utils.py hash_block_tokens), with xxHash3 in place of Python's hash.
// Pure functions, no state.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace specserve {

/// The hash of a full KV block (chained: it depends on every token up to the block's end).
using BlockHash = uint64_t;

/// The parent hash of a sequence's first block: a fixed seed, the same in every process.
inline constexpr BlockHash kRootBlockHash = 0x5350454353455256ull;  // "SPECSERV"

/// XXH3-64 of the block's token ids (int32, host byte order) seeded with `parent`.
/// `tokens` holds exactly one block's ids (any count is hashed; callers pass block_size).
/// NOTE: 64 bits, like vLLM V1's default builtin hash: two different prefixes collide with
/// probability ~n^2 / 2^65 for n cached blocks, negligible at any cache size this runtime
/// holds; the hash is not meant to resist an adversary crafting collisions.
BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens);

/// Extends `*hashes` (the hashes of the first hashes->size() full blocks of `tokens`) with the
/// hashes of every further full block of `tokens` (block_size >= 1 tokens each). A partial last
/// block gets no hash. Precondition: *hashes was computed from a prefix of these tokens.
void extend_block_hashes(std::span<const int32_t> tokens, int32_t block_size, std::vector<BlockHash>* hashes);

}  // namespace specserve
