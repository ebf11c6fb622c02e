#include "spec/step_policy.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

namespace specserve {

namespace {

/// Blocks that hold `num_tokens` tokens.
int32_t blocks_for(int64_t num_tokens, int32_t block_size) {
  return static_cast<int32_t>((num_tokens + block_size - 1) / block_size);
}

int64_t effective_priority(int32_t priority, int64_t num_steps_waited, const StepLimits& limits) {
  if (limits.priority_aging_steps <= 0) return priority;
  return static_cast<int64_t>(priority) - num_steps_waited / limits.priority_aging_steps;
}

/// A sequence that may run this step: running at the start, or admitted by this plan.
struct Live {
  RunningSeq seq;
  std::tuple<int64_t, int64_t, int64_t> rank;  // (effective priority, arrival, id): smaller first
  bool admitted = false;                       // admitted by this plan (holds no blocks)
  bool preempted = false;
  int32_t entry = -1;                          // index into the entries, -1 when not scheduled
  int32_t blocks_taken = 0;                    // blocks its entry took from `free` so far
  int32_t pending() const { return seq.num_tokens - seq.num_cached; }
  /// New blocks it needs to feed `rows` more tokens.
  int32_t need(int32_t rows, int32_t block_size) const {
    return std::max(0, blocks_for(static_cast<int64_t>(seq.num_cached) + rows, block_size) - seq.num_blocks);
  }
  /// The most rows it can feed with `num_blocks` new blocks.
  int32_t rows_within(int32_t num_blocks, int32_t block_size) const {
    return (seq.num_blocks + num_blocks) * block_size - seq.num_cached;
  }
};

struct Entry {
  ScheduledSeq s;
  int32_t live = 0;   // index into the Live vector
  bool removed = false;
};

void check_state(const StepState& state, const StepLimits& limits) {
  SPECSERVE_CHECK(state.block_size >= 1, "block_size " + std::to_string(state.block_size));
  SPECSERVE_CHECK(limits.max_num_seqs >= 1 && limits.max_num_batched_tokens >= 1, "limits below 1");
  for (const RunningSeq& r : state.running) {
    SPECSERVE_CHECK(r.num_cached >= 0 && r.num_cached < r.num_tokens && r.num_output_left >= 1 && r.num_blocks >= 0,
                    "running seq " + std::to_string(r.id));
  }
  for (const WaitingSeq& w : state.waiting) {
    SPECSERVE_CHECK(w.num_tokens >= 1 && w.num_cached >= 0 && w.num_cached < w.num_tokens && w.num_cached % state.block_size == 0 &&
                        static_cast<int64_t>(w.evictable_hit_blocks.size()) <= w.num_cached / state.block_size,
                    "waiting seq " + std::to_string(w.id));
  }
}

/// Distinct evictable hit blocks of the waiting sequences in `admitted`: admitting them takes
/// these out of the free blocks.
int64_t claimed_evictable(const StepState& state, const std::vector<int64_t>& admitted) {
  std::unordered_set<int64_t> ids(admitted.begin(), admitted.end());
  std::unordered_set<int32_t> claimed;
  for (const WaitingSeq& w : state.waiting) {
    if (ids.count(w.id)) claimed.insert(w.evictable_hit_blocks.begin(), w.evictable_hit_blocks.end());
  }
  return static_cast<int64_t>(claimed.size());
}

/// How many running sequences hold each shared block, so that a preemption frees a shared
/// block only with its last holder.
class SharedHolders {
 public:
  explicit SharedHolders(const StepState& state) {
    for (const RunningSeq& r : state.running) {
      for (int32_t b : r.shared_blocks) ++holders_[b];
    }
  }
  /// Blocks that preempting `r` frees (the running sequence's blocks; call once per victim).
  int64_t preempt(const RunningSeq& r) {
    int64_t freed = r.num_blocks - static_cast<int64_t>(r.shared_blocks.size());
    for (int32_t b : r.shared_blocks) freed += --holders_[b] == 0 ? 1 : 0;
    return freed;
  }

