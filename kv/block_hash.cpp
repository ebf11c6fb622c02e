#include "kv/block_hash.h"

#include <xxhash.h>

#include "core/status.h"

namespace specserve {

BlockHash hash_block_tokens(BlockHash parent, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

void extend_block_hashes(std::span<const int32_t> tokens, int32_t block_size, std::vector<BlockHash>* hashes) {
  SPECSERVE_CHECK(block_size >= 1, "extend_block_hashes: block_size " + std::to_string(block_size));
  const size_t bs = static_cast<size_t>(block_size);
  for (size_t j = hashes->size(); (j + 1) * bs <= tokens.size(); ++j) {
    const BlockHash parent = j == 0 ? kRootBlockHash : (*hashes)[j - 1];
    hashes->push_back(hash_block_tokens(parent, tokens.subspan(j * bs, bs)));
  }
}

}  // namespace specserve
