// Promotion with two real target shards in this process (tests/actors/elastic_fixtures.h
// RealShards): a request handed back from a busy engine, and running sequences moved to the
// promoted replica with their KV, finish there with exactly the tokens of the target alone.
#include "tests/actors/elastic_fixtures.h"

namespace specserve {
namespace {

using namespace elastic_testing;

// The target shard's side of the hand-back (reclaim_atom): two real shards in this process, each
// running one sequence at a time (max_num_seqs 1). Three requests go to replica 0 (one runs, two
// wait in its engine); the promotion of replica 1 takes the last admitted one, which finishes
// there with exactly the tokens of the target alone, its stream uninterrupted.
TEST(ElasticPromotionRealShards, HandedBackRequestFinishesOnThePromotedReplicaWithTheSameTokens) {
  RealShards c;
  ASSERT_NO_FATAL_FAILURE(c.start(/*max_num_seqs=*/1, int64_t{24} << 20, /*upscale_delay_s=*/0));
  const std::vector<std::string> texts = {"The history of the Roman Empire begins with", "A recipe for pancakes: first, take",
                                          "The three laws of motion state that"};
  constexpr int32_t kTokens = 24;
  const auto moves = c.expect_same_tokens(c.submit(texts, kTokens), texts, kTokens);
  ASSERT_EQ(moves.size(), 3u);
  EXPECT_GE(moves[2], 1) << "the last admitted request is the one handed back";
  // NOTE: when replica 1 finishes it, request 2 may still wait on replica 0 and be handed back
  // too (it then lands wherever a slot is free first, maybe replica 0 again): more than one
  // hand-back is allowed, each lossless.
  int32_t migrations = 0;
  for (int32_t m : moves) migrations += m;
  EXPECT_GE(migrations, 1);
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->migrated, migrations);
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  ASSERT_EQ(st->autoscale.promotion_seconds.size(), 1u) << describe(st);
  EXPECT_LE(st->autoscale.promotion_dispatch_seconds.at(0), st->autoscale.promotion_seconds[0]);
  for (const auto& r : st->replicas) {
    if (r.replica == 1) EXPECT_GE(r.load.generated_tokens, kTokens) << "replica 1 ran the handed-back request";
  }
}

// The target shard's side of a running rebalance: replica 0 runs 6 sequences at once
// (max_num_seqs 8) when replica 1 is promoted; 3 of them move with their KV mid-generation (or
// recompute where the data plane is unusable) and finish there with exactly the tokens of the
// target alone, their streams uninterrupted.
TEST(ElasticPromotionRealShards, RunningSequencesMoveToThePromotedReplicaWithTheSameTokens) {
  RealShards c;
  // upscale 0.5 s: the burst is admitted (and running) on replica 0 first.
  ASSERT_NO_FATAL_FAILURE(c.start(/*max_num_seqs=*/8, int64_t{32} << 20, /*upscale_delay_s=*/0.5));
  const std::vector<std::string> texts = {"The history of the Roman Empire begins with", "A recipe for pancakes: first, take",
                                          "The three laws of motion state that",           "Once upon a time, in a small village,",
                                          "The capital of France is",                      "To install Python on Linux, you"};
  constexpr int32_t kTokens = 96;
  const auto moves = c.expect_same_tokens(c.submit(texts, kTokens), texts, kTokens);
  ASSERT_EQ(moves.size(), texts.size());
  int32_t moved = 0;
  for (int32_t m : moves) moved += m > 0;
  EXPECT_EQ(moved, 3) << "6 on one replica, 0 on the other: 3 move";
  auto st = c.client->status();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->migrated, 3) << describe(st);
  EXPECT_EQ(st->autoscale.num_promotions, 1);
  ASSERT_EQ(st->autoscale.promotion_seconds.size(), 1u) << "measured on the first token of a moved sequence";
  EXPECT_LE(st->autoscale.promotion_dispatch_seconds.at(0), st->autoscale.promotion_seconds[0]);
  for (const auto& r : st->replicas) {
    // Each moved sequence had at least 16 tokens left (actors/target_shard.cpp), generated there.
    if (r.replica == 1) EXPECT_GE(r.load.generated_tokens, 3 * 16) << "replica 1 ran the moved sequences";
  }
}

}  // namespace
}  // namespace specserve
