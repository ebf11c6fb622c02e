#include "spec/sparse_probs.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace specserve {

SparseProbs to_sparse(std::span<const float> dense) {
  SparseProbs s;
  for (size_t i = 0; i < dense.size(); ++i) {
    const float p = dense[i];
    if (p != 0.0f && !std::isnan(p)) {
      s.ids.push_back(static_cast<int32_t>(i));
      s.probs.push_back(p);
    }
  }
  return s;
}

Status to_dense(const SparseProbs& s, int32_t vocab, std::vector<float>* out) {
  if (vocab <= 0) return invalid_argument("vocab = " + std::to_string(vocab) + ": must be > 0");
  if (s.ids.size() != s.probs.size()) {
    return invalid_argument("sparse probabilities: " + std::to_string(s.ids.size()) + " ids but " +
                            std::to_string(s.probs.size()) + " probabilities");
  }
  // Validate everything before touching `out`, so a bad message leaves the caller's buffer intact.
  for (size_t i = 0; i < s.ids.size(); ++i) {
    const int32_t id = s.ids[i];
    if (id < 0 || id >= vocab) {
      return invalid_argument("sparse probabilities: ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                              " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
    if (i > 0 && id <= s.ids[i - 1]) {
      return invalid_argument("sparse probabilities: ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                              " does not follow ids[" + std::to_string(i - 1) + "] = " + std::to_string(s.ids[i - 1]) +
                              " (ids must be strictly increasing)");
    }
    const float p = s.probs[i];
    if (!(p >= 0.0f) || !std::isfinite(p)) {
      return invalid_argument("sparse probabilities: probs[" + std::to_string(i) + "] = " + std::to_string(p) +
                              " (token " + std::to_string(id) + ") must be finite and >= 0");
    }
  }
  out->assign(static_cast<size_t>(vocab), 0.0f);
  for (size_t i = 0; i < s.ids.size(); ++i) (*out)[static_cast<size_t>(s.ids[i])] = s.probs[i];
  return Status();
}

void truncate_probs(std::vector<float>* q_ptr, double keep_mass, int32_t max_entries) {
  std::vector<float>& q = *q_ptr;
  std::vector<int32_t> idx;  // the nonzero entries
  double total = 0.0;
  for (size_t i = 0; i < q.size(); ++i) {
    SPECSERVE_CHECK(q[i] >= 0.0f, "truncate_probs: q[" + std::to_string(i) + "] = " + std::to_string(q[i]) + " is not >= 0");
    if (q[i] > 0.0f) {
      idx.push_back(static_cast<int32_t>(i));
      total += q[i];
    }
  }
  SPECSERVE_CHECK(total > 0.0 && std::isfinite(total), "truncate_probs: q must have a positive finite sum");
  const size_t nnz = idx.size();
  const size_t limit = max_entries > 0 ? std::min(nnz, static_cast<size_t>(max_entries)) : nnz;
  const bool mass_limited = keep_mass < 1.0;  // NaN: no mass limit
  if (!mass_limited && limit == nnz) return;
  const double target = keep_mass * total;

  // Largest first, ties to the lower id: a strict total order, so the kept set never depends on
  // the sort's implementation.
  auto larger = [&q](int32_t a, int32_t b) {
    const float qa = q[static_cast<size_t>(a)], qb = q[static_cast<size_t>(b)];
    return qa != qb ? qa > qb : a < b;
  };
  // NOTE: sorting the whole vocabulary per draft token would cost more than the small draft
  // model's step; instead sort in growing chunks (64, 128, ...) with partial_sort, so keeping m
  // entries costs O(nnz log m) and a typical nucleus of a few dozen tokens is one cheap pass.
  size_t kept = 0, sorted_end = 0, chunk = 64;
  double kept_mass = 0.0;
  while (kept < limit) {
    if (kept == sorted_end) {
      const size_t next = std::min(nnz, sorted_end + chunk);
      std::partial_sort(idx.begin() + static_cast<std::ptrdiff_t>(sorted_end), idx.begin() + static_cast<std::ptrdiff_t>(next),
                        idx.end(), larger);
      sorted_end = next;
      chunk *= 2;
    }
    kept_mass += q[static_cast<size_t>(idx[kept])];
    ++kept;
    if (mass_limited && kept_mass >= target) break;
  }
  if (kept == nnz) return;  // nothing dropped: leave q exactly as it was
  for (size_t i = kept; i < nnz; ++i) q[static_cast<size_t>(idx[i])] = 0.0f;
  const double inv = 1.0 / kept_mass;
  for (size_t i = 0; i < kept; ++i) {
    float& p = q[static_cast<size_t>(idx[i])];
    p = static_cast<float>(p * inv);
  }
}

}  // namespace specserve
