#include "scheduler/dispatch.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace specserve {

int64_t effective_priority(const QueuedRequest& r, double now_s, const DispatchOptions& o) {
  if (!(o.aging_s > 0.0)) return r.priority;
  const double waited = std::max(0.0, now_s - r.enqueued_at_s);  // NaN -> 0
  // Saturate at a bound far beyond any real wait: int32 priorities stay exact below it.
  const double levels = std::min(std::floor(waited / o.aging_s), 1e15);
  return static_cast<int64_t>(r.priority) - static_cast<int64_t>(levels);
}

int64_t blocks_needed(int64_t num_tokens, int32_t block_size) {
  return (num_tokens + 1 + block_size - 1) / block_size;
}

namespace {

/// Why no replica could ever hold `r`, or "" when one could.
std::string reject_reason(const QueuedRequest& r, const std::vector<const ReplicaLoad*>& usable) {
  if (usable.empty()) return "";
  const int64_t positions = static_cast<int64_t>(r.num_tokens) + 1;
  int32_t max_len = 0;
  bool some_len_fits = false;
  const ReplicaLoad* biggest_kv = nullptr;  // among those whose max_model_len fits
  for (const ReplicaLoad* rep : usable) {
    max_len = std::max(max_len, rep->max_model_len);
    if (positions > rep->max_model_len) continue;
    some_len_fits = true;
    if (blocks_needed(r.num_tokens, rep->block_size) <= rep->total_kv_blocks) return "";
    if (!biggest_kv || static_cast<int64_t>(rep->total_kv_blocks) * rep->block_size >
                           static_cast<int64_t>(biggest_kv->total_kv_blocks) * biggest_kv->block_size) {
      biggest_kv = rep;
    }
  }
  if (!some_len_fits) {
    return "needs " + std::to_string(positions) + " token positions (" + std::to_string(r.num_tokens) +
           " known + 1 new) but the largest max_model_len of any replica is " + std::to_string(max_len);
  }
  return "needs " + std::to_string(blocks_needed(r.num_tokens, biggest_kv->block_size)) + " KV blocks of " +
         std::to_string(biggest_kv->block_size) + " tokens for " + std::to_string(positions) +
         " token positions but the largest replica KV cache holds " + std::to_string(biggest_kv->total_kv_blocks) +
         " blocks";
}

}  // namespace

DispatchPlan plan_dispatch(std::vector<QueuedRequest> queue, const std::vector<ReplicaLoad>& replicas, double now_s,
                           const DispatchOptions& options) {
  DispatchPlan plan;
  // NOTE: a replica reporting block_size <= 0 is a broken report, not a reason to abort the
  // head: it is left out of every decision, as if it had not reported yet.
  std::vector<const ReplicaLoad*> usable;
  for (const ReplicaLoad& r : replicas) {
    if (r.block_size > 0) usable.push_back(&r);
  }

  // Sort once by (effective priority, arrival_seq, id): a total order, so the plan never
  // depends on the order the queue was given in.
  struct Keyed {
    int64_t eff;
    const QueuedRequest* r;
  };
  std::vector<Keyed> order;
  order.reserve(queue.size());
  for (const QueuedRequest& r : queue) order.push_back({effective_priority(r, now_s, options), &r});
  std::sort(order.begin(), order.end(), [](const Keyed& a, const Keyed& b) {
    if (a.eff != b.eff) return a.eff < b.eff;
    if (a.r->arrival_seq != b.r->arrival_seq) return a.r->arrival_seq < b.r->arrival_seq;
    return a.r->id < b.r->id;
  });

  // What this plan has promised so far, per usable replica.
  std::vector<int64_t> free_left(usable.size()), num_seqs(usable.size());
  for (size_t i = 0; i < usable.size(); ++i) {
    free_left[i] = usable[i]->free_kv_blocks;
    num_seqs[i] = usable[i]->num_assigned;
  }
  const int64_t extra = std::max(0, options.max_queued_per_replica);

  bool blocked = false;
  for (const Keyed& k : order) {
    const QueuedRequest& r = *k.r;
    // Rejects are decided for the whole queue, even behind a blocked head: the client hears
    // "never" at once rather than after the queue drains.
    std::string why = reject_reason(r, usable);
    if (!why.empty()) {
      plan.reject.emplace_back(r.id, std::move(why));
      continue;
    }
    if (blocked) continue;
    int best = -1;
    for (size_t i = 0; i < usable.size(); ++i) {
      const ReplicaLoad& rep = *usable[i];
      if (!rep.ready) continue;
      if (static_cast<int64_t>(r.num_tokens) + 1 > rep.max_model_len) continue;
      if (blocks_needed(r.num_tokens, rep.block_size) > free_left[i]) continue;
      if (num_seqs[i] >= static_cast<int64_t>(rep.max_num_seqs) + extra) continue;
      if (best < 0) {
        best = static_cast<int>(i);
        continue;
      }
      const size_t b = static_cast<size_t>(best);
      const bool avoid_i = rep.replica == r.avoid_replica, avoid_b = usable[b]->replica == r.avoid_replica;
      if (avoid_i != avoid_b) {  // rule 6
        if (avoid_b) best = static_cast<int>(i);
        continue;
      }
      // A replica where the request runs at once beats one where it would wait in the engine.
      const bool now_i = num_seqs[i] < static_cast<int64_t>(rep.max_num_seqs);
      const bool now_b = num_seqs[b] < static_cast<int64_t>(usable[b]->max_num_seqs);
      const bool better = now_i != now_b                 ? now_i
                          : free_left[i] != free_left[b] ? free_left[i] > free_left[b]
                          : num_seqs[i] != num_seqs[b]   ? num_seqs[i] < num_seqs[b]
                                                         : rep.replica < usable[b]->replica;
      if (better) best = static_cast<int>(i);
    }
    if (best < 0) {
      blocked = true;
      plan.blocked_request_id = r.id;
      continue;
    }
    const size_t b = static_cast<size_t>(best);
    free_left[b] -= blocks_needed(r.num_tokens, usable[b]->block_size);
    ++num_seqs[b];
    plan.assign.push_back({r.id, usable[b]->replica});
  }
  return plan;
}

}  // namespace specserve
