// specserve actors: the client API — submit generation jobs to a specserve head, in-process or
// over the network (CAF middleman, the cluster token required).
//
//   auto c = specserve::Client::connect("127.0.0.1", 7420, token);      // Expected<unique_ptr<Client>>
//   GenerateRequest r; r.prompt = "Hello"; r.max_tokens = 32; r.sampling.temperature = 0;
//   auto h = (*c)->submit(r);                                           // Expected<shared_ptr<RequestHandle>>
//   while (auto chunk = (*h)->next()) std::cout << chunk->text;         // pull the stream...
//   auto result = (*h)->wait();                                         // ...or wait for the whole result
//
// Errors are values (Status / Expected), never exceptions: a refused token, a bad request
// (the message names the field and value), a lost connection (kUnavailable).
// Thread-safety: a Client may be used from several threads; a RequestHandle from one at a time.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "actors/messages.h"
#include "actors/runtime.h"
#include "core/status.h"

namespace specserve {

/// A finished request.
struct GenerateResult {
  int64_t request_id = 0;
  std::vector<int32_t> tokens;  ///< output token ids (stop tokens excluded)
  std::vector<float> logprobs;  ///< [tokens.size()]: each output token's raw logprob (natural log)
  int32_t top_n = 0;                          ///< top logprobs per token (= sampling.logprobs; 0 with no tokens)
  std::vector<int32_t> top_logprob_ids;       ///< [tokens.size() * top_n], row-major, highest first
  std::vector<float> top_logprob_values;      ///< same shape, natural log
  std::string text;             ///< the output text (stop strings cut)
  std::string finish_reason;    ///< "stop", "length", "abort", "timeout"
  /// finish_reason "stop": the stop_token_ids id or the stop string that stopped it (vLLM's
  /// stop_reason); neither (-1, "") for EOS.
  int32_t stop_token = -1;
  std::string stop_string;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int64_t num_drafts = 0;           ///< verification steps with a draft
  int64_t num_draft_tokens = 0;     ///< draft tokens proposed
  int64_t num_accepted_tokens = 0;  ///< draft tokens accepted
  int32_t num_requeues = 0;         ///< replica failures survived
  int32_t num_migrations = 0;       ///< moves to another replica with its state (drain, prefill hand-over)
  double seconds = 0;               ///< submit to last token, wall time
  /// Submit to first token (time to first token); -1 when no token came (e.g. finish "timeout"
  /// or "abort" before the first; NOTE: it was the total time then, a first token that never came).
  double first_token_seconds = 0;
  double acceptance_rate() const { return num_draft_tokens ? double(num_accepted_tokens) / num_draft_tokens : 0.0; }
};

class RequestHandle {
 public:
  struct Shared;
  explicit RequestHandle(std::shared_ptr<Shared> shared, caf::actor scheduler, std::string token);
  ~RequestHandle();

  int64_t id() const;
  /// The next chunk, waiting up to `timeout`; nullopt after the last chunk (done()) or on timeout.
  std::optional<StreamChunk> next(std::chrono::milliseconds timeout = std::chrono::hours(24));
  /// True once the last chunk was received.
  bool done() const;
  /// Asks the head to stop the request; the stream ends with finish reason "abort".
  void cancel();
  /// Consumes the rest of the stream. Errors: the request failed on the server (its message),
  /// the connection to the head was lost (kUnavailable).
  Expected<GenerateResult> wait();

 private:
  std::shared_ptr<Shared> shared_;
  caf::actor scheduler_;
  std::string token_;
  GenerateResult acc_;
  std::string error_;  ///< the server's error, from the last chunk (finish reason "error")
};

class Client {
 public:
  /// Connects to a head at host:port with the cluster token (own actor system).
  /// Errors: kUnavailable naming host:port and CAF's reason.
  static Expected<std::unique_ptr<Client>> connect(const std::string& host, uint16_t port, std::string token,
                                                   const RuntimeOptions& options = {});
  /// A client of a scheduler in this process (`sys` must outlive it).
  static std::unique_ptr<Client> in_process(caf::actor_system& sys, caf::actor scheduler, std::string token);
  ~Client();

  /// Submits a request. `on_chunk` (optional) is called for every chunk on a CAF thread, before
  /// the chunk is queued for next(). Errors: the request is invalid (field and value named),
  /// the token is refused, the head is draining or unreachable.
  Expected<std::shared_ptr<RequestHandle>> submit(GenerateRequest request,
                                                  std::function<void(const StreamChunk&)> on_chunk = {});
  /// submit + wait.
  Expected<GenerateResult> generate(GenerateRequest request);
  /// Workers, replicas, queue, KV use and acceptance counters.
  Expected<ClusterStatus> status(std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// Stops accepting requests and waits until in-flight ones finish (or `timeout`).
  Status drain(std::chrono::milliseconds timeout);

  caf::actor_system& system() { return *sys_; }
  caf::actor scheduler() const { return scheduler_; }

 private:
  Client() = default;
  std::unique_ptr<ActorRuntime> runtime_;  // set when connected over the network
  caf::actor_system* sys_ = nullptr;
  caf::actor scheduler_;
  std::string token_;
  std::mutex sinks_mu_;
  std::vector<caf::actor> sinks_;  // stopped by the destructor so the actor system can shut down
};

}  // namespace specserve
