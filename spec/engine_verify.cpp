// specserve spec: the engine's verification of drafts against the target's logits (chains:
// Leviathan et al. 2023; trees: spec/tree_verify.h), emission of the tokens it produced under
// the stop rules (stop tokens, stop strings, max_tokens, the context), and KV compaction of an
// accepted tree path.
#include <algorithm>
#include <cmath>
#include <limits>

#include "spec/engine.h"
#include "spec/engine_internal.h"
#include "spec/tree_verify.h"

namespace specserve {

namespace engine_internal {

SampleResult raw_logprobs(const float* row, int32_t vocab, int32_t token, int32_t top_n) {
  // The normaliser of Sampler::sample and Backend::argmax_rows: one token gets the same bits
  // whichever of them reports it.
  const double lse = log_sum_exp(row, vocab);
  SampleResult r;
  r.token = token;
  r.logprob = static_cast<float>(row[token] - lse);
  if (top_n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i) idx[static_cast<size_t>(i)] = i;
    const int32_t n = std::min(top_n, vocab);
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) {
      r.top_logprobs.push_back({idx[static_cast<size_t>(i)], static_cast<float>(row[idx[static_cast<size_t>(i)]] - lse)});
    }
  }
  return r;
}

size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t from, size_t floor,
                        size_t* which) {
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops.size(); ++i) {
    const std::string& st = stops[i];
    // Matches ending at or before `floor` do not count: start the search where one would end after it.
    const size_t lo = std::max(from, floor >= st.size() ? floor - st.size() + 1 : size_t{0});
    const size_t p = text.find(st, lo);
    if (p != std::string::npos && p < best) best = p, *which = i;
  }
  return best;
}

size_t sendable_prefix(const std::string& text, size_t hold) {
  const size_t end = text.size() > hold ? text.size() - hold : 0;
  // At most 3 bytes back (a character's continuation bytes): stray continuation bytes that the
  // decoder passed through (text that can never be valid) must not hold back the rest.
  size_t cut = end;
  while (cut > 0 && end - cut < 3 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return (cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) ? end : cut;
}

}  // namespace engine_internal

using engine_internal::find_stop_string;
using engine_internal::sendable_prefix;
using engine_internal::raw_logprobs;

bool Engine::is_stop_token(const SamplingParams& sp, int32_t token) const {
  if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) != sp.stop_token_ids.end()) return true;
  return !sp.ignore_eos && tokenizer_ && tokenizer_->eog_ids().count(token);
}

bool Engine::below_min_tokens(const Seq& s, int32_t ahead) { return s.num_generated + ahead < s.params.sampling.min_tokens; }

const float* Engine::gated_row(const Seq& s, const float* row, int32_t vocab, int32_t ahead) {
  if (!below_min_tokens(s, ahead)) return row;
  min_tokens_row_.assign(row, row + vocab);
  const SamplingParams& sp = s.params.sampling;
  for (int32_t t : sp.stop_token_ids) {
    if (t < vocab) min_tokens_row_[static_cast<size_t>(t)] = -INFINITY;
  }
  // NOTE: the end-of-generation ids are masked even under ignore_eos, as vLLM's
  // _all_stop_token_ids always holds the model's EOS.
  if (tokenizer_) {
    for (int32_t t : tokenizer_->eog_ids()) {
      if (t >= 0 && t < vocab) min_tokens_row_[static_cast<size_t>(t)] = -INFINITY;
    }
  }
  return min_tokens_row_.data();
}

