#include "spec/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/logging.h"
#include "spec/tree_verify.h"

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
    return invalid_argument("posterior_threshold = " + std::to_string(posterior_threshold) + ": must be in (0, 1]");
  }
  if (!(posterior_alpha >= 0.0f && posterior_alpha <= 1.0f)) {
    return invalid_argument("posterior_alpha = " + std::to_string(posterior_alpha) + ": must be in [0, 1]");
  }
  return Status();
}

struct Engine::Seq {
  int64_t id = 0;
  GenerateParams params;
  std::optional<Sampler> sampler;
  std::vector<int32_t> tokens;  // prompt + output
  int32_t prompt_len = 0;
  int32_t num_cached = 0;       // tokens whose KV is in the cache (always < tokens.size() while running)
  BlockTable blocks;
  std::vector<BlockHash> block_hashes;  // chain hashes of the full blocks of `tokens` (prefix caching)
  std::optional<StreamDecoder> decoder;
  std::string text;             // output text decoded so far (whole UTF-8)
  size_t sent = 0;              // bytes of text already emitted
  size_t max_stop_len = 0;
  int32_t num_generated = 0;
  int32_t k = 0;                // current speculation length (adaptive), within [1, max_k] once it drafted
  int32_t max_k = 0;            // this request's cap: min(GenerateParams::num_speculative_tokens, the engine's); 0: never drafts
  int64_t num_steps_waited = 0; // steps spent in waiting_ since it arrived (StepLimits aging)
  // Hidden hand-over (a proposer with needs_hidden(); spec/proposer.h): the target's final-norm
  // hidden states [n, hidden_size] of positions [hidden_begin, hidden_begin + n) not yet handed
  // to the proposer. While it runs, hidden_begin + n == num_cached.
  std::vector<float> hidden;
  int32_t hidden_begin = 0;
  FinishReason finish = FinishReason::kNone;
  SpecStats spec;
  // A migrated sequence waiting for admission with its KV outside the cache (add_migrated):
  // writes the KV of the first import_cached tokens when the step policy admits it.
  std::function<Status(KvStorage&, std::span<const int32_t>)> import_kv;
  int32_t import_cached = 0;
  std::span<const int32_t> prompt() const { return {tokens.data(), static_cast<size_t>(prompt_len)}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + prompt_len, tokens.size() - static_cast<size_t>(prompt_len)};
  }
};

Engine::Engine(Transformer& t, const Tokenizer* tok, Proposer* p, EngineOptions o)
    : target_(t), tokenizer_(tok), proposer_(p), opts_(std::move(o)) {}

Engine::~Engine() = default;

Expected<std::unique_ptr<Engine>> Engine::create(Transformer& target, const Tokenizer* tokenizer, Proposer* proposer,
                                                 EngineOptions options) {
  SPECSERVE_RETURN_IF_ERROR(options.validate());
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
    for (int32_t t : params.resume_output) s->text += s->decoder->push(t);
    for (const auto& st : params.stop) {
      if (s->text.find(st) != std::string::npos) {
        return invalid_argument("resume_output: its text already holds stop string \"" + st + "\" (the request had already finished)");
      }
    }
    // NOTE: emit() holds back the last max_stop_len - 1 bytes after every token, so after
    // these tokens the uninterrupted request had sent exactly this much of their text.
    const size_t hold = s->max_stop_len == 0 ? 0 : s->max_stop_len - 1;
    s->sent = s->text.size() > hold ? s->text.size() - hold : 0;
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
  if (!import.rng_state.empty()) SPECSERVE_CHECK(s.sampler->set_rng_state(import.rng_state).ok(), "rng state checked above");
  if (s.max_k > 0 && import.k >= 1) s.k = std::min(import.k, s.max_k);
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
  if (may_draft(s)) proposer_->release(s.id);
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

bool Engine::is_stop_token(const SamplingParams& sp, int32_t token) const {
  if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end()) return true;
  return !sp.ignore_eos && tokenizer_ && tokenizer_->eog_ids().count(token);
}

