#include "scheduler/rebalance.h"

#include <algorithm>

namespace specserve {

std::vector<Reclaim> plan_rebalance(std::vector<RebalanceLoad> loads, const RebalanceOptions& options) {
  std::erase_if(loads, [](const RebalanceLoad& l) { return l.max_num_seqs <= 0; });
  std::sort(loads.begin(), loads.end(), [](const RebalanceLoad& a, const RebalanceLoad& b) { return a.replica < b.replica; });
  std::vector<Reclaim> plan;
  if (loads.size() < 2) return plan;

  int64_t free_slots = 0, total = 0;
  int32_t least = loads.front().assigned;
  for (const RebalanceLoad& l : loads) {
    if (!l.kv_full) free_slots += std::max(0, l.max_num_seqs - l.assigned);
    total += std::max(0, l.assigned);
    least = std::min(least, l.assigned);
  }

  // Rule 1: requests waiting beyond a batch or for KV room, while batch slots are free on
  // replicas with cache room.
  for (const RebalanceLoad& l : loads) {
    if (free_slots <= 0) break;
    const int64_t kv_waiting = l.kv_full ? std::min(std::max(0, l.kv_waiting), std::max(0, l.assigned)) : 0;
    const int64_t waiting = std::max<int64_t>(static_cast<int64_t>(l.assigned) - l.max_num_seqs, kv_waiting);
    if (!l.eligible || waiting <= 0) continue;
    const auto n = static_cast<int32_t>(std::min(waiting, free_slots));
    plan.push_back({l.replica, n, false});
    free_slots -= n;
  }
  if (!plan.empty() || !options.running) return plan;

  // Rule 2: running sequences, toward an even share.
  const int64_t n_replicas = static_cast<int64_t>(loads.size());
  const int64_t share = (total + n_replicas - 1) / n_replicas;
  int64_t room = 0;
  for (const RebalanceLoad& l : loads) {
    if (l.assigned < share && !l.kv_full) room += std::min<int64_t>(share - l.assigned, std::max(0, l.max_num_seqs - l.assigned));
  }
  const int64_t gap = std::max(1, options.min_imbalance);
  for (const RebalanceLoad& l : loads) {
    if (room <= 0) break;
    if (!l.eligible || l.assigned - least < gap || l.assigned <= share) continue;
    const auto n = static_cast<int32_t>(std::min<int64_t>(l.assigned - share, room));
    plan.push_back({l.replica, n, true});
    room -= n;
  }
  return plan;
}

}  // namespace specserve