 private:
  std::unordered_map<int32_t, int32_t> holders_;
};

/// Live sequences of `state` (running ones, then the waiting ones in `admitted`), with ranks.
std::vector<Live> live_sequences(const StepState& state, const StepLimits& limits, const std::vector<int64_t>& admitted) {
  std::vector<Live> live;
  for (const RunningSeq& r : state.running) {
    live.push_back({r, {effective_priority(r.priority, r.num_steps_waited, limits), r.arrival, r.id}});
  }
  std::unordered_map<int64_t, const WaitingSeq*> waiting;
  for (const WaitingSeq& w : state.waiting) waiting[w.id] = &w;
  for (int64_t id : admitted) {
    const WaitingSeq& w = *waiting.at(id);
    RunningSeq r;
    r.id = w.id;
    r.priority = w.priority;
    r.arrival = w.arrival;
    r.num_tokens = w.num_tokens;
    r.num_cached = w.num_cached;  // its prefix-cache hit: whole blocks it will hold
    r.num_blocks = w.num_cached / state.block_size;
    r.num_output_left = 1;  // unused: an admitted sequence does not draft
    r.num_steps_waited = w.num_steps_waited;
    Live l{r, {effective_priority(w.priority, w.num_steps_waited, limits), w.arrival, w.id}};
    l.admitted = true;
    live.push_back(l);
  }
  return live;
}

/// Indices of `live` in rank order.
std::vector<int32_t> by_rank(const std::vector<Live>& live) {
  std::vector<int32_t> order(live.size());
  for (size_t i = 0; i < live.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return live[static_cast<size_t>(a)].rank < live[static_cast<size_t>(b)].rank; });
  return order;
}

StepPlan finish_plan(std::vector<int64_t> admitted, std::vector<int64_t> preempted, const std::vector<Entry>& entries, bool speculate) {
  StepPlan plan;
  plan.admitted = std::move(admitted);
  plan.preempted = std::move(preempted);
  plan.speculate = speculate;
  for (const Entry& e : entries) {
    if (e.removed) continue;
    plan.scheduled.push_back(e.s);
    plan.num_batched_tokens += e.s.rows;
  }
  return plan;
}

/// Rule 2: the waiting ids admitted, in admission order; `claimed` gets the evictable hit
/// blocks they take.
std::vector<int64_t> admit(const StepState& state, const StepLimits& limits, std::unordered_set<int32_t>* claimed) {
  const int32_t bs = state.block_size;
  int64_t free_for_admission = state.num_free_blocks;
  for (const RunningSeq& r : state.running) {
    free_for_admission -= std::max(0, blocks_for(r.num_tokens, bs) - r.num_blocks);
  }
  std::vector<const WaitingSeq*> queue;
  for (const WaitingSeq& w : state.waiting) queue.push_back(&w);
  std::sort(queue.begin(), queue.end(), [&](const WaitingSeq* a, const WaitingSeq* b) {
    return std::make_tuple(effective_priority(a->priority, a->num_steps_waited, limits), a->arrival, a->id) <
           std::make_tuple(effective_priority(b->priority, b->num_steps_waited, limits), b->arrival, b->id);
  });
  std::vector<int64_t> admitted;
  for (const WaitingSeq* w : queue) {
    if (static_cast<int64_t>(state.running.size() + admitted.size()) >= limits.max_num_seqs) break;
    int32_t need = blocks_for(static_cast<int64_t>(w->num_tokens) + 1, bs) - w->num_cached / bs;
    for (int32_t b : w->evictable_hit_blocks) need += claimed->count(b) ? 0 : 1;
    if (need > free_for_admission) break;  // head-of-line: nothing behind it jumps ahead
    free_for_admission -= need;
    claimed->insert(w->evictable_hit_blocks.begin(), w->evictable_hit_blocks.end());
    admitted.push_back(w->id);
  }
  return admitted;
}

}  // namespace

std::vector<int64_t> plan_admission(const StepState& state, const StepLimits& limits) {
  check_state(state, limits);
  std::unordered_set<int32_t> claimed;
  return admit(state, limits, &claimed);
}

