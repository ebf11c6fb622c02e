// specserve actors: the target shard's work in and out: WorkItems joining the engine (new, or
// migrated with their KV fetched on a thread of their own), sequences leaving with a KV offer, and
// quitting once a drained shard is empty (actors/target_shard.h).
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "actors/target_shard_internal.h"
#include "core/logging.h"

namespace specserve {
namespace target_shard_internal {
namespace {

// Adds a request to the engine: a new one, or a migrated one (`fetched`: its KV in host memory,
// fetched already; null: none to load, it recomputes). Answers an error to the request actor.
void add_work(Self self, WorkItem& w, std::shared_ptr<KvFetch> fetched) {
  auto& s = self->state;
  const auto known = static_cast<int64_t>(w.prompt.size() + w.resume_output.size());
  const int64_t end_tokens = static_cast<int64_t>(w.prompt.size()) + w.max_tokens;
  const int32_t top_n = w.sampling.logprobs;
  GenerateParams p;
  p.prompt = std::move(w.prompt);
  p.resume_output = std::move(w.resume_output);
  p.sampling = std::move(w.sampling);
  p.max_tokens = w.max_tokens;
  p.stop = std::move(w.stop);
  p.include_stop_str = w.include_stop_str;
  p.priority = w.priority;
  p.num_speculative_tokens = w.num_speculative_tokens;
  const bool migrated = !w.rng_state.empty() || !w.kv.source.empty();
  Expected<int64_t> id = 0;
  if (!migrated) {
    id = s.engine->add_request(std::move(p));
  } else {
    SequenceImport imp;
    imp.rng_state = w.rng_state;
    imp.k = w.spec_k;
    imp.spec.num_drafts = w.num_drafts;
    imp.spec.num_draft_tokens = w.num_draft_tokens;
    imp.spec.num_accepted_tokens = w.num_accepted_tokens;
    imp.spec.accepted_per_pos = w.accepted_per_pos;
    const int64_t num_tokens = static_cast<int64_t>(p.prompt.size() + p.resume_output.size());
    const KvOffer offer = w.kv;
    const int64_t rid = w.request_id;
    if (fetched != nullptr) {
      imp.num_cached = offer.num_cached;
      // NOTE: called by the engine when its step policy admits the sequence (now, or at a later
      // step while it waits with these bytes): the import itself (checksums, copy into the
      // blocks) is a memcpy-speed pass on this thread; the transfer is done already.
      imp.load_kv = [self, fetched, num_tokens, rid](KvStorage& kv, std::span<const int32_t> blocks) {
        auto& st = self->state;
        Status r = st.plane->finish_fetch(*fetched, *st.backend, kv, st.kv_format, blocks);
        st.plane->end_fetch(*fetched);
        if (r.ok()) {
          st.kv_imported_tokens += fetched->offer.num_cached;
        } else {
          st.kv_recomputed_tokens += num_tokens;
          get_logger("actors")->warn("replica {}: request {}: migrated KV refused, recomputing: {}", st.cfg.replica, rid,
                                     r.to_string());
        }
        return r;
      };
    } else {
      s.kv_recomputed_tokens += num_tokens;
    }
    bool loaded = false;
    id = s.engine->add_migrated(std::move(p), std::move(imp), &loaded);
    if (id.ok()) {
      get_logger("actors")->info("replica {}: request {} arrives from {}: {} tokens, KV {}", s.cfg.replica, rid,
                                 offer.source.empty() ? "elsewhere" : offer.source, num_tokens,
                                 fetched == nullptr ? std::string("recomputed")
                                 : loaded          ? "moved (" + std::to_string(offer.num_cached) + " tokens over " +
                                                       kv_transport_name(fetched->transport) + ")"
                                                   : "fetched; it waits for admission");
    }
  }
  if (!id.ok()) {
    ShardEvent ev;
    ev.request_id = w.request_id;
    ev.attempt = w.attempt;
    ev.finish_reason = "error";
    ev.error = id.status().to_string();
    // (the load first, as do_step sends a last event: the head's books before the client)
    ShardLoad l = load_of(s);
    l.finished.push_back(w.request_id);
    self->send(s.cfg.scheduler, std::move(l));
    self->send(w.request_actor, std::move(ev));
    return;
  }
  const int32_t vocab = static_cast<int32_t>(s.model.model->config().vocab_size);
  s.by_request[w.request_id] = Running{*id, w.attempt, w.request_actor, known, std::min(top_n, vocab), end_tokens};
  s.by_seq[*id] = w.request_id;
  schedule_step(self);
}

}  // namespace

void maybe_quit(Self self) {
  auto& s = self->state;
  if (!s.quit_when_empty || !s.by_request.empty() || !s.fetching.empty() || (s.plane && s.plane->num_offers() > 0)) return;
  get_logger("actors")->info("replica {}: drained (each sequence finished here or moved away); the worker stops", s.cfg.replica);
  self->quit();
}

void schedule_expiry(Self self) {
  auto& s = self->state;
  if (s.expiry_pending || !s.plane || s.plane->num_offers() == 0) return;
  s.expiry_pending = true;
  self->delayed_send(self, std::chrono::seconds(5), tick_atom::value);
}

void migrate_out(Self self, int64_t rid, const std::string& reason) {
  auto& s = self->state;
  auto it = s.by_request.find(rid);
  if (it == s.by_request.end()) return;
  const Running r = it->second;
  auto ex = s.engine->export_sequence(r.seq_id);
  if (!ex.ok()) return;
  MigratedSeq m;
  m.request_id = rid;
  m.attempt = r.attempt;
  m.replica = s.cfg.replica;
  m.rng_state = ex->rng_state;
  m.spec_k = ex->k;
  m.reason = reason;
  m.num_drafts = ex->spec.num_drafts;
  m.num_draft_tokens = ex->spec.num_draft_tokens;
  m.num_accepted_tokens = ex->spec.num_accepted_tokens;
  m.accepted_per_pos = ex->spec.accepted_per_pos;
  if (s.plane && ex->num_cached > 0) {
    std::vector<int32_t> tokens = ex->prompt;
    tokens.insert(tokens.end(), ex->output.begin(), ex->output.end());
    tokens.resize(static_cast<size_t>(ex->num_cached));
    auto o = s.plane->offer(*s.backend, s.engine->kv_storage(), s.kv_format, ex->blocks, ex->num_cached, kv_tokens_hash(tokens));
    if (o.ok()) {
      m.kv = std::move(*o);
    } else {
      get_logger("actors")->warn("replica {}: request {}: KV export failed, the receiver recomputes: {}", s.cfg.replica, rid,
                                 o.status().to_string());
    }
  }
  s.engine->remove_sequence(r.seq_id);
  s.by_seq.erase(r.seq_id);
  s.by_request.erase(it);
  get_logger("actors")->info("replica {}: request {} leaves ({}) with {} tokens of KV", s.cfg.replica, rid, reason,
                             m.kv.source.empty() ? 0 : m.kv.num_cached);
  self->send(s.cfg.scheduler, std::move(m));
  schedule_expiry(self);
}

void receive_work(Self self, WorkItem w) {
  auto& s = self->state;
  const bool migrated = !w.rng_state.empty() || !w.kv.source.empty();
  if (!migrated) return add_work(self, w, nullptr);
  std::vector<int32_t> tokens = w.prompt;
  tokens.insert(tokens.end(), w.resume_output.begin(), w.resume_output.end());
  const KvOffer& offer = w.kv;
  // NOTE: the offer must describe a prefix of exactly these tokens; anything else (a request
  // actor that saw other tokens than the source engine had) recomputes.
  const bool usable = s.plane && !offer.source.empty() && offer.num_cached > 0 &&
                      offer.num_cached < static_cast<int32_t>(tokens.size()) &&
                      kv_tokens_hash(std::span<const int32_t>(tokens.data(), static_cast<size_t>(offer.num_cached))) ==
                          offer.tokens_hash;
  if (!usable) {
    if (!offer.source.empty()) self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
    return add_work(self, w, nullptr);
  }
  const int64_t num_blocks = (offer.num_cached + s.kv_format.block_size - 1) / s.kv_format.block_size;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(s.cfg.kv_transfer_timeout_s * 1000));
  int64_t delay_ms = 0;
  if (const char* d = std::getenv("SPECSERVE_TEST_KV_FETCH_DELAY_MS")) {
    // NOTE: fault injection for tests only: the window in which a test kills the source
    // mid-transfer (on the fetch thread, before the transfer's deadline starts). Unset in production.
    delay_ms = std::atoi(d);
  }
  auto f = s.plane->start_fetch(offer, s.kv_format, num_blocks, kv_deadline_after(timeout + std::chrono::milliseconds(delay_ms)));
  if (!f.ok()) {
    get_logger("actors")->warn("replica {}: request {}: cannot fetch its KV, recomputing: {}", s.cfg.replica, w.request_id,
                               f.status().to_string());
    self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
    return add_work(self, w, nullptr);
  }
  if ((*f)->transport == KvTransport::kNccl) {
    // NCCL is two-sided: the source posts the matching send when this reaches it.
    self->send(s.cfg.scheduler, KvSendMsg{offer.source, offer.offer_id, s.plane->name()});
  }
  const int64_t serial = s.next_fetch++;
  PendingImport& p = s.fetching[serial];
  p.item = std::move(w);
  p.fetch = *f;
  p.thread = std::thread([fetch = *f, to = caf::actor_cast<caf::actor>(self), serial, delay_ms] {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    fetch->run();
    caf::anon_send(to, kv_fetched_atom::value, serial);
  });
}

void kv_fetched(Self self, int64_t serial) {
  auto& s = self->state;
  auto it = s.fetching.find(serial);
  if (it == s.fetching.end()) return;
  PendingImport p = std::move(it->second);
  s.fetching.erase(it);
  if (p.thread.joinable()) p.thread.join();  // it has sent its message: it is returning
  const KvOffer offer = p.item.kv;
  self->send(s.cfg.scheduler, KvReleaseMsg{offer.source, offer.offer_id});
  std::shared_ptr<KvFetch> fetched = p.fetch;
  if (!fetched->status.ok()) {
    get_logger("actors")->warn("replica {}: request {}: KV transfer from {} ({}) failed, recomputing: {}", s.cfg.replica,
                               p.item.request_id, offer.source, kv_transport_name(fetched->transport),
                               fetched->status.to_string());
    s.plane->end_fetch(*fetched);
    fetched = nullptr;
  }
  if (p.aborted) {
    if (fetched) s.plane->end_fetch(*fetched);
    maybe_quit(self);
    return;
  }
  const int64_t rid = p.item.request_id;
  add_work(self, p.item, std::move(fetched));
  if (p.drain && s.by_request.count(rid)) {
    migrate_out(self, rid, "drain");
    self->send(s.cfg.scheduler, load_of(s));
  }
  maybe_quit(self);
}

}  // namespace target_shard_internal
}  // namespace specserve
