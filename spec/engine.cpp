// specserve spec: the engine's construction, options, requests (add, migrate, export, remove,
// abort), finishing, prefix-cache bookkeeping and its queues as the step policy sees them.
#include "spec/engine.h"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "core/logging.h"
#include "spec/engine_internal.h"

namespace specserve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: return "";
  }
  return "";
}

void SpecStats::add(const SpecStats& o) {
  num_drafts += o.num_drafts;
  num_draft_tokens += o.num_draft_tokens;
  num_accepted_tokens += o.num_accepted_tokens;
  if (accepted_per_pos.size() < o.accepted_per_pos.size()) accepted_per_pos.resize(o.accepted_per_pos.size(), 0);
  for (size_t i = 0; i < o.accepted_per_pos.size(); ++i) accepted_per_pos[i] += o.accepted_per_pos[i];
  if (drafted_per_pos.size() < o.drafted_per_pos.size()) drafted_per_pos.resize(o.drafted_per_pos.size(), 0);
  for (size_t i = 0; i < o.drafted_per_pos.size(); ++i) drafted_per_pos[i] += o.drafted_per_pos[i];
}

Status EngineOptions::validate() const {
  auto bad = [](const char* field, int64_t v, const char* rule) {
    return invalid_argument(std::string(field) + " = " + std::to_string(v) + ": " + rule);
  };
  if (max_num_seqs < 1) return bad("max_num_seqs", max_num_seqs, "must be >= 1");
  if (max_num_batched_tokens < 1) return bad("max_num_batched_tokens", max_num_batched_tokens, "must be >= 1");
  if (block_size < 1 || block_size > 1024) return bad("block_size", block_size, "must be in 1..1024");
  if (num_kv_blocks < 0) return bad("num_kv_blocks", num_kv_blocks, "must be >= 0");
  if (max_model_len < 0) return bad("max_model_len", max_model_len, "must be >= 0");
  if (num_speculative_tokens < 0 || num_speculative_tokens > 64) return bad("num_speculative_tokens", num_speculative_tokens, "must be in 0..64");
  if (disable_by_batch_size < 0) return bad("disable_by_batch_size", disable_by_batch_size, "must be >= 0");
  if (priority_aging_steps < 0) return bad("priority_aging_steps", priority_aging_steps, "must be >= 0");
  if (!(posterior_threshold > 0.0f && posterior_threshold <= 1.0f)) {
    return invalid_argument("posterior_threshold = " + fmt::format("{}", posterior_threshold) + ": must be in (0, 1]");
  }
  if (!(posterior_alpha >= 0.0f && posterior_alpha <= 1.0f)) {
    return invalid_argument("posterior_alpha = " + fmt::format("{}", posterior_alpha) + ": must be in [0, 1]");
  }
  return Status();
}

Engine::Engine(Transformer& t, const Tokenizer* tok, Proposer* p, EngineOptions o)
    : target_(t), tokenizer_(tok), proposer_(p), opts_(std::move(o)) {}

Expected<bool> argmax_on_device_from_env(bool fallback) {
  const char* g = std::getenv("SPECSERVE_ARGMAX_ON_DEVICE");
  if (g == nullptr || *g == '\0') return fallback;
  const std::string v = g;
  if (v != "0" && v != "1") {
    return invalid_argument("SPECSERVE_ARGMAX_ON_DEVICE = '" + v +
                            "': expected 1 (greedy and temperature-only tokens taken on the backend, the default) or 0 "
                            "(whole logit rows to the host)");
  }
  return v == "1";
}

namespace {
// Penalties and top logprobs need the whole row on the host.
bool plain_row_suffices(const SamplingParams& sp) {
  return sp.logprobs == 0 && sp.repetition_penalty == 1.0f && sp.presence_penalty == 0.0f && sp.frequency_penalty == 0.0f;
}
}  // namespace

bool Engine::picks_suffice(const Seq& s) const {
  const SamplingParams& sp = s.params.sampling;
  return opts_.argmax_on_device && sp.is_greedy() && plain_row_suffices(sp) && !below_min_tokens(s);
}