Expected<StepPlan> plan_step(const StepState& state, const StepLimits& limits) {
  check_state(state, limits);
  const int32_t bs = state.block_size;

  // ---- 2. admission: rank order, head-of-line, against blocks not needed by running ones ----
  std::unordered_set<int32_t> claimed;  // evictable hit blocks promised to admitted sequences
  std::vector<int64_t> admitted = admit(state, limits, &claimed);
  std::vector<Live> live = live_sequences(state, limits, admitted);
  const std::vector<int32_t> order = by_rank(live);

  // ---- 3. speculation on or off for the whole step ----
  const bool speculate = limits.has_proposer && limits.num_speculative_tokens > 0 &&
                         (limits.disable_by_batch_size == 0 || static_cast<int32_t>(live.size()) <= limits.disable_by_batch_size);

  // ---- 4, 5. decode entries (1 + k rows), then prefill chunks, in rank order ----
  std::vector<Entry> entries;
  int32_t budget = limits.max_num_batched_tokens;
  for (int32_t i : order) {
    Live& l = live[static_cast<size_t>(i)];
    if (l.pending() != 1 || budget < 1) continue;
    int32_t k = 0;
    if (speculate && !l.admitted) {
      // Draft no further than the output can go: max_tokens, the context, the budget.
      k = std::min({l.seq.k, limits.num_speculative_tokens, l.seq.num_output_left - 1,
                    limits.max_model_len - l.seq.num_tokens - 1, budget - 1});
      k = std::max(k, 0);
    }
    l.entry = static_cast<int32_t>(entries.size());
    entries.push_back({{l.seq.id, false, 1 + k, k, true}, i});
    budget -= 1 + k;
  }
  for (int32_t i : order) {
    Live& l = live[static_cast<size_t>(i)];
    if (l.pending() <= 1 || budget < 1) continue;
    const int32_t chunk = std::min(l.pending(), budget);
    l.entry = static_cast<int32_t>(entries.size());
    entries.push_back({{l.seq.id, true, chunk, 0, chunk == l.pending()}, i});
    budget -= chunk;
  }

  // ---- 6. KV blocks: every entry's own tokens first (preempting the last-ranked sequences),
  // then the draft rows with what is left ----
  std::vector<int64_t> preempted;
  int64_t free = state.num_free_blocks - static_cast<int64_t>(claimed.size());
  SharedHolders holders(state);
  auto preempt = [&](Live& v) {
    // Rule 2 admits only when every entry's own tokens fit, so victims are always running ones
    // (and no admitted sequence shares a victim's blocks).
    SPECSERVE_CHECK(!v.admitted, "seq " + std::to_string(v.seq.id) + " admitted and preempted in one plan");
    v.preempted = true;
    free += holders.preempt(v.seq) + v.blocks_taken;
    v.blocks_taken = 0;
    if (v.entry >= 0) entries[static_cast<size_t>(v.entry)].removed = true;
    preempted.push_back(v.seq.id);
  };
  for (Entry& e : entries) {
    if (e.removed) continue;
    Live& l = live[static_cast<size_t>(e.live)];
    const int32_t own_rows = e.s.rows - e.s.num_draft_tokens;
    const int32_t need = l.need(own_rows, bs);
    while (need > free) {
      Live* victim = nullptr;
      int num_alive = 0;
      for (Live& v : live) {
        if (v.preempted) continue;
        ++num_alive;
        if (!victim || v.rank > victim->rank) victim = &v;
      }
      if (victim == &l && num_alive == 1) {
        return resource_exhausted("seq " + std::to_string(l.seq.id) + ": KV cache too small for one sequence of " +
                                  std::to_string(l.seq.num_cached + own_rows) + " tokens (" + std::to_string(need + l.seq.num_blocks) +
                                  " blocks of " + std::to_string(bs) + " needed, " + std::to_string(free + l.seq.num_blocks) + " available)");
      }
      preempt(*victim);
      if (victim == &l) break;  // self-preemption: its entry left the plan
    }
    if (!l.preempted) {
      free -= need;
      l.blocks_taken = need;
    }
  }
  for (Entry& e : entries) {
    if (e.removed || e.s.num_draft_tokens == 0) continue;
    // NOTE: draft rows never preempt anything: losing them costs only speculation, while a
    // preemption costs a recompute. They get the blocks the entries' own tokens left free.
    Live& l = live[static_cast<size_t>(e.live)];
    int32_t need = l.need(e.s.rows, bs);
    if (need - l.blocks_taken > free) {
      const int32_t k = std::clamp(l.rows_within(static_cast<int32_t>(l.blocks_taken + free), bs) - 1, 0, e.s.num_draft_tokens);
      e.s.num_draft_tokens = k;
      e.s.rows = 1 + k;
      need = l.need(e.s.rows, bs);
    }
    free -= need - l.blocks_taken;
    l.blocks_taken = need;
  }
  return finish_plan(std::move(admitted), std::move(preempted), entries, speculate);
}

