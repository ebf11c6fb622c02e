#include "model/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECSERVE_SAMPLING_AVX2 1
#endif

namespace specserve {
namespace {

// vLLM's _SAMPLING_EPS: temperatures below it are greedy.
constexpr float kGreedyTemperature = 1e-5f;
// NOTE: top-p counts a running sum within this of top_p as having reached it, so a
// distribution such as {0.5, 0.3, ...} with top_p = 0.8 keeps exactly two tokens instead of
// depending on how float rounding lands.
constexpr double kTopPSlack = 1e-6;
constexpr int32_t kMaxLogprobs = 20;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::string fmt_value(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status bad_field(const char* field, double value, const char* rule) {
  return invalid_argument(std::string("sampling params: ") + field + " = " + fmt_value(value) +
                          ": " + rule);
}

// ---------------------------------------------------------------------------------------------
// Vector kernels. NOTE: hand-written AVX2 because GCC at -O2 does not vectorise these loops;
// the scalar fallback performs the same fused operations in the same lane order, so both paths
// give identical bits and a distribution never depends on the build.

// exp(x) for x <= 0 (Cephes expf: Cody-Waite reduction, degree-5 polynomial; relative error
// < 1e-7). x < -87 (including -inf) gives exactly 0, so masked tokens get probability 0.
constexpr float kExpLo = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f,
                kP3 = 4.1665795894e-2f, kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;

float exp_scalar(float x) {
  const uint32_t under = x < kExpLo ? ~0u : 0u;
  x = std::max(x, kExpLo);
  const float n = std::fma(x, kLog2e, kRound) - kRound;
  float r = std::fma(n, -kLn2Hi, x);
  r = std::fma(n, -kLn2Lo, r);
  float y = std::fma(kP0, r, kP1);
  y = std::fma(y, r, kP2);
  y = std::fma(y, r, kP3);
  y = std::fma(y, r, kP4);
  y = std::fma(y, r, kP5);
  y = std::fma(y, r * r, r) + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y * scale) & ~under);
}

#ifdef SPECSERVE_SAMPLING_AVX2
__m256 exp_avx2(__m256 x) {
  const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(kExpLo), _CMP_LT_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpLo));
  const __m256 round = _mm256_set1_ps(kRound);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), round), round);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), r);
  __m256 y = _mm256_fmadd_ps(_mm256_set1_ps(kP0), r, _mm256_set1_ps(kP1));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP2));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP3));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP4));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kP5));
  y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}
#endif

// Eight float lanes, flushed into a double every kFlush elements so long sums stay accurate.
constexpr size_t kFlush = 1024;

double flush_lanes(const float lane[8]) {
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lane[j];
  return s;
}

// out[i] = exp((x[i] - mx) * scale) for i < n; returns the sum of out.
double exp_sum(const float* x, size_t n, float mx, float scale, float* out) {
  double total = 0.0;
  size_t i = 0;
  while (i < n) {
    const size_t end = std::min(n, i + kFlush);
    alignas(32) float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef SPECSERVE_SAMPLING_AVX2
    __m256 acc = _mm256_setzero_ps();
    const __m256 vmx = _mm256_set1_ps(mx), vs = _mm256_set1_ps(scale);
    for (; i + 8 <= end; i += 8) {
      const __m256 e = exp_avx2(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx), vs));
      _mm256_storeu_ps(out + i, e);
      acc = _mm256_add_ps(acc, e);
    }
    _mm256_store_ps(lane, acc);
#else
    for (; i + 8 <= end; i += 8)
      for (int j = 0; j < 8; ++j) lane[j] += (out[i + j] = exp_scalar((x[i + j] - mx) * scale));
#endif
    for (int j = 0; i < end; ++i, ++j) lane[j] += (out[i] = exp_scalar((x[i] - mx) * scale));
    total += flush_lanes(lane);
  }
  return total;
}

double sum_of(const float* x, size_t n) {
  double total = 0.0;
  size_t i = 0;
  while (i < n) {
    const size_t end = std::min(n, i + kFlush);
    alignas(32) float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#ifdef SPECSERVE_SAMPLING_AVX2
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= end; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
    _mm256_store_ps(lane, acc);
#else
    for (; i + 8 <= end; i += 8)
      for (int j = 0; j < 8; ++j) lane[j] += x[i + j];
#endif
    for (int j = 0; i < end; ++i, ++j) lane[j] += x[i];
    total += flush_lanes(lane);
  }
  return total;
}

