// specserve model: turning one row of logits into the next token.
//
// The same code serves plain decoding and lossless speculative sampling: the verifier needs
// the exact processed target distribution p and draft distribution q, so the whole logits ->
// distribution pipeline is one const function (`Sampler::compute_probs`) and drawing from it is
// another (`Sampler::sample_from`). Pure: no threads, no I/O; one Sampler per sequence.
//
// Pipeline (the order HF transformers' logits warpers use, which vLLM follows):
//   1. repetition penalty   over prompt + output tokens        (CTRL, Keskar et al. 2019; HF/vLLM)
//   2. frequency, presence  over output tokens only            (OpenAI API semantics; vLLM)
//   3. temperature          temperature < 1e-5 is greedy: one-hot at the argmax (vLLM's eps)
//   4. top-k                keep exactly k tokens
//   5. top-p (nucleus)      Holtzman et al. 2020
//   6. min-p                keep p >= min_p * p_max (Nguyen et al. 2024)
// Each filter renormalises what it keeps; filtered tokens get probability exactly 0.
//
// Ties are broken towards the lower token id everywhere (argmax, top-k boundary, top-p order,
// top-n logprobs), so results never depend on the order of a sort.
//
// Cost at vocab 49152: exp is a vectorised
// polynomial (relative error < 1e-7, exp(-inf) = 0), identical bit for bit on the AVX2 and the
// scalar path; top-k uses a k-heap, top-p a histogram over log-probability buckets plus a sort
// of one bucket, so no step sorts the whole vocabulary.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

/// Per-request sampling options, named as in vLLM / the OpenAI API.
struct SamplingParams {
  float temperature = 1.0f;          ///< 0 (or < 1e-5) = greedy
  int32_t top_k = -1;                ///< <= 0 or >= vocab: off
  float top_p = 1.0f;                ///< in (0, 1]; 1 = off
  float min_p = 0.0f;                ///< in [0, 1]; 0 = off
  uint64_t seed = 0;                 ///< used only when has_seed
  bool has_seed = false;             ///< false: the Sampler seeds itself from std::random_device
  float presence_penalty = 0.0f;     ///< in [-2, 2]; subtracted once per token seen in the output
  float frequency_penalty = 0.0f;    ///< in [-2, 2]; subtracted per occurrence in the output
  float repetition_penalty = 1.0f;   ///< > 0; 1 = off; applied to tokens of prompt + output
  int32_t logprobs = 0;              ///< top-n logprobs to return, 0..20
  std::vector<int32_t> stop_token_ids;  ///< extra stop tokens (honoured by the request, not here)
  bool ignore_eos = false;              ///< keep generating past EOS (honoured by the request)
  /// vLLM's min_tokens: no stop (EOS, stop_token_ids, stop strings) before this many output
  /// tokens; the stop tokens get probability 0 until then (honoured by the engine, which also
  /// checks min_tokens <= max_tokens). >= 0; 0 = off.
  int32_t min_tokens = 0;

  /// Ok, or kInvalidArgument naming the first impossible field and its value, e.g.
  /// "top_p = 1.5: must be in (0, 1]". NaN fails every range check.
  Status validate() const;

  /// True when the temperature selects greedy decoding (temperature < 1e-5).
  bool is_greedy() const;
};

/// One (token, log-probability) pair.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;  ///< natural log
};

/// What `Sampler::sample` returns.
struct SampleResult {
  int32_t token = -1;
  /// log_softmax of the raw logits (before penalties and temperature) at `token`: vLLM's default
  /// ("raw_logprobs"), i.e. what the model itself assigns, independent of the sampling options.
  float logprob = 0.0f;
  /// The `params.logprobs` most likely tokens under the same raw log_softmax, highest first,
  /// ties by lower token id. Empty when params.logprobs == 0.
  std::vector<TokenLogprob> top_logprobs;
};

/// log(sum_i exp(x[i])) of x[0..n): max + log(sum_i exp(x[i] - max)), the sum in double over
/// the vectorised exp of the file comment, so one row gives the same bits on every build. n > 0;
/// when no value is finite, or one is +inf, the row's max is returned. NaN: undefined. The
/// normaliser of every raw logprob this runtime reports (Sampler::sample, the engine's
/// verifier, Backend::argmax_rows on the CPU).
double log_sum_exp(const float* x, int32_t n);

/// True when the logit row x[0..n) can be sampled: no NaN, no +inf, at least one finite value.
bool samplable_row(const float* x, int32_t n);

/// A token chosen from one logit row, and its raw logprob.
struct RowPick {
  int32_t token = -1;     ///< the chosen token; -1: the row cannot be sampled
  float logprob = 0.0f;   ///< x[token] - log_sum_exp(x, n), rounded to float (0 when token is -1)
};