bool Engine::emit(Seq& s, int32_t token, const SampleResult* lp, SeqEvent* ev) {
  if (is_stop_token(s.params.sampling, token)) {
    // The stop token ends the output and is not part of it.
    if (s.decoder && !s.decoder->flush().empty()) s.text += "\xEF\xBF\xBD";
    ev->text += s.text.substr(s.sent);
    s.sent = s.text.size();
    finish(s, FinishReason::kStop);
    return false;
  }
  s.tokens.push_back(token);
  ++s.num_generated;
  ++stats_.generated_tokens;
  ev->tokens.push_back(token);
  if (lp) ev->logprobs.push_back(*lp);
  if (s.decoder) {
    s.text += s.decoder->push(token);
    if (!s.params.stop.empty()) {
      // Search only where a match could end in the new text.
      const size_t from = s.sent >= s.max_stop_len ? s.sent - s.max_stop_len + 1 : 0;
      size_t best = std::string::npos, best_len = 0;
      for (const auto& st : s.params.stop) {
        size_t p = s.text.find(st, from);
        if (p != std::string::npos && p < best) best = p, best_len = st.size();
      }
      if (best != std::string::npos) {
        s.text.resize(best + (s.params.include_stop_str ? best_len : 0));
        if (s.sent < s.text.size()) ev->text += s.text.substr(s.sent);
        s.sent = s.text.size();
        finish(s, FinishReason::kStop);
        return false;
      }
    }
  }
  const bool at_len = s.num_generated >= s.params.max_tokens ||
                      static_cast<int32_t>(s.tokens.size()) >= opts_.max_model_len;
  if (at_len && s.decoder) {
    // The output ends inside a multi-byte character: emit U+FFFD, never invalid UTF-8.
    if (!s.decoder->flush().empty()) s.text += "\xEF\xBF\xBD";
  }
  // Hold back a possible partial stop string.
  const size_t hold = (at_len || s.max_stop_len == 0) ? 0 : s.max_stop_len - 1;
  if (s.decoder && s.text.size() > s.sent + hold) {
    ev->text += s.text.substr(s.sent, s.text.size() - hold - s.sent);
    s.sent = s.text.size() - hold;
  }
  if (at_len) {
    finish(s, FinishReason::kLength);
    return false;
  }
  return true;
}

namespace {

// log_softmax of raw logits at `token`, plus the top-n (vLLM's default raw logprobs).
// True when `row` [vocab] can be sampled: no NaN, no +inf, at least one finite value.
bool samplable_row(const float* row, int32_t vocab) {
  bool any_finite = false;
  bool bad = false;
  for (int32_t v = 0; v < vocab; ++v) {
    const float x = row[v];
    bad |= (x != x) | (x == std::numeric_limits<float>::infinity());
    any_finite |= std::isfinite(x);
  }
  return !bad && any_finite;
}

SampleResult raw_logprobs(const float* row, int32_t vocab, int32_t token, int32_t top_n) {
  float mx = -INFINITY;
  for (int32_t i = 0; i < vocab; ++i) mx = std::max(mx, row[i]);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  SampleResult r;
  r.token = token;
  r.logprob = row[token] - lse;
  if (top_n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) idx[static_cast<size_t>(i)] = i;
    const int32_t n = std::min(top_n, vocab);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) r.top_logprobs.push_back({idx[static_cast<size_t>(i)], row[idx[static_cast<size_t>(i)]] - lse});
  }
  return r;
}

}  // namespace

