#include "spec/lookup_history.h"

#include <algorithm>

namespace specserve {

LookupHistory::LookupHistory(int32_t max_requests, int32_t min_n, int32_t max_n)
    : max_requests_(std::max(max_requests, 1)),
      min_n_(std::max(min_n, kMinN)),
      max_n_(std::max(std::max(min_n, kMinN), std::min(max_n, kMaxN))) {}

uint64_t LookupHistory::key(std::span<const int32_t> ngram) {
  // splitmix64 over (n, tokens); a collision is caught in lookup() by comparing n and the tokens.
  uint64_t h = 0x9E3779B97F4A7C15ull * (ngram.size() + 1);
  for (int32_t t : ngram) {
    h ^= static_cast<uint32_t>(t);
    h += 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
  }
  return h;
}

void LookupHistory::index_output(Output& o) {
  const int32_t len = static_cast<int32_t>(o.tokens.size());
  o.num_entries = 0;
  for (int32_t n = min_n_; n <= std::min(max_n_, len - 1); ++n) {
    // Earlier positions first, so the most recent occurrence wins.
    for (int32_t end = n; end < len; ++end) {
      index_[key(std::span<const int32_t>(o.tokens).subspan(static_cast<size_t>(end - n), static_cast<size_t>(n)))] =
          Where{o.serial, end, n};
      ++o.num_entries;
    }
  }
  live_entries_ += o.num_entries;
}

void LookupHistory::add(std::span<const int32_t> output) {
  if (static_cast<int32_t>(output.size()) < min_n_ + 1) return;
  Output o;
  o.serial = next_serial_++;
  const size_t keep = std::min(output.size(), static_cast<size_t>(kMaxTokensPerRequest));
  o.tokens.assign(output.begin(), output.begin() + static_cast<std::ptrdiff_t>(keep));
  ring_.push_back(std::move(o));
  index_output(ring_.back());
  if (static_cast<int32_t>(ring_.size()) > max_requests_) {
    live_entries_ -= ring_.front().num_entries;
    ring_.pop_front();
    // Rebuilt once stale entries (of evicted outputs) are as many as live ones: amortised, each
    // entry is rebuilt about once per time it is added.
    if (index_.size() > 2 * live_entries_ + 1024) {
      index_.clear();
      live_entries_ = 0;
      for (Output& r : ring_) index_output(r);
    }
  }
}

const LookupHistory::Output* LookupHistory::find(uint64_t serial) const {
  if (ring_.empty() || serial < ring_.front().serial) return nullptr;  // evicted
  const uint64_t i = serial - ring_.front().serial;
  return i < ring_.size() ? &ring_[static_cast<size_t>(i)] : nullptr;
}

std::vector<int32_t> LookupHistory::lookup(std::span<const int32_t> context, int32_t k, int32_t* matched) const {
  if (matched) *matched = 0;
  if (k < 1) return {};
  const int32_t len = static_cast<int32_t>(context.size());
  for (int32_t n = std::min(max_n_, len); n >= min_n_; --n) {
    const std::span<const int32_t> tail = context.subspan(static_cast<size_t>(len - n));
    const auto it = index_.find(key(tail));
    if (it == index_.end()) continue;
    const Output* o = find(it->second.serial);
    const int32_t end = it->second.end;
    if (o == nullptr || it->second.n != n || !std::equal(tail.begin(), tail.end(), o->tokens.begin() + (end - n))) continue;
    const int32_t take = std::min<int32_t>(k, static_cast<int32_t>(o->tokens.size()) - end);
    if (matched) *matched = n;
    return std::vector<int32_t>(o->tokens.begin() + end, o->tokens.begin() + end + take);
  }
  return {};
}

SequenceOutputs::SequenceOutputs(int32_t max_requests, int32_t min_n, int32_t max_n) {
  if (max_requests > 0) history_ = std::make_unique<LookupHistory>(max_requests, min_n, max_n);
}

void SequenceOutputs::observe(int64_t seq_id, std::span<const int32_t> tokens, int32_t prompt_len) {
  if (!history_) return;
  const size_t from = std::min(tokens.size(), static_cast<size_t>(std::max(prompt_len, 0)));
  const size_t len = std::min(tokens.size() - from, static_cast<size_t>(LookupHistory::kMaxTokensPerRequest));
  std::vector<int32_t>& out = last_[seq_id];
  if (len < out.size()) out.clear();  // started again (a new sequence under a reused id)
  // Outputs only grow, token for token: append what is new.
  out.insert(out.end(), tokens.begin() + static_cast<std::ptrdiff_t>(from + out.size()),
             tokens.begin() + static_cast<std::ptrdiff_t>(from + len));
}

void SequenceOutputs::release(int64_t seq_id) {
  auto it = last_.find(seq_id);
  if (it == last_.end()) return;
  history_->add(it->second);
  last_.erase(it);
}

std::vector<int32_t> SequenceOutputs::lookup(std::span<const int32_t> context, int32_t k, int32_t* matched) const {
  if (history_) return history_->lookup(context, k, matched);
  if (matched) *matched = 0;
  return {};
}

}  // namespace specserve