StepPlan plan_prefill_after_drafts(const StepState& state, const StepLimits& limits, StepPlan plan,
                                   std::span<const int32_t> num_drafted) {
  SPECSERVE_CHECK(num_drafted.size() == plan.scheduled.size(),
                  std::to_string(num_drafted.size()) + " draft counts for " + std::to_string(plan.scheduled.size()) + " entries");
  const int32_t bs = state.block_size;
  std::vector<Live> live = live_sequences(state, limits, plan.admitted);
  std::unordered_map<int64_t, int32_t> index;
  for (size_t i = 0; i < live.size(); ++i) index[live[i].seq.id] = static_cast<int32_t>(i);
  for (int64_t id : plan.preempted) live[static_cast<size_t>(index.at(id))].preempted = true;

  int64_t free = state.num_free_blocks - claimed_evictable(state, plan.admitted);
  SharedHolders holders(state);
  for (int64_t id : plan.preempted) free += holders.preempt(live[static_cast<size_t>(index.at(id))].seq);
  std::vector<Entry> entries;
  int32_t budget = limits.max_num_batched_tokens;
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    ScheduledSeq s = plan.scheduled[i];
    SPECSERVE_CHECK(num_drafted[i] >= 0 && num_drafted[i] <= s.num_draft_tokens,
                    "seq " + std::to_string(s.id) + ": " + std::to_string(num_drafted[i]) + " drafted of " + std::to_string(s.num_draft_tokens));
    if (!s.is_prefill) {
      s.num_draft_tokens = num_drafted[i];
      s.rows = 1 + s.num_draft_tokens;
    }
    const int32_t li = index.at(s.id);
    Live& l = live[static_cast<size_t>(li)];
    l.entry = static_cast<int32_t>(entries.size());
    l.blocks_taken = l.need(s.rows, bs);
    free -= l.blocks_taken;
    budget -= s.rows;
    entries.push_back({s, li});
  }
  SPECSERVE_CHECK(free >= 0 && budget >= 0, "the plan given exceeds the KV cache or the token budget");

  // Left-out decodes (a row each, no drafts), kept before the prefill entries.
  const std::vector<int32_t> order = by_rank(live);
  size_t num_decode = 0;
  while (num_decode < entries.size() && !entries[num_decode].s.is_prefill) ++num_decode;
  for (int32_t i : order) {
    Live& l = live[static_cast<size_t>(i)];
    if (budget < 1) break;
    if (l.preempted || l.entry >= 0 || l.pending() != 1 || l.need(1, bs) > free) continue;
    free -= l.need(1, bs);
    budget -= 1;
    entries.insert(entries.begin() + static_cast<std::ptrdiff_t>(num_decode++), {{l.seq.id, false, 1, 0, true}, i});
    l.entry = 0;  // scheduled (the index itself is not used below)
  }
  // Longer chunks for prefill entries that do not complete.
  for (Entry& e : entries) {
    if (budget < 1) break;
    if (!e.s.is_prefill || e.s.completes) continue;
    Live& l = live[static_cast<size_t>(e.live)];
    const int32_t rows = std::min({l.pending(), e.s.rows + budget, l.rows_within(static_cast<int32_t>(l.blocks_taken + free), bs)});
    if (rows <= e.s.rows) continue;
    const int32_t need = l.need(rows, bs);
    free -= need - l.blocks_taken;
    l.blocks_taken = need;
    budget -= rows - e.s.rows;
    e.s.rows = rows;
    e.s.completes = rows == l.pending();
  }
  // Prefill chunks for sequences the plan left out.
  for (int32_t i : order) {
    Live& l = live[static_cast<size_t>(i)];
    if (budget < 1) break;
    if (l.preempted || l.entry >= 0 || l.pending() <= 1) continue;
    const int32_t rows = std::min({l.pending(), budget, l.rows_within(static_cast<int32_t>(free), bs)});
    if (rows < 1) continue;
    free -= l.need(rows, bs);
    budget -= rows;
    entries.push_back({{l.seq.id, true, rows, 0, rows == l.pending()}, i});
    l.entry = 0;
  }
  return finish_plan(std::move(plan.admitted), std::move(plan.preempted), entries, plan.speculate);
}

}  // namespace specserve