bool Engine::draws_on_device(const Seq& s) const {
  const SamplingParams& sp = s.params.sampling;
  const int64_t vocab = target_.config().vocab_size;
  return opts_.argmax_on_device && !sp.is_greedy() && plain_row_suffices(sp) && !below_min_tokens(s) && (sp.top_k <= 0 || sp.top_k >= vocab) &&
         sp.top_p >= 1.0f && sp.min_p <= 0.0f;
}

Engine::~Engine() = default;

Expected<std::unique_ptr<Engine>> Engine::create(Transformer& target, const Tokenizer* tokenizer, Proposer* proposer,
                                                 EngineOptions options) {
  SPECSERVE_RETURN_IF_ERROR(options.validate());
  auto on_device = argmax_on_device_from_env(options.argmax_on_device);
  if (!on_device.ok()) return on_device.status();
  options.argmax_on_device = *on_device;
  const int64_t ctx = target.config().context_length;
  if (options.max_model_len == 0) options.max_model_len = static_cast<int32_t>(ctx);
  if (options.max_model_len > ctx) {
    return invalid_argument("max_model_len = " + std::to_string(options.max_model_len) +
                            " exceeds the model's context length " + std::to_string(ctx));
  }
  if (options.num_kv_blocks == 0) {
    options.num_kv_blocks = (static_cast<int64_t>(options.max_model_len) * 4 + options.block_size - 1) / options.block_size;
  }
  std::unique_ptr<Engine> e(new Engine(target, tokenizer, proposer, options));
  auto kv = target.create_kv(options.num_kv_blocks, options.block_size);
  if (!kv.ok()) return kv.status();
  e->kv_ = std::move(*kv);
  e->pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(options.num_kv_blocks), options.block_size);
  return e;
}

Expected<int64_t> Engine::add_request(GenerateParams params) {
  const int64_t vocab = target_.config().vocab_size;
  if (params.prompt.empty()) return invalid_argument("prompt: must hold at least one token");
  for (const auto* field : {&params.prompt, &params.resume_output}) {
    const char* name = field == &params.prompt ? "prompt" : "resume_output";
    for (int32_t t : *field) {
      if (t < 0 || t >= vocab) {
        return invalid_argument(std::string(name) + ": token id " + std::to_string(t) + " is outside the vocabulary (size " +
                                std::to_string(vocab) + ")");
      }
    }
  }
  const int64_t num_tokens = static_cast<int64_t>(params.prompt.size() + params.resume_output.size());
  const char* len_field = params.resume_output.empty() ? "prompt" : "prompt + resume_output";
  if (num_tokens >= opts_.max_model_len) {
    return out_of_range(std::string(len_field) + ": " + std::to_string(num_tokens) + " tokens leave no room in max_model_len " +
                        std::to_string(opts_.max_model_len));
  }
  if (params.max_tokens < 1) return invalid_argument("max_tokens = " + std::to_string(params.max_tokens) + ": must be >= 1");
  if (static_cast<int64_t>(params.resume_output.size()) >= params.max_tokens) {
    return invalid_argument("resume_output: " + std::to_string(params.resume_output.size()) +
                            " tokens leave nothing to generate within max_tokens = " + std::to_string(params.max_tokens));
  }
  if (params.num_speculative_tokens < -1 || params.num_speculative_tokens > 64) {
    return invalid_argument("num_speculative_tokens = " + std::to_string(params.num_speculative_tokens) +
                            ": must be -1 (the engine's setting), 0 (no speculation) or 1..64");
  }
  SPECSERVE_RETURN_IF_ERROR(params.sampling.validate());
  if (params.sampling.min_tokens > params.max_tokens) {
    return invalid_argument("min_tokens = " + std::to_string(params.sampling.min_tokens) + ": must be <= max_tokens = " +
                            std::to_string(params.max_tokens));
  }
  if (!params.stop.empty() && !tokenizer_) return invalid_argument("stop: stop strings need a tokenizer");
  for (const auto& s : params.stop) {
    if (s.empty()) return invalid_argument("stop: an empty stop string never matches");
  }
  for (int32_t t : params.resume_output) {
    if (is_stop_token(params.sampling, t)) {
      return invalid_argument("resume_output: holds stop token " + std::to_string(t) + " (the request had already finished)");
    }
  }
  const int64_t need_blocks = (num_tokens + 1 + opts_.block_size - 1) / opts_.block_size;
  if (need_blocks > pool_->num_blocks()) {
    return out_of_range(std::string(len_field) + ": " + std::to_string(num_tokens) + " tokens need more KV blocks than the cache holds (" +
                        std::to_string(pool_->num_blocks()) + ")");
  }
  auto s = std::make_unique<Seq>();
  s->id = next_id_++;
  s->sampler.emplace(params.sampling);
  s->tokens = params.prompt;
  s->tokens.insert(s->tokens.end(), params.resume_output.begin(), params.resume_output.end());
  s->prompt_len = static_cast<int32_t>(params.prompt.size());
  s->num_generated = static_cast<int32_t>(params.resume_output.size());
  if (tokenizer_) s->decoder.emplace(*tokenizer_, false);
  for (const auto& st : params.stop) s->max_stop_len = std::max(s->max_stop_len, st.size());
  if (s->decoder && !params.resume_output.empty()) {
    int32_t count = 0;
    for (int32_t t : params.resume_output) {
      s->text += s->decoder->push(t);
      if (++count < params.sampling.min_tokens) s->stop_floor = s->text.size();  // as emit() sets it
    }
    size_t which = 0;
    if (engine_internal::find_stop_string(s->text, params.stop, 0, s->stop_floor, &which) != std::string::npos) {
      return invalid_argument("resume_output: its text already holds stop string \"" + params.stop[which] +
                              "\" (the request had already finished)");
    }
    // NOTE: emit() holds back the last max_stop_len - 1 bytes after every token (and the rest
    // of a character they cut), so after these tokens the uninterrupted request had sent
    // exactly this much of their text.
    const size_t hold = s->max_stop_len == 0 ? 0 : s->max_stop_len - 1;
    s->sent = engine_internal::sendable_prefix(s->text, hold);
  }
  // NOTE: a request may lower the engine's k, never raise it: the engine's setting is what the
  // operator sized the token budget and the draft worker for.
  s->max_k = params.num_speculative_tokens < 0 ? opts_.num_speculative_tokens
                                               : std::min(params.num_speculative_tokens, opts_.num_speculative_tokens);
  s->k = s->max_k;
  s->spec.accepted_per_pos.assign(static_cast<size_t>(s->max_k), 0);
  s->params = std::move(params);
  if (opts_.enable_prefix_caching) extend_block_hashes(s->tokens, opts_.block_size, &s->block_hashes);
  stats_.prompt_tokens += s->prompt_len;
  const int64_t id = s->id;
  waiting_.push_back(std::move(s));
  return id;
}