bool Engine::emit(Seq& s, int32_t token, const SampleResult* lp, SeqEvent* ev) {
  if (below_min_tokens(s)) {
    // gated_row gave every stop token probability 0: a sampling path that skipped it is a bug.
    SPECSERVE_CHECK(!is_stop_token(s.params.sampling, token),
                    "seq " + std::to_string(s.id) + ": stop token " + std::to_string(token) + " sampled below min_tokens");
  } else if (is_stop_token(s.params.sampling, token)) {
    // The stop token ends the output and is not part of it. The model's EOS has no stop_reason
    // (vLLM's); any other end-of-generation id (e.g. <|im_end|>, which vLLM takes from the
    // generation config into stop_token_ids) and a stop_token_ids id are their own.
    if (s.params.sampling.ignore_eos || !tokenizer_ || token != tokenizer_->eos_id()) s.stop_token = token;
    if (s.decoder) {
      // include_stop_str_in_output: the stop token's text ends the text (vLLM's detokenizer skips
      // it only without the flag; a control token such as EOS renders as ""). NOTE: it was left
      // out with the flag too.
      if (s.params.include_stop_str) s.text += s.decoder->push(token);
      if (!s.decoder->flush().empty()) s.text += "\xEF\xBF\xBD";
    }
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
    if (below_min_tokens(s)) {
      s.stop_floor = s.text.size();  // no stop string may end within the first min_tokens - 1 tokens' text
    } else if (!s.params.stop.empty()) {
      // Search only where a match could end in the new text.
      const size_t from = s.sent >= s.max_stop_len ? s.sent - s.max_stop_len + 1 : 0;
      size_t which = 0;
      const size_t best = find_stop_string(s.text, s.params.stop, from, s.stop_floor, &which);
      if (best != std::string::npos) {
        s.stop_string = s.params.stop[which];
        s.text.resize(best + (s.params.include_stop_str ? s.stop_string.size() : 0));
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
  if (s.decoder) {
    const size_t cut = sendable_prefix(s.text, hold);
    if (cut > s.sent) {
      ev->text += s.text.substr(s.sent, cut - s.sent);
      s.sent = cut;
    }
  }
  if (at_len) {
    finish(s, FinishReason::kLength);
    return false;
  }
  return true;
}

int32_t Engine::verify_chain(Seq& s, const DraftTree& d, const ForwardOutput& out, int32_t seq, bool picks, SeqEvent* ev) {
  const int32_t vocab = static_cast<int32_t>(out.vocab_size);
  const int32_t k = static_cast<int32_t>(d.tokens.size());
  if (picks) {
    // Greedy without penalties: the target's token at each row is its argmax; keep the longest
    // matching prefix, then the target's own token (what the loop below does with one-hot p).
    int32_t accepted = 0;
    for (int32_t r = 0; r <= k; ++r) {
      SampleResult lp;
      lp.token = out.argmax_of(seq, r);
      lp.logprob = out.argmax_logprob_of(seq, r);
      const bool accept = r < k && d.tokens[static_cast<size_t>(r)] == lp.token;
      const bool alive = emit(s, lp.token, &lp, ev);
      if (accept) ++accepted;
      if (!accept || !alive) break;
    }
    return accepted;
  }
  Sampler& smp = *s.sampler;
  const bool greedy = s.params.sampling.is_greedy();
  const int32_t top_n = s.params.sampling.logprobs;
  std::vector<float> p_probs, resid;
  int32_t accepted = 0;
  bool alive = true;
  for (int32_t r = 0; r <= k && alive; ++r) {
    const float* row = out.row(seq, r);
    smp.compute_probs(gated_row(s, row, vocab), vocab, s.prompt(), s.output(), &p_probs);
    int32_t token;
    bool accept = false;
    if (r < k) {
      const int32_t x = d.tokens[static_cast<size_t>(r)];
      if (greedy) {
        accept = p_probs[static_cast<size_t>(x)] > 0.0f;  // one-hot at the argmax
      } else {
        // Leviathan et al. 2023, Algorithm 1: accept x with probability min(1, p(x)/q(x)).
        const float qx = d.probs.empty() ? 1.0f : d.probs[static_cast<size_t>(r)][static_cast<size_t>(x)];
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
        if (d.probs.empty()) {
          resid[static_cast<size_t>(x)] = 0.0f;
        } else {
          const auto& q = d.probs[static_cast<size_t>(r)];
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
    alive = emit(s, token, &lp, ev);
    if (accept) ++accepted;
    if (!accept) break;
  }
  return accepted;
}

std::vector<int32_t> Engine::verify_tree(Seq& s, const DraftTree& d, const ForwardOutput& out, int32_t seq, bool picks,
                                         SeqEvent* ev) {
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
      const auto path_v = tree.path_to(v);
      for (int32_t a : path_v) output.push_back(d.tokens[static_cast<size_t>(a)]);
      smp.compute_probs(gated_row(s, out.row(seq, v + 1), vocab, static_cast<int32_t>(path_v.size())), vocab, s.prompt(), output,
                        &vp[static_cast<size_t>(v + 1)]);
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
    NodeVerdict verdict;
    SampleResult lp;
    if (picks) {  // greedy without penalties: the argmax is the target's token
      verdict.token = out.argmax_of(seq, v + 1);
      verdict.child = greedy_child(tree, d.tokens, v, verdict.token);
      lp.token = verdict.token;
      lp.logprob = out.argmax_logprob_of(seq, v + 1);
    } else {
      const float* row = out.row(seq, v + 1);
      // p after the path so far: emit() appended it to s's output, so penalties see it.
      smp.compute_probs(gated_row(s, row, vocab), vocab, s.prompt(), s.output(), &p);
      if (greedy) {
        verdict.token = Sampler::argmax(p.data(), vocab);  // p is one-hot at the argmax
        verdict.child = greedy_child(tree, d.tokens, v, verdict.token);
      } else {
        verdict = rejection_sample_children(tree.children_of(v), d.tokens, d.probs, &p, smp);
      }
      lp = raw_logprobs(row, vocab, verdict.token, top_n);
    }
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

}  // namespace specserve
