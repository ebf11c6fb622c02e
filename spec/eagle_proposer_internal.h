// specserve spec: what the EagleProposer's .cpp files share (not part of the public API).
//
// eagle_proposer_head.cpp (loading the head file, the head's forward pass, teacher forcing) and
// eagle_proposer.cpp (propose: catch-up, tree expansion and rerank; per-sequence state) both
// work on EagleProposer::SeqState and EagleProposer::Row, defined here.
// Include only from spec/eagle_proposer*.cpp.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_pool.h"
#include "spec/eagle_proposer.h"

namespace specserve {

/// A sequence's head state: its paged KV holds `tokens.size()` confirmed entries (positions
/// start, start + 1, ...: entry i is token `start + i` with the target's feature of the position
/// before), then this call's tree entries.
struct EagleProposer::SeqState {
  BlockTable blocks;
  int32_t start = 1;
  std::vector<int32_t> tokens;  ///< token of each confirmed entry
};

/// One input row of a head pass.
struct EagleProposer::Row {
  int32_t token = 0;
  int32_t position = 0;            ///< RoPE position (the token's position in the sequence)
  int32_t slot = 0;                ///< KV slot its K/V go to
  const float* feature = nullptr;  ///< host [d]: the feature of the position before
  bool want_logits = false;
};

}  // namespace specserve