Expected<int64_t> Engine::add_migrated(GenerateParams params, SequenceImport import, bool* kv_loaded) {
  if (kv_loaded) *kv_loaded = false;
  const int64_t num_tokens = static_cast<int64_t>(params.prompt.size() + params.resume_output.size());
  if (import.num_cached < 0 || (import.num_cached > 0 && import.num_cached >= num_tokens)) {
    return invalid_argument("num_cached = " + std::to_string(import.num_cached) + ": must be in [0, " +
                            std::to_string(num_tokens) + ") (the tokens of prompt + resume_output)");
  }
  if (!import.rng_state.empty()) {
    // Checked before the request is queued, so a bad state leaves nothing behind.
    Sampler probe(SamplingParams{});
    SPECSERVE_RETURN_IF_ERROR(probe.set_rng_state(import.rng_state));
  }
  auto id = add_request(std::move(params));
  if (!id.ok()) return id.status();
  Seq& s = *waiting_.back();
  // The engine it came from counted its prompt (EngineStats::prompt_tokens: once per request).
  stats_.prompt_tokens -= s.prompt_len;
  if (!import.rng_state.empty()) SPECSERVE_CHECK(s.sampler->set_rng_state(import.rng_state).ok(), "rng state checked above");
  // A tree proposer's k is its node budget and stays at the cap (EngineOptions::adaptive_k).
  if (s.max_k > 0 && import.k >= 1 && !(proposer_ && proposer_->drafts_trees())) s.k = std::min(import.k, s.max_k);
  s.spec.add(import.spec);
  // NOTE: a proposer that needs hidden states needs them for every position, which only a
  // recompute gives: such a sequence recomputes its KV instead of loading it.
  if (import.num_cached == 0 || !import.load_kv || wants_hidden(s)) return id;
  s.import_kv = std::move(import.load_kv);
  s.import_cached = import.num_cached;
  // NOTE: it is admitted by the step policy like any other waiting sequence (max_num_seqs, the
  // KV blocks of its tokens after those running ones need, the queue ahead of it); until then
  // it waits with its KV held by import_kv, outside the cache.
  if (admit_import(s) && kv_loaded) *kv_loaded = true;
  return id;
}

