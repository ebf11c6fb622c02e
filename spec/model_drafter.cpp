#include "spec/model_drafter.h"

#include <algorithm>
#include <cmath>

#include "model/sampling.h"
#include "spec/sparse_probs.h"

namespace specserve {

struct ModelDrafter::SeqState {
  std::vector<int32_t> cached;  // tokens whose KV the drafter holds, in order
  BlockTable blocks;
  std::vector<BlockHash> hashes;  // chain hashes of the full blocks of the sequence's known tokens
  std::optional<Sampler> sampler;  // draws the draft tokens of sampling requests
};

ModelDrafter::ModelDrafter(Transformer& m, DrafterOptions o) : model_(m), opts_(std::move(o)) {}

ModelDrafter::~ModelDrafter() {
  for (auto& [id, s] : seqs_) s->blocks.release_all(*pool_);
}

Expected<std::unique_ptr<ModelDrafter>> ModelDrafter::create(Transformer& model, DrafterOptions o) {
  const ModelConfig& c = model.config();
  if (o.num_layers < 0 || o.num_layers > c.num_layers) {
    return invalid_argument("num_layers = " + std::to_string(o.num_layers) + ": must be in 1.." + std::to_string(c.num_layers));
  }
  if (!(o.sparse_keep_mass > 0.0 && o.sparse_keep_mass <= 1.0)) {
    return invalid_argument("sparse_keep_mass = " + std::to_string(o.sparse_keep_mass) + ": must be in (0, 1]");
  }
  SPECSERVE_RETURN_IF_ERROR(check_draft_p_min(o.draft_p_min));
  if (o.sparse_max_entries < 0) {
    return invalid_argument("sparse_max_entries = " + std::to_string(o.sparse_max_entries) + ": must be >= 0 (0: no limit)");
  }
  if (o.num_layers == 0) o.num_layers = c.num_layers;
  if (o.max_model_len <= 0 || o.max_model_len > c.context_length) o.max_model_len = static_cast<int32_t>(c.context_length);
  if (o.num_kv_blocks <= 0) o.num_kv_blocks = (static_cast<int64_t>(o.max_model_len) * 4 + o.block_size - 1) / o.block_size;
  if (o.target_vocab_size <= 0) o.target_vocab_size = static_cast<int32_t>(c.vocab_size);
  std::unique_ptr<ModelDrafter> d(new ModelDrafter(model, o));
  auto kv = model.create_kv(o.num_kv_blocks, o.block_size, o.num_layers);
  if (!kv.ok()) return kv.status();
  d->kv_ = std::move(*kv);
  d->pool_ = std::make_unique<BlockPool>(static_cast<int32_t>(o.num_kv_blocks), o.block_size);
  return d;
}

void ModelDrafter::release(int64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  it->second->blocks.release_all(*pool_);
  seqs_.erase(it);
}

Status ModelDrafter::propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) {
  out->assign(reqs.size(), DraftTree{});
  const int32_t vocab = static_cast<int32_t>(model_.config().vocab_size);
  const int32_t usable_vocab = std::min(vocab, opts_.target_vocab_size);
  // Which requests draft this step, and how many tokens each.
  struct Work {
    size_t req;
    SeqState* st;
    int32_t k;
    float score = 0;  // log of the drafted tokens' path probability (draft_p_min)
  };
  std::vector<Work> work;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const DraftRequest& r = reqs[i];
    const int32_t len = static_cast<int32_t>(r.tokens.size());
    // NOTE: a draft whose context is shorter than the target's stops drafting for a sequence
    // near its own limit; the target goes on without drafts (plain decoding).
    const int32_t k = std::min(r.num_tokens, opts_.max_model_len - len);
    if (k <= 0) {
      release(r.seq_id);
      continue;
    }
    auto& slot = seqs_[r.seq_id];
    if (!slot) {
      slot = std::make_unique<SeqState>();
      if (r.sampling && !r.sampling->is_greedy()) {
        SamplingParams sp = *r.sampling;
        // The draft's own stream: derived from the request's seed so runs repeat.
        sp.seed = sp.has_seed ? sp.seed * 0x9E3779B97F4A7C15ull + 1 : 0;
        slot->sampler.emplace(sp);
      }
    }
    SeqState& st = *slot;
    const size_t bs = static_cast<size_t>(opts_.block_size);
    if (opts_.enable_prefix_caching) {
      extend_block_hashes(r.tokens, opts_.block_size, &st.hashes);
      if (st.blocks.blocks().empty()) {
        // A fresh sequence: its cached prefix (whole blocks before the last known token, as in
        // the engine); the catch-up pass below computes the rest.
        const int32_t max_blocks = static_cast<int32_t>((r.tokens.size() - 1) / bs);
        const int32_t hit = st.blocks.acquire_cached_prefix(*pool_, st.hashes, max_blocks, len);
        st.cached.assign(r.tokens.begin(), r.tokens.begin() + hit);
      }
    }
    // Roll back to the longest common prefix of what we hold and what the sequence is.
    size_t common = 0;
    while (common < st.cached.size() && common + 1 < r.tokens.size() && st.cached[common] == r.tokens[common]) ++common;
    st.cached.resize(common);
    st.blocks.truncate(*pool_, static_cast<int32_t>(common));
    st.blocks.set_num_tokens(static_cast<int32_t>(common));
    if (!st.blocks.reserve(*pool_, len + k).ok()) {
      release(r.seq_id);  // no room: this sequence goes without drafts this step
      continue;
    }
    work.push_back({i, &st, k, 0.0f});
  }
  // NOTE: blocks are registered once they hold only confirmed tokens before the last known one:
  // a later call truncates to at least that prefix (the target's tokens never roll back, and
  // the last known token is always fed again), so registered KV is never overwritten.
  auto cache_confirmed = [&](const Work& w) {
    if (!opts_.enable_prefix_caching) return;
    const size_t confirmed = (reqs[w.req].tokens.size() - 1) / static_cast<size_t>(opts_.block_size);
    w.st->blocks.cache_full_blocks(*pool_, std::span<const BlockHash>(w.st->hashes).first(std::min(confirmed, w.st->hashes.size())));
  };
  if (work.empty()) return Status();

  ForwardBatch batch;
  batch.num_layers = opts_.num_layers;
  ForwardOutput fo;
  std::vector<float> probs, masked;
  const bool sparse = opts_.sparse_keep_mass < 1.0 || opts_.sparse_max_entries > 0;
  // NOTE: a draft model whose logits are NaN or +inf (NaN weights, an fp16 overflow) made the
  // sampler's checks abort the process (a whole `serve`) on the first sampled request; it is a
  // failing proposer instead, which the engine turns into a step without drafts. Greedy drafts
  // need no check: argmax of such a row is a valid (if useless) token the target rejects.
  Status bad_logits;
  auto draw = [&](const Work& w, const float* row) -> int32_t {
    const DraftRequest& r = reqs[w.req];
    masked.assign(row, row + vocab);
    for (int32_t t = usable_vocab; t < vocab; ++t) masked[static_cast<size_t>(t)] = -INFINITY;
    DraftTree& d = (*out)[w.req];
    if (!w.st->sampler) return Sampler::argmax(masked.data(), vocab);
    bool any_finite = false;
    for (int32_t t = 0; t < usable_vocab; ++t) {
      const float x = masked[static_cast<size_t>(t)];
      if (std::isnan(x) || x == INFINITY) {
        bad_logits = internal_error("draft model: logit of token " + std::to_string(t) + " is " + std::to_string(x) +
                                    " (seq " + std::to_string(r.seq_id) + "): no drafts this step");
        return 0;
      }
      any_finite = any_finite || x > -INFINITY;
    }
    if (!any_finite) {
      bad_logits = internal_error("draft model: no finite logit (seq " + std::to_string(r.seq_id) + "): no drafts this step");
      return 0;
    }
    std::span<const int32_t> prompt(r.tokens.data(), static_cast<size_t>(r.prompt_len));
    std::vector<int32_t> output(r.tokens.begin() + r.prompt_len, r.tokens.end());
    output.insert(output.end(), d.tokens.begin(), d.tokens.end());
    w.st->sampler->compute_probs(masked.data(), vocab, prompt, output, &probs);
    if (r.sampling->has_seed) {
      // NOTE: counter-based draft randomness: the draw for position p of a seeded request is
      // seeded from (seed, p), so the same context gives the same draft however the sequence got
      // here — after a migration to another worker or a preemption — and the target's verifier
      // then consumes the same uniforms: seeded output does not depend on where it ran.
      const uint64_t pos = r.tokens.size() + d.tokens.size();
      w.st->sampler->reseed(r.sampling->seed * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull * (pos + 1));
    }
    // Truncate first, then draw from the truncated q: the reported q is the proposal (see
    // DrafterOptions::sparse_keep_mass).
    if (sparse) truncate_probs(&probs, opts_.sparse_keep_mass, opts_.sparse_max_entries);
    const int32_t t = w.st->sampler->sample_from(probs);
    // q over the target's vocabulary: padding rows get 0, missing rows (draft smaller) get 0.
    probs.resize(static_cast<size_t>(opts_.target_vocab_size), 0.0f);
    d.probs.push_back(probs);
    return t;
  };
  // A greedy draft over the whole draft vocabulary needs only each row's argmax: the backend
  // reduces the row where it lives (Backend::argmax_rows). A row that cannot be sampled (-1)
  // drafts token 0, a valid (if useless) token the target rejects, as the argmax of such a row
  // would.
  auto greedy_on_device = [&](const Work& w) { return !w.st->sampler && usable_vocab == vocab; };
  const float min_score = min_path_logprob(opts_.draft_p_min);
  // Pass 0: catch up on every token the drafter has not seen (including the last known one).
  for (const Work& w : work) {
    const DraftRequest& r = reqs[w.req];
    SequenceInput in;
    in.num_cached = static_cast<int32_t>(w.st->cached.size());
    in.tokens.assign(r.tokens.begin() + in.num_cached, r.tokens.end());
    in.block_table = w.st->blocks.blocks();
    in.argmax_only = greedy_on_device(w);
    batch.seqs.push_back(std::move(in));
  }
  for (int32_t step = 0;; ++step) {
    SPECSERVE_RETURN_IF_ERROR(model_.forward(batch, *kv_, &fo));
    ForwardBatch next;
    next.num_layers = opts_.num_layers;
    std::vector<Work> still;
    for (size_t j = 0; j < work.size(); ++j) {
      const Work& w = work[j];
      SeqState& st = *w.st;
      const SequenceInput& in = batch.seqs[j];
      st.cached.insert(st.cached.end(), in.tokens.begin(), in.tokens.end());
      st.blocks.set_num_tokens(static_cast<int32_t>(st.cached.size()));
      if (step == 0) cache_confirmed(w);
      const int32_t t = in.argmax_only ? std::max(0, fo.argmax_of(static_cast<int32_t>(j), 0)) : draw(w, fo.row(static_cast<int32_t>(j), 0));
      if (!bad_logits.ok()) return bad_logits;
      DraftTree& d = (*out)[w.req];
      Work nw = w;
      if (min_score > -INFINITY) {
        // The token's log-probability under the draft: the picked row's (greedy on the device),
        // the q it was drawn from (sampled), else the masked row's softmax. A row that cannot
        // be sampled (argmax -1, NaN) ends the draft.
        float lp = 0;
        bool keep = true;
        if (in.argmax_only) {
          lp = fo.argmax_logprob_of(static_cast<int32_t>(j), 0);
          keep = fo.argmax_of(static_cast<int32_t>(j), 0) >= 0;
        } else if (w.st->sampler) {
          // NOTE: the kept set K = {x : q(x) >= q_min} depends only on the tokens drafted
          // before; the token was drawn from the whole q. Outside K it is not proposed (the
          // target then samples this position itself); inside K it is proposed with
          // q' = q restricted to K, renormalised, which is what it was drawn from given that it
          // is in K. Then every position emits the target's p (Leviathan et al. 2023, Theorem 1,
          // for q' with probability q(K), plain sampling otherwise). Reporting the full q for a
          // kept token would be lossy: tests/spec/spec_distribution_test.cpp
          // DraftPMinDraftModelMatchesTarget fails with it (chi-square 639 against 369).
          std::vector<float>& q = d.probs.back();
          const float q_min = static_cast<float>(std::exp(static_cast<double>(min_score) - static_cast<double>(w.score)));
          lp = std::log(q[static_cast<size_t>(t)]);
          keep = q[static_cast<size_t>(t)] >= q_min;
          if (keep) {
            double kept_mass = 0;
            for (float& x : q) {
              if (!(x >= q_min)) x = 0.0f;
              kept_mass += x;
            }
            for (float& x : q) x = static_cast<float>(x / kept_mass);
          }
        } else {
          lp = masked[static_cast<size_t>(t)] - static_cast<float>(log_sum_exp(masked.data(), usable_vocab));
        }
        nw.score += std::min(0.0f, lp);
        keep = keep && std::isfinite(lp) && (w.st->sampler || nw.score >= min_score);
        if (!keep) {
          if (w.st->sampler) d.probs.pop_back();  // not proposed: its q goes too
          continue;                               // this sequence drafts no further
        }
      }
      d.tokens.push_back(t);
      if (static_cast<int32_t>(d.tokens.size()) < w.k) {
        SequenceInput nx;
        nx.num_cached = static_cast<int32_t>(st.cached.size());
        nx.tokens = {t};
        nx.block_table = st.blocks.blocks();
        nx.argmax_only = in.argmax_only;
        next.seqs.push_back(std::move(nx));
        still.push_back(nw);
      }
    }
    if (still.empty()) break;
    batch = std::move(next);
    work = std::move(still);
  }
  return Status();
}

Status check_draft_vocab(const std::vector<std::string>& target, const std::vector<std::string>& draft) {
  const int64_t nt = static_cast<int64_t>(target.size()), nd = static_cast<int64_t>(draft.size());
  if (std::llabs(nt - nd) > 128) {
    return invalid_argument("draft vocabulary size " + std::to_string(nd) + " and target vocabulary size " + std::to_string(nt) +
                            " differ by more than 128 padding rows");
  }
  const int64_t shared = std::min(nt, nd);
  for (int64_t i = 0; i < shared; ++i) {
    if (target[static_cast<size_t>(i)] != draft[static_cast<size_t>(i)]) {
      return invalid_argument("draft and target vocabularies differ at token id " + std::to_string(i) + ": target '" +
                              target[static_cast<size_t>(i)] + "', draft '" + draft[static_cast<size_t>(i)] +
                              "' (sizes " + std::to_string(nt) + " and " + std::to_string(nd) + ")");
    }
  }
  return Status();
}

}  // namespace specserve