std::vector<int32_t> Engine::verify_tree(Seq& s, const DraftTree& d, const ForwardOutput& out, int32_t seq, SeqEvent* ev) {
  const int32_t vocab = static_cast<int32_t>(out.vocab_size);
  const int32_t n = static_cast<int32_t>(d.tokens.size());
  std::vector<int32_t> chain;
  std::span<const int32_t> parents = d.parents;
  if (parents.empty()) {
    for (int32_t j = 0; j < n; ++j) chain.push_back(j - 1);
    parents = chain;
  }
  const TreeIndex tree = index_tree(parents);
  Sampler& smp = *s.sampler;
  const bool greedy = s.params.sampling.is_greedy();
  const int32_t top_n = s.params.sampling.logprobs;
  std::vector<int32_t> path;
  std::vector<float> p;
  if (opts_.typical_acceptance && !greedy) {
    // The target's distribution at every vertex, with the output that the path to it would
    // leave (penalties see it), then Medusa's longest typical path.
    std::vector<std::vector<float>> vp(static_cast<size_t>(n + 1));
    std::vector<int32_t> output;
    for (int32_t v = -1; v < n; ++v) {
      output.assign(s.output().begin(), s.output().end());
      for (int32_t a : tree.path_to(v)) output.push_back(d.tokens[static_cast<size_t>(a)]);
      smp.compute_probs(out.row(seq, v + 1), vocab, s.prompt(), output, &vp[static_cast<size_t>(v + 1)]);
    }
    TypicalAcceptanceParams tp;
    tp.posterior_threshold = opts_.posterior_threshold;
    tp.posterior_alpha = opts_.posterior_alpha;
    const std::vector<int32_t> typical = typical_accept_path(tree, d.tokens, vp, tp);
    int32_t v = -1;
    for (int32_t c : typical) {
      const int32_t token = d.tokens[static_cast<size_t>(c)];
      SampleResult lp = raw_logprobs(out.row(seq, v + 1), vocab, token, top_n);
      path.push_back(c);
      if (!emit(s, token, &lp, ev)) return path;
      v = c;
    }
    const int32_t bonus = smp.sample_from(vp[static_cast<size_t>(v + 1)]);
    SampleResult lp = raw_logprobs(out.row(seq, v + 1), vocab, bonus, top_n);
    emit(s, bonus, &lp, ev);
    return path;
  }
  int32_t v = -1;  // the vertex whose successor is decided next: the root, then accepted nodes
  for (;;) {
    const float* row = out.row(seq, v + 1);
    // p after the path so far: emit() appended it to s's output, so penalties see it.
    smp.compute_probs(row, vocab, s.prompt(), s.output(), &p);
    NodeVerdict verdict;
    if (greedy) {
      verdict.token = Sampler::argmax(p.data(), vocab);  // p is one-hot at the argmax
      verdict.child = greedy_child(tree, d.tokens, v, verdict.token);
    } else {
      verdict = rejection_sample_children(tree.children_of(v), d.tokens, d.probs, &p, smp);
    }
    SampleResult lp = raw_logprobs(row, vocab, verdict.token, top_n);
    const bool alive = emit(s, verdict.token, &lp, ev);
    if (verdict.child < 0) break;
    path.push_back(verdict.child);  // accepted, even when it ended the sequence (as for chains)
    if (!alive) break;
    v = verdict.child;
  }
  return path;
}

