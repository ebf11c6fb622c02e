#include "actors/client.h"

#include "actors/gateway.h"

#include <algorithm>
#include <cmath>

namespace specserve {

struct RequestHandle::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StreamChunk> chunks;
  bool finished = false;   // the last chunk was queued
  bool consumed = false;   // ...and handed out
  int64_t id = 0;
  std::function<void(const StreamChunk&)> on_chunk;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double first_token_s = -1;
  void push(StreamChunk c) {
    if (on_chunk) on_chunk(c);
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;
    if (first_token_s < 0 && !c.tokens.empty()) {
      first_token_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    if (!c.finish_reason.empty()) finished = true;
    chunks.push_back(std::move(c));
    cv.notify_all();
  }
};

namespace {

struct SinkState {
  std::shared_ptr<RequestHandle::Shared> shared;
  caf::actor scheduler;
};

caf::behavior sink_actor(caf::stateful_actor<SinkState>* self, std::shared_ptr<RequestHandle::Shared> shared,
                         caf::actor scheduler) {
  self->state.shared = std::move(shared);
  self->state.scheduler = scheduler;
  self->monitor(scheduler);
  self->set_down_handler([self](caf::down_msg& m) {
    StreamChunk c;
    c.finish_reason = "error";
    c.error = "lost the connection to the head: " + self->system().render(m.reason);
    self->state.shared->push(std::move(c));
    self->quit();
  });
  return {
      [self](StreamChunk& c) {
        const bool last = !c.finish_reason.empty();
        self->state.shared->push(std::move(c));
        if (last) self->quit();
      },
  };
}

Status status_from(int32_t code, const std::string& msg) {
  return Status(code > 0 && code <= static_cast<int32_t>(StatusCode::kInternal) ? static_cast<StatusCode>(code)
                                                                               : StatusCode::kInternal,
                msg);
}

}  // namespace

RequestHandle::RequestHandle(std::shared_ptr<Shared> shared, caf::actor scheduler, std::string token)
    : shared_(std::move(shared)), scheduler_(std::move(scheduler)), token_(std::move(token)) {}
RequestHandle::~RequestHandle() {
  // Nobody will read the rest: free the replica's slot.
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->finished && shared_->id > 0) caf::anon_send(scheduler_, CancelMsg{token_, shared_->id});
}

int64_t RequestHandle::id() const { return shared_->id; }

bool RequestHandle::done() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->consumed;
}

std::optional<StreamChunk> RequestHandle::next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  if (shared_->consumed) return std::nullopt;
  if (!shared_->cv.wait_for(lock, timeout, [&] { return !shared_->chunks.empty(); })) return std::nullopt;
  StreamChunk c = std::move(shared_->chunks.front());
  shared_->chunks.pop_front();
  if (!c.finish_reason.empty()) shared_->consumed = true;
  acc_.tokens.insert(acc_.tokens.end(), c.tokens.begin(), c.tokens.end());
  acc_.logprobs.insert(acc_.logprobs.end(), c.logprobs.begin(), c.logprobs.end());
  // Chunks without tokens (the scheduler's own last chunk, errors) carry top_n 0: keep the
  // request's value from the chunks that have tokens.
  if (c.top_n > 0) acc_.top_n = c.top_n;
  acc_.top_logprob_ids.insert(acc_.top_logprob_ids.end(), c.top_logprob_ids.begin(), c.top_logprob_ids.end());
  acc_.top_logprob_values.insert(acc_.top_logprob_values.end(), c.top_logprob_values.begin(), c.top_logprob_values.end());
  acc_.text += c.text;
  if (c.finish_reason == "error") error_ = c.error.empty() ? "request failed" : c.error;
  if (!c.finish_reason.empty()) {
    acc_.request_id = shared_->id;
    acc_.finish_reason = c.finish_reason;
    acc_.stop_token = c.stop_token;
    acc_.stop_string = c.stop_string;
    acc_.prompt_tokens = c.prompt_tokens;
    acc_.completion_tokens = c.completion_tokens;
    acc_.num_drafts = c.num_drafts;
    acc_.num_draft_tokens = c.num_draft_tokens;
    acc_.num_accepted_tokens = c.num_accepted_tokens;
    acc_.num_requeues = c.num_requeues;
    acc_.num_migrations = c.num_migrations;
    acc_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - shared_->start).count();
    acc_.first_token_seconds = shared_->first_token_s < 0 ? -1.0 : shared_->first_token_s;
  }
  return c;
}

void RequestHandle::cancel() { caf::anon_send(scheduler_, CancelMsg{token_, shared_->id}); }

