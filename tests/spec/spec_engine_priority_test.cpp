// Tests for GenerateParams::priority through the Engine (the rules themselves are tested as
// tables in step_policy_test.cpp): the queue is served by priority, then arrival; aging lets a
// low priority through; priorities never change greedy output.
#include "tests/spec/spec_engine_fixtures.h"

namespace specserve {
namespace {

using namespace spec_testing;
using namespace spec_engine_testing;

/// Adds `reqs` in order, runs to the end; returns the request indices in the order they
/// emitted their first token, and each request's tokens.
std::pair<std::vector<size_t>, std::vector<Tokens>> run_order(EngineOptions o, Proposer* proposer, const std::vector<GenerateParams>& reqs) {
  std::vector<size_t> order;
  std::vector<Tokens> out(reqs.size());
  auto engine = Engine::create(target(), nullptr, proposer, o);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status().to_string();
    return {order, out};
  }
  Engine& e = **engine;
  std::map<int64_t, size_t> idx;
  for (size_t i = 0; i < reqs.size(); ++i) idx[*e.add_request(reqs[i])] = i;
  while (e.has_work()) {
    std::vector<SeqEvent> ev;
    if (!e.step(&ev).ok()) {
      ADD_FAILURE() << "step failed";
      break;
    }
    for (const SeqEvent& x : ev) {
      const size_t i = idx.at(x.seq_id);
      if (out[i].empty() && !x.tokens.empty()) order.push_back(i);
      out[i].insert(out[i].end(), x.tokens.begin(), x.tokens.end());
    }
  }
  return {order, out};
}

TEST(SpecEnginePriority, QueueServedByPriorityThenArrival) {
  std::mt19937 rng(31);
  std::vector<GenerateParams> reqs;
  const int32_t prio[] = {0, 5, -1, 0, 5, -1};
  for (int32_t p : prio) {
    reqs.push_back(greedy_request(random_tokens(rng, 6, 512), 6));
    reqs.back().priority = p;
  }
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  EngineOptions o = spec_options(0, 1);  // one sequence at a time: the queue order shows
  o.priority_aging_steps = 0;
  auto [order, out] = run_order(o, nullptr, reqs);
  EXPECT_EQ(order, (std::vector<size_t>{2, 5, 0, 3, 1, 4}));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out[i], plain.requests[i].tokens) << "request " << i;
  // With speculation and a batch of 2 the output is the same too.
  auto proposer = make_proposer(Method::kDraftModel);
  o = spec_options(4, 2);
  auto [order2, out2] = run_order(o, proposer.get(), reqs);
  EXPECT_EQ(order2, (std::vector<size_t>{2, 5, 0, 3, 1, 4}));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(out2[i], plain.requests[i].tokens) << "request " << i;
}

/// One slot; a priority-9 request and a priority-0 one arrive; each time a request finishes a
/// fresh priority-0 one arrives, until `num_fresh` have. Returns how many priority-0 requests
/// started before the priority-9 one.
size_t fresh_served_before_low(int32_t aging_steps, int num_fresh) {
  std::mt19937 rng(5);
  EngineOptions o = spec_options(0, 1);
  o.priority_aging_steps = aging_steps;
  auto engine = Engine::create(target(), nullptr, nullptr, o);
  EXPECT_TRUE(engine.ok());
  Engine& e = **engine;
  GenerateParams low = greedy_request(random_tokens(rng, 4, 512), 3);  // 3 steps: prefill + 2 decodes
  low.priority = 9;
  const int64_t low_id = *e.add_request(low);
  int added = 1;
  e.add_request(greedy_request(random_tokens(rng, 4, 512), 3)).value();
  size_t started = 0;
  std::set<int64_t> seen;
  while (e.has_work()) {
    std::vector<SeqEvent> ev;
    EXPECT_TRUE(e.step(&ev).ok());
    for (const SeqEvent& x : ev) {
      if (!seen.insert(x.seq_id).second) continue;
      if (x.seq_id == low_id) return started;
      ++started;
    }
    for (const SeqEvent& x : ev) {
      if (x.finish != FinishReason::kNone && added < num_fresh) {
        e.add_request(greedy_request(random_tokens(rng, 4, 512), 3)).value();
        ++added;
      }
    }
  }
  return started;
}

TEST(SpecEnginePriority, AgingLetsALowPriorityThrough) {
  // Aging by one level per 2 waited steps: after 18 steps the priority-9 request ties with a
  // fresh priority-0 one and wins on arrival — the slot frees every 3 steps, so 6 went first.
  EXPECT_EQ(fresh_served_before_low(2, 12), 6u);
  // Without aging it waits until the supply ends.
  EXPECT_EQ(fresh_served_before_low(0, 12), 12u);
}

TEST(SpecEnginePriority, PreemptsTheLowestPriorityFirst) {
  // Two long requests and a KV cache that holds only one of them to the end: the priority-1
  // request (which arrived first) is preempted for the priority-0 one, which never is.
  std::mt19937 rng(9);
  std::vector<GenerateParams> reqs;
  reqs.push_back(greedy_request(random_tokens(rng, 20, 512), 40));
  reqs.back().priority = 1;
  reqs.push_back(greedy_request(random_tokens(rng, 20, 512), 40));
  RunResult plain = run_engine(target(), nullptr, nullptr, spec_options(0, 1), reqs);
  NgramProposer ngram(1, 3);
  class CountingProposer final : public Proposer {
   public:
    explicit CountingProposer(Proposer* p) : p_(p) {}
    std::string name() const override { return "counting"; }
    Status propose(const std::vector<DraftRequest>& r, std::vector<DraftTree>* out) override { return p_->propose(r, out); }
    void release(int64_t id) override {
      ++releases[id];
      p_->release(id);
    }
    std::map<int64_t, int> releases;

   private:
    Proposer* p_;
  } counting(&ngram);
  EngineOptions o = spec_options(2, 2);
  o.block_size = 4;
  o.num_kv_blocks = 24;  // 96 tokens; each request grows to 60
  RunResult got = run_engine(target(), nullptr, &counting, o, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got.requests[i].tokens, plain.requests[i].tokens) << "request " << i;
  EXPECT_GT(counting.releases[1], 1) << "the priority-1 request was never preempted";
  EXPECT_EQ(counting.releases[2], 1) << "the priority-0 request was preempted";
  // EngineStats::num_preemptions (/metrics' specserve:num_preemptions) counts each one: every
  // release but the one at the end of each request. None without the KV shortage.
  EXPECT_EQ(got.stats.num_preemptions, counting.releases[1] - 1 + counting.releases[2] - 1);
  EXPECT_EQ(plain.stats.num_preemptions, 0);
}

}  // namespace
}  // namespace specserve