/// The greedy token of the logit row x[0..n) (n > 0) and its raw logprob, exactly as
/// Sampler::sample gives them for a greedy request without penalties. token is -1 when the row
/// cannot be sampled: a NaN or +inf in it, or no finite value. The reference that every
/// Backend::argmax_rows (model/backend.h) is tested against.
RowPick greedy_pick(const float* x, int32_t n);

/// The token of a request with only a temperature (no top-k, top-p, min-p nor penalties) drawn
/// from the logit row x[0..n) with the uniform u in [0, 1), and its raw logprob: exactly what
/// Sampler::compute_probs then Sampler::sample_from give when next_uniform() returns u.
/// temperature < 1e-5 is greedy_pick. token -1 as greedy_pick's. The reference of
/// Backend::sample_rows.
RowPick temperature_pick(const float* x, int32_t n, float temperature, double u);

/// Inverse-CDF draw over non-negative weights p[0..n) with a positive sum, for the uniform u in
/// [0, 1): target = u * total, where total is the sum of the chunk totals (chunks of 1024
/// weights, each summed in 8 float lanes, then in double); the first chunk whose running double
/// prefix plus its total exceeds target is scanned in index order with a running double sum
/// from that prefix, and the first index with p > 0 whose running sum exceeds target is drawn
/// (a chunk that rounding leaves without one hands on to the next); failing everywhere, the
/// last index with p > 0. Chunked so that a GPU takes the very same steps. Never returns a
/// zero-weight index.
int32_t draw_inverse_cdf(const float* p, size_t n, double u);

/// Samples one sequence's tokens. Holds the sequence's RNG, so the same params (with a seed)
/// and the same logits give the same tokens. One per sequence; a Sampler is not thread-safe,
/// but different Samplers may run on different threads (the const functions use per-thread
/// scratch buffers, so they allocate nothing after a thread's first call).
class Sampler {
 public:
  /// Validates `params` first: kInvalidArgument as SamplingParams::validate().
  static Expected<Sampler> create(const SamplingParams& params);

  /// `params` must pass validate() (aborts otherwise: a caller bug). The RNG is
  /// std::mt19937_64 seeded with params.seed when has_seed, else from std::random_device.
  explicit Sampler(const SamplingParams& params);

  const SamplingParams& params() const { return params_; }

  /// The final distribution for one position: penalties, temperature, top-k, top-p, min-p
  /// (see the file comment). `logits` [vocab] fp32, finite or -inf, at least one finite.
  /// `prompt` and `output` are the sequence's token ids so far (each in [0, vocab); out of
  /// range aborts); `output` excludes the token being sampled. `probs` is resized to [vocab]:
  /// non-negative, zero for filtered tokens, summing to 1 (up to rounding). Greedy: one-hot at
  /// the argmax of the penalised logits. Deterministic, and bit-identical across builds with and
  /// without AVX2; does not touch the RNG.
  void compute_probs(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                     std::span<const int32_t> output, std::vector<float>* probs) const;

  /// Draws a token from `probs` (any non-negative weights with a positive sum; need not be
  /// normalised) by inverse CDF with exactly one `next_uniform()` draw: draw_inverse_cdf.
  /// Never returns a zero-probability index.
  int32_t sample_from(const std::vector<float>& probs);

  /// One uniform double in [0, 1) from the sampler's RNG: the top 53 bits of one mt19937_64
  /// output times 2^-53 (portable, unlike std::uniform_real_distribution). The verifier draws
  /// its acceptance uniforms here so one seed fixes the whole sequence.
  double next_uniform();

  /// compute_probs + sample_from (greedy draws no uniform), plus logprobs of the raw logits
  /// (see SampleResult). Same argument contract as compute_probs.
  SampleResult sample(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                      std::span<const int32_t> output);

  /// The RNG's whole state as text (std::mt19937_64's stream form: 313 decimal numbers), so a
  /// sequence that moves to another worker (KV migration) continues with the same random stream.
  std::string rng_state() const;
  /// Restarts the RNG from `seed` (std::mt19937_64's seeding). For counter-based streams: a
  /// proposer that must draw the same token at the same position however the sequence got
  /// there (migrated, preempted) seeds each draw from the request's seed and the position.
  void reseed(uint64_t seed) { rng_.seed(seed); }
  /// Restores a state from rng_state(). kInvalidArgument when `state` is not one (the RNG is
  /// then unchanged).
  Status set_rng_state(const std::string& state);

  /// Index of the largest of `logits[0..n)`; ties go to the lowest index; n must be > 0.
  static int32_t argmax(const float* logits, int32_t n);

  /// `logits` [vocab] after the repetition, frequency and presence penalties, into `out`
  /// (resized to [vocab]). Exposed for tests and for proposers that need penalised logits.
  void apply_penalties(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                       std::span<const int32_t> output, std::vector<float>* out) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> probs_scratch_;  // [vocab], reused by sample() to avoid an alloc per step
};

}  // namespace specserve