bool Engine::admit_import(Seq& s) {
  const std::vector<int64_t> admitted = plan_admission(step_state(), step_limits());
  if (std::find(admitted.begin(), admitted.end(), s.id) == admitted.end()) return false;
  auto load = std::move(s.import_kv);
  s.import_kv = nullptr;
  // The policy may have counted a prefix-cache hit it shares; the import writes fresh blocks,
  // so a pool that cannot give them all makes it recompute instead.
  if (!s.blocks.reserve(*pool_, s.import_cached).ok()) return false;
  Status st = load(*kv_, s.blocks.blocks());
  if (!st.ok()) {
    // NOTE: the KV did not arrive intact: the sequence recomputes it (same tokens, same stream).
    get_logger("spec")->warn("seq {}: migrated KV refused, recomputing: {}", s.id, st.to_string());
    s.blocks.release_all(*pool_);
    return false;
  }
  s.num_cached = s.import_cached;
  s.blocks.set_num_tokens(s.num_cached);
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w.get() == &s; });
  SPECSERVE_CHECK(it != waiting_.end(), "seq " + std::to_string(s.id) + " admitted with its KV is not waiting");
  running_.push_back(std::move(*it));
  waiting_.erase(it);
  return true;
}

Expected<SequenceExport> Engine::export_sequence(int64_t seq_id) const {
  const Seq* found = nullptr;
  for (const auto& r : running_) {
    if (r->id == seq_id && r->finish == FinishReason::kNone) found = r.get();
  }
  for (const auto& w : waiting_) {
    if (w->id == seq_id) found = w.get();
  }
  if (!found) return not_found("sequence " + std::to_string(seq_id) + " is not running or waiting");
  const Seq& s = *found;
  SequenceExport e;
  e.seq_id = s.id;
  e.prompt.assign(s.prompt().begin(), s.prompt().end());
  e.output.assign(s.output().begin(), s.output().end());
  e.rng_state = s.sampler->rng_state();
  e.num_cached = s.num_cached;
  const size_t nb = static_cast<size_t>((s.num_cached + opts_.block_size - 1) / opts_.block_size);
  e.blocks.assign(s.blocks.blocks().begin(), s.blocks.blocks().begin() + static_cast<std::ptrdiff_t>(nb));
  e.k = s.k;
  e.spec = s.spec;
  return e;
}

void Engine::remove_sequence(int64_t seq_id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == seq_id) {
      waiting_.erase(it);
      return;
    }
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    Seq& s = **it;
    if (s.id != seq_id || s.finish != FinishReason::kNone) continue;
    s.blocks.release_all(*pool_);
    if (may_draft(s)) proposer_->release(s.id);
    running_.erase(it);
    return;
  }
}

std::vector<int64_t> Engine::live_sequences() const {
  std::vector<int64_t> ids;
  for (const auto& r : running_) {
    if (r->finish == FinishReason::kNone) ids.push_back(r->id);
  }
  for (const auto& w : waiting_) ids.push_back(w->id);
  return ids;
}

void Engine::abort(int64_t seq_id) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == seq_id) {
      waiting_.erase(it);
      aborted_.push_back(seq_id);
      return;
    }
  }
  for (auto& s : running_) {
    if (s->id == seq_id && s->finish == FinishReason::kNone) {
      finish(*s, FinishReason::kAbort);
      aborted_.push_back(seq_id);
    }
  }
}

void Engine::finish(Seq& s, FinishReason r) {
  s.finish = r;
  s.blocks.release_all(*pool_);
  // NOTE: a stop or length finish happens inside step(), which hands the proposer the last
  // step's rows first (Proposer::needs_every_hidden_row) and then releases the sequence.
  if (wants_every_hidden_row(s) && (r == FinishReason::kStop || r == FinishReason::kLength)) {
    s.release_after_handover = true;
  } else if (may_draft(s)) {
    proposer_->release(s.id);
  }
  finished_stats_[s.id] = s.spec;
  stats_.spec.add(s.spec);
}