// x[i] *= f for i < n.
void scale_by(float* x, size_t n, float f) {
  size_t i = 0;
#ifdef SPECSERVE_SAMPLING_AVX2
  const __m256 vf = _mm256_set1_ps(f);
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vf));
#endif
  for (; i < n; ++i) x[i] *= f;
}

float max_of(const float* x, size_t n) {
  float m = -kInf;
  size_t i = 0;
#ifdef SPECSERVE_SAMPLING_AVX2
  __m256 acc = _mm256_set1_ps(-kInf);
  for (; i + 8 <= n; i += 8) acc = _mm256_max_ps(acc, _mm256_loadu_ps(x + i));
  alignas(32) float lane[8];
  _mm256_store_ps(lane, acc);
  for (float v : lane) m = std::max(m, v);
#endif
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// ---------------------------------------------------------------------------------------------
// The surviving tokens during filtering, as parallel arrays (so the kernels above run on them).

struct Survivors {
  std::vector<float> logit;  // penalised, before temperature
  std::vector<int32_t> id;
  std::vector<float> prob;
  size_t size() const { return id.size(); }
  void resize(size_t n) { logit.resize(n); id.resize(n); prob.resize(n); }
};

// Per-thread scratch: compute_probs is const and may run on several threads at once for
// different sequences; this keeps it allocation-free after the first call on each thread.
struct Workspace {
  std::vector<float> z;          // [vocab] penalised logits
  Survivors live;
  std::vector<uint16_t> bucket;  // [live] top-p bucket per survivor
  std::vector<uint32_t> boundary;
  std::vector<std::pair<float, int32_t>> heap;
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// "a is more likely than b": higher logit, then lower id. Ordering by logit rather than by
// probability keeps the order exact where two probabilities round to the same float.
bool more_likely(float la, int32_t ia, float lb, int32_t ib) {
  return la != lb ? la > lb : ia < ib;
}

// Keeps the survivors for which keep(j) holds, in order.
template <typename Keep>
void compact(Survivors* s, Keep keep) {
  size_t w = 0;
  for (size_t j = 0; j < s->size(); ++j) {
    if (!keep(j)) continue;
    s->logit[w] = s->logit[j];
    s->id[w] = s->id[j];
    s->prob[w] = s->prob[j];
    ++w;
  }
  s->resize(w);
}

void renormalise(Survivors* s) {
  const double sum = sum_of(s->prob.data(), s->size());
  SPECSERVE_CHECK(sum > 0.0, "sampling: all probabilities filtered out");
  scale_by(s->prob.data(), s->size(), static_cast<float>(1.0 / sum));
}

// The k most likely of z[0..vocab) (0 < k < vocab) into `live`, in no particular order.
void select_top_k(const std::vector<float>& z, int32_t k, Workspace* ws) {
  auto& heap = ws->heap;
  heap.clear();
  const int32_t vocab = static_cast<int32_t>(z.size());
  auto cmp = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return more_likely(a.first, a.second, b.first, b.second);
  };
  if (k <= 4096) {
    // A heap whose front is the least likely kept token: one compare rejects most tokens.
    for (int32_t i = 0; i < vocab; ++i) {
      if (static_cast<int32_t>(heap.size()) < k) {
        heap.emplace_back(z[i], i);
        std::push_heap(heap.begin(), heap.end(), cmp);
      } else if (more_likely(z[i], i, heap.front().first, heap.front().second)) {
        std::pop_heap(heap.begin(), heap.end(), cmp);
        heap.back() = {z[i], i};
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  } else {
    heap.resize(vocab);
    for (int32_t i = 0; i < vocab; ++i) heap[i] = {z[i], i};
    std::nth_element(heap.begin(), heap.begin() + k, heap.end(), cmp);
    heap.resize(k);
  }
  ws->live.resize(k);
  for (int32_t j = 0; j < k; ++j) {
    ws->live.logit[j] = heap[j].first;
    ws->live.id[j] = heap[j].second;
  }
}

// Top-p (Holtzman et al. 2020): keeps the shortest prefix of the survivors in more_likely order
// whose probability reaches top_p. NOTE: instead of sorting, survivors go into buckets of
// 1/16 nat of tempered logit below the maximum; bucket order is more_likely order (the bucket
// index is a monotone function of the logit), so every bucket before the one where the running
// mass crosses top_p is kept whole, and only that one bucket is sorted.
void apply_top_p(float top_p, float max_logit, float inv_t, Workspace* ws) {
  constexpr int kBuckets = 1024;  // 64 nats; everything further down shares the last bucket
  constexpr float kPerNat = 16.0f;
  Survivors& s = ws->live;
  const size_t n = s.size();
  ws->bucket.resize(n);
  double mass[kBuckets] = {};
  const float scale = inv_t * kPerNat;
  for (size_t j = 0; j < n; ++j) {
    const float d = std::min((max_logit - s.logit[j]) * scale, static_cast<float>(kBuckets - 1));
    const uint16_t b = static_cast<uint16_t>(d);
    ws->bucket[j] = b;
    mass[b] += s.prob[j];
  }
  const double target = static_cast<double>(top_p) - kTopPSlack;
  double cum = 0.0;
  int cut = 0;
  while (cut < kBuckets - 1 && cum + mass[cut] < target) cum += mass[cut++];

  auto& boundary = ws->boundary;
  boundary.clear();
  for (size_t j = 0; j < n; ++j)
    if (ws->bucket[j] == cut) boundary.push_back(static_cast<uint32_t>(j));
  std::sort(boundary.begin(), boundary.end(), [&s](uint32_t a, uint32_t b) {
    return more_likely(s.logit[a], s.id[a], s.logit[b], s.id[b]);
  });
  size_t keep = 0;
  while (keep < boundary.size() && cum < target) cum += s.prob[boundary[keep++]];
  // NOTE: the most likely token always survives. With top_p below kTopPSlack the target is
  // <= 0, so the loop above kept nothing of the first bucket and every token was dropped: a
  // request with top_p = 1e-9 aborted the process (renormalise's check) and took the server
  // down with it.
  if (cut == 0 && keep == 0 && !boundary.empty()) keep = 1;
  // The bucket's tail is dropped: mark it past the cut.
  for (size_t t = keep; t < boundary.size(); ++t) ws->bucket[boundary[t]] = kBuckets;
  const uint16_t* bucket = ws->bucket.data();
  compact(&s, [bucket, cut](size_t j) { return bucket[j] <= cut; });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SamplingParams

Status SamplingParams::validate() const {
  // Written as !(ok) so that NaN fails every check.
  if (!(temperature >= 0.0f) || std::isinf(temperature))
    return bad_field("temperature", temperature, "must be finite and >= 0");
  if (!(top_p > 0.0f && top_p <= 1.0f)) return bad_field("top_p", top_p, "must be in (0, 1]");
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return bad_field("min_p", min_p, "must be in [0, 1]");
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty))
    return bad_field("repetition_penalty", repetition_penalty, "must be finite and > 0");
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    return bad_field("presence_penalty", presence_penalty, "must be in [-2, 2]");
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    return bad_field("frequency_penalty", frequency_penalty, "must be in [-2, 2]");
  if (logprobs < 0 || logprobs > kMaxLogprobs)
    return bad_field("logprobs", logprobs, "must be in [0, 20]");
  for (int32_t id : stop_token_ids)
    if (id < 0) return bad_field("stop_token_ids", id, "token ids must be >= 0");
  if (min_tokens < 0) return bad_field("min_tokens", min_tokens, "must be >= 0");
  return Status();
}

bool SamplingParams::is_greedy() const { return temperature < kGreedyTemperature; }

// ---------------------------------------------------------------------------------------------
// Sampler

Expected<Sampler> Sampler::create(const SamplingParams& params) {
  SPECSERVE_RETURN_IF_ERROR(params.validate());
  return Sampler(params);
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  Status st = params_.validate();
  SPECSERVE_CHECK(st.ok(), st.to_string());
  if (params_.has_seed) {
    rng_.seed(params_.seed);
  } else {
    std::random_device rd;
    rng_.seed((static_cast<uint64_t>(rd()) << 32) ^ rd());
  }
}

double log_sum_exp(const float* x, int32_t n) {
  SPECSERVE_CHECK(n > 0, "log_sum_exp of an empty row");
  std::vector<float>& scratch = workspace().z;
  scratch.resize(static_cast<size_t>(n));
  const float mx = max_of(x, static_cast<size_t>(n));
  if (!std::isfinite(mx)) return mx;  // no finite value (or +inf): nothing to normalise
  const double sum = exp_sum(x, static_cast<size_t>(n), mx, 1.0f, scratch.data());
  return static_cast<double>(mx) + std::log(sum);
}

bool samplable_row(const float* x, int32_t n) {
  bool bad = false, any_finite = false;
  for (int32_t i = 0; i < n; ++i) {
    const float v = x[i];
    bad |= (v != v) | (v == kInf);
    any_finite |= v > -kInf;
  }
  return !bad && any_finite;
}

RowPick greedy_pick(const float* x, int32_t n) {
  SPECSERVE_CHECK(n > 0, "greedy_pick of an empty row");
  RowPick p;
  if (!samplable_row(x, n)) return p;
  p.token = Sampler::argmax(x, n);
  p.logprob = static_cast<float>(x[p.token] - log_sum_exp(x, n));
  return p;
}

int32_t Sampler::argmax(const float* logits, int32_t n) {
  SPECSERVE_CHECK(n > 0, "argmax of an empty row");
  const float m = max_of(logits, static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    if (logits[i] == m) return i;  // the first maximum: ties go to the lower index
  return 0;  // every value is NaN
}

void Sampler::apply_penalties(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                              std::span<const int32_t> output, std::vector<float>* out) const {
  SPECSERVE_CHECK(vocab > 0, "vocab must be > 0");
  out->assign(logits, logits + vocab);
  float* z = out->data();
  auto check_id = [vocab](int32_t t) {
    SPECSERVE_CHECK(t >= 0 && t < vocab, "token id " + std::to_string(t) + " outside vocab " +
                                             std::to_string(vocab));
  };

  // Repetition penalty (CTRL; HF RepetitionPenaltyLogitsProcessor; vLLM): once per distinct
  // token of prompt + output, divide a positive logit by the penalty, multiply a negative one,
  // so a penalty > 1 always makes the token less likely.
  if (params_.repetition_penalty != 1.0f) {
    std::vector<int32_t> seen(prompt.begin(), prompt.end());
    seen.insert(seen.end(), output.begin(), output.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float rp = params_.repetition_penalty;
    for (int32_t t : seen) {
      check_id(t);
      z[t] = z[t] > 0.0f ? z[t] / rp : z[t] * rp;
    }
  }

  // Frequency and presence penalties (OpenAI API; vLLM), over generated tokens only:
  // logit -= frequency_penalty * count + presence_penalty * (count > 0).
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    std::vector<int32_t> gen(output.begin(), output.end());
    std::sort(gen.begin(), gen.end());
    for (size_t i = 0; i < gen.size();) {
      size_t j = i;
      while (j < gen.size() && gen[j] == gen[i]) ++j;
      const int32_t t = gen[i];
      check_id(t);
      // Explicit fma: the result must not depend on whether the compiler contracts.
      z[t] -= std::fma(params_.frequency_penalty, static_cast<float>(j - i), params_.presence_penalty);
      i = j;
    }
  }
}

void Sampler::compute_probs(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                            std::span<const int32_t> output, std::vector<float>* probs) const {
  Workspace& ws = workspace();
  apply_penalties(logits, vocab, prompt, output, &ws.z);
  probs->assign(vocab, 0.0f);

  if (params_.is_greedy()) {
    (*probs)[argmax(ws.z.data(), vocab)] = 1.0f;
    return;
  }

  // Top-k: exactly k survive; at the boundary a tie keeps the lower id. Temperature is a
  // positive scale, so ranking the untempered logits ranks the tempered ones.
  Survivors& live = ws.live;
  if (params_.top_k > 0 && params_.top_k < vocab) {
    select_top_k(ws.z, params_.top_k, &ws);
  } else {
    live.resize(vocab);
    std::copy(ws.z.begin(), ws.z.end(), live.logit.begin());
    std::iota(live.id.begin(), live.id.end(), 0);
  }

  // Temperature + softmax over the survivors.
  const float max_logit = max_of(live.logit.data(), live.size());
  SPECSERVE_CHECK(max_logit > -kInf, "sampling: no finite logit");
  const float inv_t = 1.0f / params_.temperature;
  const double sum = exp_sum(live.logit.data(), live.size(), max_logit, inv_t, live.prob.data());
  scale_by(live.prob.data(), live.size(), static_cast<float>(1.0 / sum));

  if (params_.top_p < 1.0f) {
    apply_top_p(params_.top_p, max_logit, inv_t, &ws);
    renormalise(&live);
  }

  // Min-p (Nguyen et al. 2024): the threshold scales with the most likely token, which every
  // earlier filter keeps, so it is the same before or after their renormalisation.
  if (params_.min_p > 0.0f) {
    const float threshold = params_.min_p * max_of(live.prob.data(), live.size());
    const float* prob = live.prob.data();
    compact(&live, [prob, threshold](size_t j) { return prob[j] >= threshold; });
    renormalise(&live);
  }

  for (size_t j = 0; j < live.size(); ++j) (*probs)[live.id[j]] = live.prob[j];
}

std::string Sampler::rng_state() const {
  std::ostringstream os;
  os << rng_;
  return os.str();
}

Status Sampler::set_rng_state(const std::string& state) {
  std::istringstream is(state);
  std::mt19937_64 r;
  is >> r;
  // NOTE: the stream form is exactly 312 words and an index; anything after it is an error too.
  std::string rest;
  if (is.fail() || (is >> rest)) {
    return invalid_argument("sampler rng state: not a std::mt19937_64 state (" + std::to_string(state.size()) + " bytes)");
  }
  rng_ = r;
  return Status();
}

double Sampler::next_uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t draw_inverse_cdf(const float* p, size_t n, double u) {
  const double target = u * sum_of(p, n);
  double prefix = 0.0;
  for (size_t c0 = 0; c0 < n; c0 += kFlush) {
    const size_t end = std::min(n, c0 + kFlush);
    const double chunk = sum_of(p + c0, end - c0);  // this chunk's lanes, as sum_of(p, n) formed them
    if (prefix + chunk > target) {
      double cum = prefix;
      for (size_t i = c0; i < end; ++i) {
        if (p[i] <= 0.0f) continue;
        cum += p[i];
        if (cum > target) return static_cast<int32_t>(i);
      }
    }
    prefix += chunk;
  }
  // Rounding left every running sum at or just under target: the last possible token.
  for (size_t i = n; i-- > 0;) {
    if (p[i] > 0.0f) return static_cast<int32_t>(i);
  }
  return -1;
}

int32_t Sampler::sample_from(const std::vector<float>& probs) {
  const double total = sum_of(probs.data(), probs.size());
  SPECSERVE_CHECK(total > 0.0, "sample_from: probabilities sum to " + fmt_value(total));
  return draw_inverse_cdf(probs.data(), probs.size(), next_uniform());
}

RowPick temperature_pick(const float* x, int32_t n, float temperature, double u) {
  SamplingParams params;
  params.temperature = temperature;
  params.has_seed = true;  // no draw: spares the random_device
  if (params.is_greedy()) return greedy_pick(x, n);
  SPECSERVE_CHECK(n > 0, "temperature_pick of an empty row");
  RowPick p;
  if (!samplable_row(x, n)) return p;
  thread_local std::vector<float> probs;
  Sampler(params).compute_probs(x, n, {}, {}, &probs);
  p.token = draw_inverse_cdf(probs.data(), probs.size(), u);
  p.logprob = static_cast<float>(x[p.token] - log_sum_exp(x, n));
  return p;
}

SampleResult Sampler::sample(const float* logits, int32_t vocab, std::span<const int32_t> prompt,
                             std::span<const int32_t> output) {
  SampleResult result;
  if (params_.is_greedy()) {
    apply_penalties(logits, vocab, prompt, output, &probs_scratch_);
    result.token = argmax(probs_scratch_.data(), vocab);
  } else {
    compute_probs(logits, vocab, prompt, output, &probs_scratch_);
    result.token = sample_from(probs_scratch_);
  }

  // Raw logprobs: log_softmax of the model's logits, before penalties and temperature.
  const double log_z = log_sum_exp(logits, vocab);
  result.logprob = static_cast<float>(logits[result.token] - log_z);

  const int32_t n = std::min(params_.logprobs, vocab);
  if (n > 0) {
    // A size-n heap with the least likely kept token at the front.
    std::vector<std::pair<float, int32_t>> top;
    auto cmp = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
      return more_likely(a.first, a.second, b.first, b.second);
    };
    for (int32_t i = 0; i < vocab; ++i) {
      if (static_cast<int32_t>(top.size()) < n) {
        top.emplace_back(logits[i], i);
        std::push_heap(top.begin(), top.end(), cmp);
      } else if (more_likely(logits[i], i, top.front().first, top.front().second)) {
        std::pop_heap(top.begin(), top.end(), cmp);
        top.back() = {logits[i], i};
        std::push_heap(top.begin(), top.end(), cmp);
      }
    }
    std::sort(top.begin(), top.end(), cmp);
    result.top_logprobs.reserve(n);
    for (const auto& [logit, id] : top)
      result.top_logprobs.push_back({id, static_cast<float>(logit - log_z)});
  }
  return result;
}

}  // namespace specserve