Expected<GenerateResult> RequestHandle::wait() {
  while (next()) {
  }
  const std::string error = error_;
  if (!error.empty()) {
    if (error.rfind("lost the connection", 0) == 0) return unavailable(error);
    return invalid_argument(error);
  }
  return acc_;
}

Client::~Client() {
  std::lock_guard<std::mutex> lock(sinks_mu_);
  for (auto& s : sinks_) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
}

Expected<std::unique_ptr<Client>> Client::connect(const std::string& host, uint16_t port, std::string token,
                                                  const RuntimeOptions& options) {
  std::unique_ptr<Client> c(new Client());
  c->runtime_ = std::make_unique<ActorRuntime>(options);
  c->sys_ = &c->runtime_->system();
  auto h = connect_through_gateway(*c->sys_, host, port, token, std::chrono::seconds(30));
  if (!h.ok()) {
    return Status(h.status().code(), "head " + host + ":" + std::to_string(port) + ": " + h.status().message() +
                                         (h.status().code() == StatusCode::kUnavailable ? " (is the cluster running?)" : ""));
  }
  c->scheduler_ = *h;
  c->token_ = std::move(token);
  return c;
}

std::unique_ptr<Client> Client::in_process(caf::actor_system& sys, caf::actor scheduler, std::string token) {
  std::unique_ptr<Client> c(new Client());
  c->sys_ = &sys;
  c->scheduler_ = std::move(scheduler);
  c->token_ = std::move(token);
  return c;
}

namespace {
// Checks what CAF 0.17 cannot carry (it loops on an infinite float and mangles NaN) before
// anything is sent; the head checks everything again.
Status check_sendable(const GenerateRequest& r) {
  SPECSERVE_RETURN_IF_ERROR(r.sampling.validate());
  if (!std::isfinite(r.timeout_s) || r.timeout_s < 0 || r.timeout_s > 1e6) {
    return invalid_argument("timeout_s: must be a finite number of seconds in [0, 1e6]");
  }
  if (r.max_tokens < 1) return invalid_argument("max_tokens = " + std::to_string(r.max_tokens) + ": must be >= 1");
  if (r.prompt.empty() && r.messages.empty() && r.prompt_token_ids.empty()) {
    return invalid_argument("prompt: empty (give a prompt, messages or prompt_token_ids)");
  }
  return Status();
}
}  // namespace

Expected<std::shared_ptr<RequestHandle>> Client::submit(GenerateRequest request,
                                                        std::function<void(const StreamChunk&)> on_chunk) {
  SPECSERVE_RETURN_IF_ERROR(check_sendable(request));
  auto shared = std::make_shared<RequestHandle::Shared>();
  shared->on_chunk = std::move(on_chunk);
  auto sink = sys_->spawn(sink_actor, shared, scheduler_);
  {
    std::lock_guard<std::mutex> lock(sinks_mu_);
    // Forget sinks that finished (their handle is all that is left).
    sinks_.erase(std::remove_if(sinks_.begin(), sinks_.end(),
                                [](const caf::actor& a) { return a->getf(caf::abstract_actor::is_terminated_flag); }),
                 sinks_.end());
    sinks_.push_back(sink);
  }
  caf::scoped_actor self{*sys_};
  Status st;
  int64_t id = 0;
  self->request(scheduler_, std::chrono::seconds(30), SubmitMsg{token_, std::move(request), sink})
      .receive(
          [&](int64_t rid, int32_t code, std::string& msg) {
            if (code != 0) st = status_from(code, msg);
            id = rid;
          },
          [&](caf::error& e) { st = unavailable("submit: " + sys_->render(e)); });
  if (!st.ok()) {
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->id = id;
    for (auto& c : shared->chunks) c.request_id = id;
  }
  return std::make_shared<RequestHandle>(shared, scheduler_, token_);
}

Expected<GenerateResult> Client::generate(GenerateRequest request) {
  auto h = submit(std::move(request));
  if (!h.ok()) return h.status();
  return (*h)->wait();
}

Expected<ClusterStatus> Client::status(std::chrono::milliseconds timeout) {
  caf::scoped_actor self{*sys_};
  Expected<ClusterStatus> out = unavailable("status: no answer");
  self->request(scheduler_, timeout, StatusQuery{token_})
      .receive([&](ClusterStatus& s) { out = std::move(s); },
               [&](caf::error& e) { out = unavailable("status: " + sys_->render(e)); });
  return out;
}

Status Client::drain(std::chrono::milliseconds timeout) {
  caf::scoped_actor self{*sys_};
  Status st;
  self->request(scheduler_, timeout, drain_atom::value, token_)
      .receive([&](bool) {}, [&](caf::error& e) { st = unavailable("drain: " + sys_->render(e)); });
  return st;
}

}  // namespace specserve