std::optional<SpecStats> Engine::take_finished_stats(int64_t seq_id) {
  auto it = finished_stats_.find(seq_id);
  if (it == finished_stats_.end()) return std::nullopt;
  SpecStats s = it->second;
  finished_stats_.erase(it);
  return s;
}

bool Engine::may_draft(const Seq& s) const { return proposer_ != nullptr && s.max_k > 0; }

bool Engine::wants_hidden(const Seq& s) const { return may_draft(s) && proposer_->needs_hidden(); }

bool Engine::wants_every_hidden_row(const Seq& s) const { return wants_hidden(s) && proposer_->needs_every_hidden_row(); }

void Engine::cache_full_blocks(Seq& s) {
  if (!opts_.enable_prefix_caching) return;
  extend_block_hashes(s.tokens, opts_.block_size, &s.block_hashes);
  // NOTE: the table's num_tokens is s.num_cached, the KV verified valid; slots of draft tokens
  // lie past it until accepted, so a block holding rejected draft KV is never registered.
  s.blocks.cache_full_blocks(*pool_, s.block_hashes);
}

std::span<const BlockHash> Engine::hit_candidates(const Seq& s) const {
  // NOTE: a proposer that needs hidden states needs them for every position, and a cached
  // prefix has none: such sequences compute their whole prompt (their blocks are still
  // registered for others).
  if (wants_hidden(s)) return {};
  const size_t max_blocks = (s.tokens.size() - 1) / static_cast<size_t>(opts_.block_size);
  return std::span<const BlockHash>(s.block_hashes).first(std::min(max_blocks, s.block_hashes.size()));
}

int32_t Engine::num_running() const {
  return static_cast<int32_t>(
      std::count_if(running_.begin(), running_.end(), [](const auto& s) { return s->finish == FinishReason::kNone; }));
}

StepState Engine::step_state() const {
  StepState st;
  st.num_free_blocks = pool_->num_free();
  st.block_size = opts_.block_size;
  for (const auto& r : running_) {
    // A sequence that finished in the last step stays in running_ until the next one starts
    // (its blocks are freed already); between steps (add_migrated's admission) it is not live.
    if (r->finish != FinishReason::kNone) continue;
    RunningSeq x;
    x.id = r->id;
    x.priority = r->params.priority;
    x.arrival = r->id;  // ids follow arrival order
    x.num_tokens = static_cast<int32_t>(r->tokens.size());
    x.num_cached = r->num_cached;
    x.num_blocks = static_cast<int32_t>(r->blocks.blocks().size());
    for (int32_t b : r->blocks.blocks()) {
      if (pool_->ref_count(b) > 1) x.shared_blocks.push_back(b);  // only running sequences hold blocks
    }
    x.k = r->k;  // within the request's cap (0: never drafts), which the policy honours
    x.num_output_left = r->params.max_tokens - r->num_generated;
    x.num_steps_waited = r->num_steps_waited;
    st.running.push_back(x);
  }
  for (const auto& w : waiting_) {
    WaitingSeq x;
    x.id = w->id;
    x.priority = w->params.priority;
    x.arrival = w->id;
    x.num_tokens = static_cast<int32_t>(w->tokens.size());
    x.num_steps_waited = w->num_steps_waited;
    if (opts_.enable_prefix_caching) {
      const std::vector<int32_t> hit = pool_->find_cached_prefix(hit_candidates(*w));
      x.num_cached = static_cast<int32_t>(hit.size()) * opts_.block_size;
      for (int32_t b : hit) {
        if (pool_->ref_count(b) == 0) x.evictable_hit_blocks.push_back(b);
      }
    }
    st.waiting.push_back(x);
  }
  return st;
}

StepLimits Engine::step_limits() const {
  StepLimits l;
  l.max_num_seqs = opts_.max_num_seqs;
  l.max_num_batched_tokens = opts_.max_num_batched_tokens;
  l.max_model_len = opts_.max_model_len;
  l.num_speculative_tokens = opts_.num_speculative_tokens;
  l.disable_by_batch_size = opts_.disable_by_batch_size;
  l.has_proposer = proposer_ != nullptr;
  l.priority_aging_steps = opts_.priority_aging_steps;
  return l;
}

}  // namespace specserve
