// specserve spec: sparse draft distributions, so q can cross a process boundary.
//
// Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023) needs, for each draft
// token, the exact distribution q it was drawn from. Dense q is [vocab] floats per token (192 KiB
// at vocab 49152): far too much for an actor message. Two tools make it small without losing
// exactness:
//   - to_sparse / to_dense: an exact, lossless encoding of q's nonzero entries (the float values
//     are copied bit for bit, so the verifier sees the very q the drafter used);
//   - truncate_probs: makes q itself sparse (keep the top entries, renormalise). A proposer that
//     truncates q *before* drawing its token from it has simply used a different proposal
//     distribution; the rejection sampler is exact for any proposal q, so the output
//     distribution is still the target's (only the acceptance rate may drop).
// Pure: no threads, no I/O.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace specserve {

/// The nonzero entries of a distribution over a vocabulary: probs[i] is the probability of token
/// ids[i]. ids strictly increasing; ids.size() == probs.size(); every other id has probability 0.
struct SparseProbs {
  std::vector<int32_t> ids;
  std::vector<float> probs;
};

/// The nonzero entries of `dense` [vocab], in increasing id order, values copied exactly.
/// Entries that are +0, -0 or NaN are left out (q is non-negative by contract; NaN is no weight).
SparseProbs to_sparse(std::span<const float> dense);

/// Writes the dense distribution [vocab] of `sparse` into `out` (resized to vocab; absent ids 0).
/// Errors (kInvalidArgument, naming the index and value; `out` is left unchanged): vocab <= 0,
/// ids and probs of different lengths, an id outside [0, vocab), ids not strictly increasing
/// (a duplicate), a probability that is negative or not finite.
Status to_dense(const SparseProbs& sparse, int32_t vocab, std::vector<float>* out);

/// Truncates the distribution `q` [vocab] in place to its largest entries and renormalises.
/// Entries are taken largest first (ties: the lower id first) until the kept mass reaches
/// keep_mass * (the total mass of q), or max_entries are kept, whichever comes first; at least
/// one entry is always kept. Every other entry becomes exactly 0 and the kept ones are divided
/// by their sum (so q sums to 1 up to float rounding). keep_mass >= 1 and max_entries <= 0 mean
/// "no limit" for that criterion. When nothing is zeroed, q is left bit-for-bit unchanged.
/// `q` must be non-negative with a positive finite sum (a caller bug otherwise: aborts).
/// Cost: O(vocab + m log m) for m kept entries at vocab 49152 (no full sort unless m ~ vocab).
void truncate_probs(std::vector<float>* q, double keep_mass, int32_t max_entries);

}  // namespace specserve