Status Engine::compact_path(Seq& s, int32_t base, std::span<const int32_t> path) {
  const auto moves = compaction_moves(path);
  if (moves.empty()) return Status();
  const int32_t bs = opts_.block_size;
  const std::vector<int32_t>& table = s.blocks.blocks();
  auto slot = [&](int32_t pos) { return table[static_cast<size_t>(pos / bs)] * bs + pos % bs; };
  std::vector<int32_t> src, dst;
  for (const auto& [from, to] : moves) {
    src.push_back(slot(base + from));
    dst.push_back(slot(base + to));
  }
  // NOTE: a move may write a slot an earlier move read (e.g. nodes 1, 2 to rows 1, 2), which is
  // safe only one move after the other (compaction_moves); Backend::kv_copy_slots promises no
  // order within a call, so such a path is copied one move per call.
  bool chained = false;
  for (int32_t d : dst) chained = chained || std::find(src.begin(), src.end(), d) != src.end();
  // Through the Transformer, so a tensor-parallel target moves every rank's KV.
  if (!chained) return target_.kv_copy_slots(*kv_, src.data(), dst.data(), static_cast<int64_t>(src.size()));
  for (size_t j = 0; j < src.size(); ++j) SPECSERVE_RETURN_IF_ERROR(target_.kv_copy_slots(*kv_, &src[j], &dst[j], 1));
  return Status();
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

Status Engine::step(std::vector<SeqEvent>* events) {
  for (int64_t id : aborted_) {
    SeqEvent ev;
    ev.seq_id = id;
    ev.finish = FinishReason::kAbort;
    events->push_back(std::move(ev));
  }
  aborted_.clear();
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s->finish != FinishReason::kNone; }),
                 running_.end());
  if (running_.empty() && waiting_.empty()) return Status();

  // Migrated sequences waiting with their KV outside the cache go first through the same
  // admission rule the plan applies (in queue order), so that they start with it loaded.
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i]->import_kv && admit_import(*waiting_[i])) --i;
  }
  // ---- plan (spec/step_policy.h): admission, rows and draft budget, preemption ----
  const StepState state = step_state();
  const StepLimits limits = step_limits();
  auto planned = plan_step(state, limits);
  if (!planned.ok()) return planned.status();
  StepPlan plan = std::move(*planned);
  for (int64_t id : plan.admitted) {
    auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->id == id; });
    SPECSERVE_CHECK(it != waiting_.end(), "admitted seq " + std::to_string(id) + " is not waiting");
    Seq& s = **it;
    s.import_kv = nullptr;  // (admit_import above admits such a sequence first; never reached)
    if (opts_.enable_prefix_caching) {
      // The hit the plan counted on: nothing changed the pool since step_state(), so the same
      // look-up finds the same blocks (admissions only add references).
      const auto planned_hit = std::find_if(state.waiting.begin(), state.waiting.end(), [&](const WaitingSeq& w) { return w.id == id; });
      const std::span<const BlockHash> cand = hit_candidates(s);
      const int32_t num_tokens = static_cast<int32_t>(s.tokens.size());
      s.num_cached = s.blocks.acquire_cached_prefix(*pool_, cand, static_cast<int32_t>(cand.size()), num_tokens);
      SPECSERVE_CHECK(s.num_cached == planned_hit->num_cached, "seq " + std::to_string(id) + ": prefix hit of " +
                                                                   std::to_string(s.num_cached) + " tokens, planned " +
                                                                   std::to_string(planned_hit->num_cached));
      stats_.prefix_cache_queries += num_tokens;
      stats_.prefix_cache_hits += s.num_cached;
      if (s.num_cached > 0) get_logger("spec")->debug("seq {}: prefix cache hit of {} of {} tokens", s.id, s.num_cached, num_tokens);
    }
    running_.push_back(std::move(*it));
    waiting_.erase(it);
  }
  // Aging (StepLimits::priority_aging_steps) counts the steps a sequence spends waiting.
  for (auto& w : waiting_) ++w->num_steps_waited;
  for (int64_t id : plan.preempted) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->id == id; });
    SPECSERVE_CHECK(it != running_.end(), "preempted seq " + std::to_string(id) + " is not running");
    Seq& victim = **it;
    victim.blocks.release_all(*pool_);
    victim.num_cached = 0;
    victim.hidden.clear();
    victim.hidden_begin = 0;  // the recompute hands every position over again from 0
    if (may_draft(victim)) proposer_->release(victim.id);
    get_logger("spec")->info("seq {}: preempted (recompute) for lack of KV blocks", victim.id);
    waiting_.push_back(std::move(*it));
    running_.erase(it);
  }
  if (plan.scheduled.empty()) return Status();
  ++stats_.num_steps;
  std::map<int64_t, Seq*> by_id;
  for (auto& r : running_) by_id[r->id] = r.get();

  // ---- drafts for the decode entries that may speculate ----
  std::vector<DraftTree> drafts(plan.scheduled.size());
  std::vector<DraftRequest> dreqs;
  std::vector<size_t> dreq_entry;
  std::vector<Seq*> dreq_seq;
  const int32_t hidden_size = static_cast<int32_t>(target_.config().hidden_size);
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const ScheduledSeq& e = plan.scheduled[i];
    if (e.num_draft_tokens == 0) continue;
    Seq& s = *by_id.at(e.id);
    SPECSERVE_CHECK(e.num_draft_tokens <= s.max_k, "seq " + std::to_string(s.id) + ": " + std::to_string(e.num_draft_tokens) +
                                                       " draft tokens planned over its cap " + std::to_string(s.max_k));
    DraftRequest r;
    r.seq_id = s.id;
    r.tokens = std::span<const int32_t>(s.tokens);
    r.prompt_len = s.prompt_len;
    r.num_tokens = e.num_draft_tokens;
    r.sampling = &s.params.sampling;
    if (wants_hidden(s)) {
      r.hidden_begin = s.hidden_begin;
      r.hidden = std::span<const float>(s.hidden);
      r.hidden_size = hidden_size;
    }
    dreqs.push_back(r);
    dreq_entry.push_back(i);
    dreq_seq.push_back(&s);
  }
  if (!dreqs.empty()) {
    std::vector<DraftTree> proposed(dreqs.size());
    const auto t0 = std::chrono::steady_clock::now();
    Status st = proposer_->propose(dreqs, &proposed);
    stats_.draft_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st.ok() && proposed.size() != dreqs.size()) {
      st = internal_error("returned " + std::to_string(proposed.size()) + " drafts for " + std::to_string(dreqs.size()) + " sequences");
    }
    if (!st.ok()) {
      // NOTE: a failing proposer degrades this step to plain decoding; the requests go on.
      get_logger("spec")->warn("proposer {} failed, decoding without drafts this step: {}", proposer_->name(), st.to_string());
      proposed.assign(dreqs.size(), DraftTree{});
    } else {
      // The hidden rows are handed over; a failed call gets them again with the next ones.
      for (size_t j = 0; j < dreqs.size(); ++j) {
        Seq& s = *dreq_seq[j];
        if (dreqs[j].hidden_size == 0) continue;
        s.hidden_begin += static_cast<int32_t>(s.hidden.size() / static_cast<size_t>(hidden_size));
        s.hidden.clear();
      }
    }
    const int64_t vocab = target_.config().vocab_size;
    for (size_t i = 0; i < dreqs.size(); ++i) {
      DraftTree& d = proposed[i];
      // A tree's node count is its draft budget (k); q is dense [vocab] per node.
      Status valid = validate_draft_tree(d, dreqs[i].num_tokens, vocab);
      if (!valid.ok()) {
        get_logger("spec")->warn("seq {}: proposer {} returned an invalid draft; ignored: {}", dreqs[i].seq_id, proposer_->name(),
                                 valid.message());
        d = DraftTree{};
      }
      if (d.tokens.empty()) d = DraftTree{};  // no guess: a plain decode row
      drafts[dreq_entry[i]] = std::move(d);
    }
  }
  // The draft budget the proposer left unused goes to prefill (and to decodes left out).
  std::vector<int32_t> num_drafted(plan.scheduled.size());
  for (size_t i = 0; i < drafts.size(); ++i) num_drafted[i] = static_cast<int32_t>(drafts[i].tokens.size());
  std::map<int64_t, DraftTree> draft_of;
  for (size_t i = 0; i < drafts.size(); ++i) {
    if (!drafts[i].tokens.empty()) draft_of[plan.scheduled[i].id] = std::move(drafts[i]);
  }
  plan = plan_prefill_after_drafts(state, limits, std::move(plan), num_drafted);

  // ---- KV blocks: the plan fits the free blocks by construction ----
  struct Planned { Seq* seq; int32_t rows; bool completes; DraftTree draft; };
  std::vector<Planned> batch_plan;
  for (const ScheduledSeq& e : plan.scheduled) {
    Seq& s = *by_id.at(e.id);
    if (e.is_prefill) stats_.prefill_tokens += e.rows;
    Status st = s.blocks.reserve(*pool_, s.num_cached + e.rows);
    SPECSERVE_CHECK(st.ok(), "seq " + std::to_string(s.id) + ": the step plan does not fit the KV cache: " + st.to_string());
    auto d = draft_of.find(e.id);
    batch_plan.push_back({&s, e.rows, e.completes, d == draft_of.end() ? DraftTree{} : std::move(d->second)});
  }

  // ---- one target forward ----
  ForwardBatch batch;
  for (const Planned& p : batch_plan) {
    SequenceInput in;
    Seq& s = *p.seq;
    in.num_cached = s.num_cached;
    in.tokens.assign(s.tokens.begin() + s.num_cached, s.tokens.begin() + s.num_cached + (p.draft.tokens.empty() ? p.rows : 1));
    in.tokens.insert(in.tokens.end(), p.draft.tokens.begin(), p.draft.tokens.end());
    in.block_table = s.blocks.blocks();
    if (!p.draft.tokens.empty()) {
      for (int32_t r = 0; r < p.rows; ++r) in.logit_rows.push_back(r);
    }
    if (!p.draft.parents.empty()) {
      // Row 0 is the last known token (it follows the cached prefix); node i is row i + 1.
      in.parents.push_back(-1);
      for (int32_t par : p.draft.parents) in.parents.push_back(par + 1);
    }
    if (wants_hidden(s)) {
      // Every row: prefill rows all go to the proposer; of a draft's rows only the accepted
      // path's will, which is known after verification.
      for (int32_t r = 0; r < static_cast<int32_t>(in.tokens.size()); ++r) in.hidden_rows.push_back(r);
      batch.return_hidden = true;
    }
    batch.seqs.push_back(std::move(in));
  }
  ForwardOutput out;
  const auto t0 = std::chrono::steady_clock::now();
  SPECSERVE_RETURN_IF_ERROR(target_.forward(batch, *kv_, &out));
  stats_.forward_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // ---- verify and emit ----
  const int32_t vocab = static_cast<int32_t>(out.vocab_size);
  std::vector<float> p_probs, resid;
  for (size_t i = 0; i < batch_plan.size(); ++i) {
    Planned& pl = batch_plan[i];
    Seq& s = *pl.seq;
    const bool keep_hidden = wants_hidden(s);
    // Appends hidden row `r` of this sequence (position s.hidden_begin + kept rows) to s.hidden.
    auto keep_hidden_row = [&](int32_t r) {
      const float* h = out.hidden_row(static_cast<int32_t>(i), r);
      s.hidden.insert(s.hidden.end(), h, h + out.hidden_size);
    };
    if (!pl.completes) {
      if (keep_hidden) {
        for (int32_t r = 0; r < pl.rows; ++r) keep_hidden_row(r);
      }
      s.num_cached += pl.rows;
      s.blocks.set_num_tokens(s.num_cached);
      cache_full_blocks(s);
      continue;
    }
    const int32_t k = static_cast<int32_t>(pl.draft.tokens.size());
    const int32_t base = s.num_cached + pl.rows - 1 - k;  // position of the last known token
    // Every known token's KV is valid now: cache its full blocks before emit() may finish the
    // sequence and release them (a one-token request still leaves its prompt cached).
    s.blocks.set_num_tokens(base + 1);
    cache_full_blocks(s);
    SeqEvent ev;
    ev.seq_id = s.id;
    Sampler& smp = *s.sampler;
    const bool greedy = s.params.sampling.is_greedy();
    const int32_t top_n = s.params.sampling.logprobs;
    int32_t accepted = 0;
    bool alive = true;
    // NOTE: a row the sampler cannot use (NaN, +inf: corrupt weights or a kernel bug) fails
    // this sequence alone with an error, instead of aborting the process in the sampler.
    for (int32_t r = 0; r <= k; ++r) {
      if (!samplable_row(out.row(static_cast<int32_t>(i), r), vocab)) {
        ev.error = "the target model produced non-finite logits (NaN or +inf) at position " + std::to_string(base + r) +
                   " of sequence " + std::to_string(s.id) + ": its weights are corrupt or a kernel failed";
        finish(s, FinishReason::kError);
        alive = false;
        break;
      }
    }
    // Trees (and, under typical acceptance, sampled chains) go through spec/tree_verify.h; plain
    // chains keep the chain verifier below.
    const bool is_tree = !pl.draft.parents.empty();
    const bool tree_verified = k > 0 && (is_tree || (opts_.typical_acceptance && !greedy));
    std::vector<int32_t> path;
    if (alive && tree_verified) {
      path = verify_tree(s, pl.draft, out, static_cast<int32_t>(i), &ev);
      accepted = static_cast<int32_t>(path.size());
    }
    for (int32_t r = 0; r <= k && alive && !tree_verified; ++r) {
      const float* row = out.row(static_cast<int32_t>(i), r);
      smp.compute_probs(row, vocab, s.prompt(), s.output(), &p_probs);
      int32_t token;
      bool accept = false;
      if (r < k) {
        const int32_t x = pl.draft.tokens[static_cast<size_t>(r)];
        if (greedy) {
          accept = p_probs[static_cast<size_t>(x)] > 0.0f;  // one-hot at the argmax
        } else {
          // Leviathan et al. 2023, Algorithm 1: accept x with probability min(1, p(x)/q(x)).
          const float qx = pl.draft.probs.empty() ? 1.0f : pl.draft.probs[static_cast<size_t>(r)][static_cast<size_t>(x)];
          const double u = smp.next_uniform();
          accept = qx > 0.0f && u * qx < p_probs[static_cast<size_t>(x)];
        }
        if (accept) {
          token = x;
        } else if (greedy) {
          token = Sampler::argmax(p_probs.data(), vocab);
        } else {
          // Recovered token: sample from norm(max(0, p - q)).
          resid.assign(p_probs.begin(), p_probs.end());
          double mass = 0;
          if (pl.draft.probs.empty()) {
            resid[static_cast<size_t>(x)] = 0.0f;
          } else {
            const auto& q = pl.draft.probs[static_cast<size_t>(r)];
            for (int32_t t = 0; t < vocab; ++t) resid[static_cast<size_t>(t)] = std::max(0.0f, resid[static_cast<size_t>(t)] - q[static_cast<size_t>(t)]);
          }
          for (float v : resid) mass += v;
          token = mass > 0 ? smp.sample_from(resid) : smp.sample_from(p_probs);
        }
      } else {
        // Bonus token (or the plain decode token when k == 0).
        token = greedy ? Sampler::argmax(p_probs.data(), vocab) : smp.sample_from(p_probs);
      }
      SampleResult lp = raw_logprobs(row, vocab, token, top_n);
      alive = emit(s, token, &lp, &ev);
      if (accept) ++accepted;
      if (!accept) break;
    }
    if (k > 0) {
      SpecStats step_spec;
      step_spec.num_drafts = 1;
      step_spec.num_draft_tokens = k;
      step_spec.num_accepted_tokens = accepted;
      step_spec.accepted_per_pos.assign(static_cast<size_t>(k), 0);
      for (int32_t a = 0; a < accepted; ++a) step_spec.accepted_per_pos[static_cast<size_t>(a)] = 1;
      s.spec.add(step_spec);
      if (s.finish != FinishReason::kNone) {
        // finish() (from emit) already recorded this sequence's counters: add this step's too.
        finished_stats_[s.id].add(step_spec);
        stats_.spec.add(step_spec);
      }
      // NOTE: for a tree, k is the node budget and a branching tree is never wholly accepted:
      // the heuristic would shrink it to 1, so trees keep their k.
      if (opts_.adaptive_k && !is_tree) {
        // NOTE: adaptive k follows Hugging Face's assisted-generation heuristic: +2 after a
        // fully accepted draft, -1 after any rejection, kept within [1, the request's cap].
        s.k = accepted == k ? std::min(s.k + 2, s.max_k) : std::max(1, s.k - 1);
      }
    }
    if (s.finish == FinishReason::kNone) {
      if (keep_hidden) {
        // Positions base - rows + 1 .. base (a prefill's rows, or the last known token), then
        // the accepted drafts at base + 1 ...: the rows whose KV stays.
        for (int32_t r = 0; r < (k == 0 ? pl.rows : 1); ++r) keep_hidden_row(r);
        for (int32_t a = 0; a < accepted; ++a) keep_hidden_row(tree_verified ? path[static_cast<size_t>(a)] + 1 : a + 1);
      }
      // KV is valid for the last known token and the accepted drafts; rejected slots go.
      if (tree_verified) SPECSERVE_RETURN_IF_ERROR(compact_path(s, base, path));
      s.num_cached = base + 1 + accepted;
      SPECSERVE_CHECK(!keep_hidden || s.hidden_begin + static_cast<int32_t>(s.hidden.size() / static_cast<size_t>(out.hidden_size)) ==
                                          s.num_cached,
                      "seq " + std::to_string(s.id) + ": hidden rows out of step with its KV");
      s.blocks.set_num_tokens(s.num_cached);
      s.blocks.truncate(*pool_, s.num_cached + 1);
      cache_full_blocks(s);
    }
    ev.finish = s.finish;
    events->push_back(std::move(ev));
  }
  return Status();
}

}  // namespace specserve
