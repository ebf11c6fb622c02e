// The target shard's client of a draft worker (actors/remote_proposer.h): an answer comes back
// as drafts; a worker that dies while a call waits ends the wait at once (it stalled every
// sequence of the shard for the whole timeout: the new-user review of the draft-worker
// replacement, `kill -9` of a draft worker).
#include "actors/remote_proposer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "actors/messages.h"
#include "actors/runtime.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<DraftRequest> one_request(const std::vector<int32_t>& tokens) {
  DraftRequest r;
  r.seq_id = 1;
  r.tokens = tokens;
  r.prompt_len = static_cast<int32_t>(tokens.size());
  r.num_tokens = 2;
  return {r};
}

TEST(RemoteProposer, AnAnswerComesBackAsDrafts) {
  ActorRuntime rt;
  caf::actor worker = rt.system().spawn([]() -> caf::behavior {
    return {[](ProposeMsg& m) {
      ProposeReply r;
      for (size_t i = 0; i < m.seqs.size(); ++i) {
        DraftReplySeq s;
        s.tokens = {7, 8};
        s.parents = {-1, 0};
        r.seqs.push_back(s);
      }
      return r;
    }};
  });
  RemoteProposer p(rt.system(), worker, "tok", "ngram", 100, std::chrono::seconds(10));
  const std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<DraftTree> out;
  const Status st = p.propose(one_request(tokens), &out);
  ASSERT_TRUE(st.ok()) << st.to_string();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{7, 8}));
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

TEST(RemoteProposer, AWorkerThatDiesWhileACallWaitsEndsTheWaitAtOnce) {
  ActorRuntime rt;
  // Never answers, like a worker process killed mid-call.
  caf::actor worker = rt.system().spawn([]() -> caf::behavior { return {[](ProposeMsg&) {}}; });
  RemoteProposer p(rt.system(), worker, "tok", "ngram", 100, std::chrono::seconds(30));
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    caf::anon_send_exit(worker, caf::exit_reason::kill);
  });
  const std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<DraftTree> out;
  const auto t0 = Clock::now();
  const Status st = p.propose(one_request(tokens), &out);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  killer.join();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("the draft worker is gone"), std::string::npos) << st.message();
  EXPECT_LT(waited, 10.0) << "it waited for the timeout (30 s), not for the worker's death";
  // A call to the dead worker fails at once too.
  const auto t1 = Clock::now();
  EXPECT_FALSE(p.propose(one_request(tokens), &out).ok());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 5.0);
}

TEST(RemoteProposer, ASilentWorkerTimesOut) {
  ActorRuntime rt;
  caf::actor worker = rt.system().spawn([]() -> caf::behavior { return {[](ProposeMsg&) {}}; });
  RemoteProposer p(rt.system(), worker, "tok", "ngram", 100, std::chrono::milliseconds(300));
  const std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<DraftTree> out;
  const Status st = p.propose(one_request(tokens), &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("timeout"), std::string::npos) << st.message();
  caf::anon_send_exit(worker, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace specserve
