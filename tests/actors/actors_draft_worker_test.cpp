// A draft worker as its own actor beside the target shard (actors/draft_worker.h), in one process
// on the real default model: greedy output stays the target's, and each draft keeps its source.
#include <gtest/gtest.h>

#include "tests/actors/actors_cluster_fixture.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using namespace actors_testing;  // NOLINT: the shared in-process cluster helpers

TEST(ActorsDraftWorker, SeparateDraftWorkerActorKeepsGreedyOutputAndDrafts) {
  // draft_model with the target itself as the draft: every greedy draft is accepted.
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kDraftModel;
  s.model = testing::default_model_path();
  s.num_speculative_tokens = 3;
  Cluster c(s, /*draft_worker=*/true);
  auto st = c.client().status();
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(st->workers.size(), 2u);
  for (const auto& w : st->workers) EXPECT_EQ(w.state, "ready") << w.role << ": " << w.error;
  auto ps = prompts(c.head());
  auto r = c.client().generate(greedy(ps[2], 20));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->tokens, testing::greedy_reference(ps[2], 20));
  EXPECT_GT(r->num_drafts, 0);
  EXPECT_EQ(r->num_accepted_tokens, r->num_draft_tokens) << "a draft equal to the target must always be accepted";
  const ClusterStatus after = status_when(c.client(), [&](const ShardLoad& l) { return l.num_drafts >= r->num_drafts; });
  ASSERT_EQ(after.replicas.size(), 1u);
  const ShardLoad& l = after.replicas[0].load;
  EXPECT_EQ(l.num_accepted_tokens, r->num_accepted_tokens);
  ASSERT_EQ(l.accepted_per_pos.size(), 3u);
  EXPECT_EQ(sum(l.accepted_per_pos), l.num_accepted_tokens);
  EXPECT_EQ(l.accepted_per_pos[0], l.num_drafts) << "every draft's first token is accepted";
  EXPECT_EQ(l.prompt_tokens, static_cast<int64_t>(ps[2].size()));
  // Sampling goes through the sparse q path; the request completes with the asked length.
  GenerateRequest sr = greedy(ps[0], 12);
  sr.sampling.temperature = 0.8f;
  sr.sampling.seed = 7;
  sr.sampling.has_seed = true;
  auto r2 = c.client().generate(sr);
  ASSERT_TRUE(r2.ok()) << r2.status().to_string();
  EXPECT_EQ(r2->completion_tokens, 12);
  EXPECT_GT(r2->num_draft_tokens, 0);
}

TEST(ActorsDraftWorker, LookupFirstOnTheDraftWorkerKeepsEachDraftsSource) {
  // Prompt lookup first runs on the draft worker; who drafted travels back with each draft
  // (DraftReplySeq::source), so the shard counts the lookup's drafts apart from the model's.
  SpeculativeSpec s;
  s.method = SpeculativeMethod::kDraftModel;
  s.model = testing::default_model_path();
  s.num_speculative_tokens = 3;
  s.lookup_first = true;
  s.prompt_lookup_min = 2;
  s.prompt_lookup_max = 4;
  Cluster c(s, /*draft_worker=*/true);
  auto ps = prompts(c.head());
  int64_t drafts = 0;
  for (size_t i : {size_t{0}, size_t{2}}) {  // repetitive text (lookup matches), then a story
    auto r = c.client().generate(greedy(ps[i], 24));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tokens, testing::greedy_reference(ps[i], 24)) << "prompt " << i;
    drafts += r->num_drafts;
  }
  const ClusterStatus st = status_when(c.client(), [&](const ShardLoad& l) {
    return l.num_drafts >= drafts && l.num_running == 0 && l.num_waiting == 0;
  });
  ASSERT_EQ(st.replicas.size(), 1u);
  const ShardLoad& l = st.replicas[0].load;
  ASSERT_EQ(l.drafts_by_source.size(), static_cast<size_t>(kNumDraftSources));
  const int64_t lookup = l.drafts_by_source[static_cast<size_t>(DraftSource::kPromptLookup)];
  const int64_t model = l.drafts_by_source[static_cast<size_t>(DraftSource::kModel)];
  EXPECT_GT(lookup, 0) << "the lookup never drafted on repetitive text";
  EXPECT_GT(model, 0) << "the draft model never drafted";
  EXPECT_EQ(lookup + model, l.num_drafts);
  // The draft model is the target itself: its drafts are always accepted.
  EXPECT_EQ(l.accepted_by_source[static_cast<size_t>(DraftSource::kModel)],
            l.draft_tokens_by_source[static_cast<size_t>(DraftSource::kModel)]);
}

}  // namespace
}  // namespace specserve
