// actors/messages.h: what crosses a process boundary survives CAF's binary serialisation. The
// in-process actor tests never serialise (CAF passes local messages by reference), so a field
// missing from an inspect() list would pass them and be lost between hosts.
#include "actors/messages.h"

#include <gtest/gtest.h>

#include <vector>

namespace specserve {
namespace {

template <class T>
T round_trip(T x) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  EXPECT_FALSE(sink(x)) << "serialising failed";
  T y;
  caf::binary_deserializer source{nullptr, buf};
  EXPECT_FALSE(source(y)) << "deserialising failed";
  EXPECT_EQ(source.remaining(), 0u) << "bytes left over";
  return y;
}

// Every field set to a value of its own, so a field left out of inspect() (then default) or two
// fields swapped in it show.
TEST(Messages, ShardLoadKeepsEveryFieldThroughSerialisation) {
  ShardLoad l;
  l.replica = 3;
  l.free_kv_blocks = 11;
  l.total_kv_blocks = 12;
  l.num_running = 13;
  l.num_waiting = 14;
  l.num_steps = 15;
  l.generated_tokens = 16;
  l.num_drafts = 17;
  l.num_draft_tokens = 18;
  l.num_accepted_tokens = 19;
  l.forward_seconds = 2.5;
  l.draft_seconds = 3.5;
  l.finished = {20, 21};
  l.received = 22;
  l.prompt_tokens = 23;
  l.accepted_per_pos = {24, 25, 26};
  l.prefix_cache_queries = 27;
  l.prefix_cache_hits = 28;
  l.kv_imported_tokens = 29;
  l.kv_recomputed_tokens = 30;
  l.num_reclaims = 31;
  l.goodput_drafting = 32;
  l.goodput_skipped = 33;
  l.num_preemptions = 43;
  l.drafts_by_source = {34, 35, 36};
  l.draft_tokens_by_source = {37, 38, 39};
  l.accepted_by_source = {40, 41, 42};
  const ShardLoad r = round_trip(l);
  EXPECT_EQ(r.replica, 3);
  EXPECT_EQ(r.free_kv_blocks, 11);
  EXPECT_EQ(r.total_kv_blocks, 12);
  EXPECT_EQ(r.num_running, 13);
  EXPECT_EQ(r.num_waiting, 14);
  EXPECT_EQ(r.num_steps, 15);
  EXPECT_EQ(r.generated_tokens, 16);
  EXPECT_EQ(r.num_drafts, 17);
  EXPECT_EQ(r.num_draft_tokens, 18);
  EXPECT_EQ(r.num_accepted_tokens, 19);
  EXPECT_EQ(r.forward_seconds, 2.5);
  EXPECT_EQ(r.draft_seconds, 3.5);
  EXPECT_EQ(r.finished, (std::vector<int64_t>{20, 21}));
  EXPECT_EQ(r.received, 22);
  EXPECT_EQ(r.prompt_tokens, 23);
  EXPECT_EQ(r.accepted_per_pos, (std::vector<int64_t>{24, 25, 26}));
  EXPECT_EQ(r.prefix_cache_queries, 27);
  EXPECT_EQ(r.prefix_cache_hits, 28);
  EXPECT_EQ(r.kv_imported_tokens, 29);
  EXPECT_EQ(r.kv_recomputed_tokens, 30);
  EXPECT_EQ(r.num_reclaims, 31);
  EXPECT_EQ(r.goodput_drafting, 32);
  EXPECT_EQ(r.goodput_skipped, 33);
  EXPECT_EQ(r.num_preemptions, 43);
  EXPECT_EQ(r.drafts_by_source, (std::vector<int64_t>{34, 35, 36}));
  EXPECT_EQ(r.draft_tokens_by_source, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(r.accepted_by_source, (std::vector<int64_t>{40, 41, 42}));
}

TEST(Messages, DraftReplySeqKeepsEveryFieldThroughSerialisation) {
  DraftReplySeq d;
  d.tokens = {1, 2};
  d.parents = {-1, 0};
  d.prob_ids = {{3}, {4, 5}};
  d.prob_values = {{0.5f}, {0.25f, 0.75f}};
  d.resync = true;
  d.source = 2;
  const DraftReplySeq r = round_trip(d);
  EXPECT_EQ(r.tokens, d.tokens);
  EXPECT_EQ(r.parents, d.parents);
  EXPECT_EQ(r.prob_ids, d.prob_ids);
  EXPECT_EQ(r.prob_values, d.prob_values);
  EXPECT_TRUE(r.resync);
  EXPECT_EQ(r.source, 2);
}

TEST(Messages, ClusterStatusKeepsTheEndedCounters) {
  ClusterStatus c;
  c.kv_recomputed_tokens = 4;
  c.tensor_parallel_size = 2;
  c.ended.prompt_tokens = 5;
  c.ended.accepted_per_pos = {6, 7};
  c.ended.goodput_skipped = 8;
  c.ended.drafts_by_source = {9, 10};
  c.speculative = "ngram, num_speculative_tokens 4, prompt_lookup 1..5";
  ReplicaStatus rs;
  rs.replica = 3;
  rs.load.generated_tokens = 11;
  rs.has_prefill_worker = true;
  rs.prefill_load.prompt_tokens = 12;
  rs.prefill_load.num_waiting = 13;
  rs.state = "ready";
  c.replicas.push_back(rs);
  const ClusterStatus r = round_trip(c);
  ASSERT_EQ(r.replicas.size(), 1u);
  EXPECT_EQ(r.replicas[0].replica, 3);
  EXPECT_EQ(r.replicas[0].load.generated_tokens, 11);
  EXPECT_TRUE(r.replicas[0].has_prefill_worker);
  EXPECT_EQ(r.replicas[0].prefill_load.prompt_tokens, 12);
  EXPECT_EQ(r.replicas[0].prefill_load.num_waiting, 13);
  EXPECT_EQ(r.replicas[0].state, "ready");
  EXPECT_EQ(r.speculative, c.speculative);
  EXPECT_EQ(r.kv_recomputed_tokens, 4);
  EXPECT_EQ(r.tensor_parallel_size, 2);
  EXPECT_EQ(r.ended.prompt_tokens, 5);
  EXPECT_EQ(r.ended.accepted_per_pos, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(r.ended.goodput_skipped, 8);
  EXPECT_EQ(r.ended.drafts_by_source, (std::vector<int64_t>{9, 10}));
}

}  // namespace
}  // namespace specserve
