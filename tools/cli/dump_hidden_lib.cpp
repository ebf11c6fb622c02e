// specserve tools: `specserve dump-hidden` (see dump_hidden_lib.h): the recorder, the prompts,
// generation, the dump and its output directory. The .npy files and half floats are in
// dump_hidden_npy_lib.cpp.
#include "tools/cli/dump_hidden_lib.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include "model/chat_template.h"
#include "model/dequant.h"
#include "model/model_fingerprint.h"
#include "spec/engine.h"
#include "spec/proposer.h"
#include "tools/cli/dump_hidden_dir_lib.h"

namespace specserve::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// One prompt after tokenizing, then its continuation and what was recorded of it.
struct DumpSeq {
  int64_t line = 0;                 ///< 1-based line of the prompt file
  std::vector<int32_t> tokens;      ///< prompt, then the continuation
  int32_t prompt_length = 0;
  std::string finish;
  int32_t generated = 0;            ///< output tokens (a stop token is not part of it), recorded or not
  std::vector<uint16_t> hidden;     ///< [recorded, d] float16: positions 0 .. recorded - 1
  std::vector<int32_t> argmax;      ///< [recorded] the target's argmax next token there
  int32_t recorded() const { return static_cast<int32_t>(argmax.size()); }
};

/// The proposer slot of the Engine used as a recorder: it never drafts (every step stays a
/// plain decode step) but asks for the target's hidden states of every position it computes
/// (Proposer::needs_hidden, needs_every_hidden_row), which the engine hands over — prefill
/// rows, then each decoded token — at the sequence's next step, and those of its last step once
/// it finished. Labels: a continuation row's argmax is the token generated after it (greedy);
/// a prompt row's comes from the target's own output head on the recorded hidden state (the
/// same weight and kernel as the engine's logits), as does the last row of a sequence that
/// stopped on a stop token (its argmax is that token, not in the output) and every
/// check_every-th continuation row's, compared with the generated token.
class HiddenRecorder final : public Proposer {
 public:
  HiddenRecorder(Transformer& target, std::vector<DumpSeq>& seqs, int32_t check_every, DumpHiddenSummary* sum)
      : target_(target), seqs_(seqs), check_every_(check_every), sum_(sum),
        d_(target.config().hidden_size), vocab_(target.config().vocab_size) {}
  std::string name() const override { return "dump-hidden"; }
  bool needs_hidden() const override { return true; }
  bool needs_every_hidden_row() const override { return true; }
  void bind(int64_t seq_id, size_t index) { index_of_[seq_id] = index; }
  double head_seconds() const { return head_seconds_; }

  Status propose(const std::vector<DraftRequest>& reqs, std::vector<DraftTree>* out) override {
    const auto t0 = Clock::now();
    out->assign(reqs.size(), DraftTree{});
    // Validate everything first: a failed call gets the same rows again next step.
    for (const DraftRequest& r : reqs) {
      auto it = index_of_.find(r.seq_id);
      if (it == index_of_.end()) return internal_error("dump-hidden: unknown sequence " + std::to_string(r.seq_id));
      const DumpSeq& s = seqs_[it->second];
      const int64_t n = r.hidden_size == 0 ? 0 : static_cast<int64_t>(r.hidden.size()) / d_;
      if (r.hidden_size != 0 && (r.hidden_size != d_ || n * d_ != static_cast<int64_t>(r.hidden.size())))
        return internal_error("dump-hidden: hidden rows of sequence " + std::to_string(r.seq_id) + " are not [n, " +
                              std::to_string(d_) + "]");
      if (r.hidden_begin != 0 && r.hidden_begin != s.recorded())
        return internal_error("dump-hidden: sequence " + std::to_string(r.seq_id) + " hands position " +
                              std::to_string(r.hidden_begin) + " after " + std::to_string(s.recorded()) + " recorded");
      // (== tokens.size() only in the last hand-over after a stop token: see needs_every_hidden_row.)
      if (r.hidden_begin + n > static_cast<int64_t>(r.tokens.size()))
        return internal_error("dump-hidden: sequence " + std::to_string(r.seq_id) + " hands a position without a token");
    }
    // Rows whose logits are needed: (sequence index, position, row of the request's hidden).
    struct Pending { size_t seq; int32_t pos; const float* h; };
    std::vector<Pending> pending;
    for (const DraftRequest& r : reqs) {
      if (r.hidden_size == 0 || r.hidden.empty()) continue;
      DumpSeq& s = seqs_[index_of_.at(r.seq_id)];
      if (r.hidden_begin == 0) {  // new, or recomputed after preemption: start over
        s.hidden.clear();
        s.argmax.clear();
      }
      const int32_t n = static_cast<int32_t>(r.hidden.size() / static_cast<size_t>(d_));
      for (int32_t j = 0; j < n; ++j) {
        const int32_t pos = r.hidden_begin + j;
        const float* h = r.hidden.data() + static_cast<int64_t>(j) * d_;
        for (int64_t c = 0; c < d_; ++c) s.hidden.push_back(float_to_half(h[c]));
        // A continuation row's label is the next generated token, when there is one (not after
        // the last token of a sequence that stopped on a stop token: the head gives it).
        const bool labelled = pos >= s.prompt_length - 1 && pos + 1 < static_cast<int32_t>(r.tokens.size());
        s.argmax.push_back(labelled ? r.tokens[static_cast<size_t>(pos) + 1] : -1);
        if (!labelled || (pos - (s.prompt_length - 1)) % check_every_ == 0)
          pending.push_back({index_of_.at(r.seq_id), pos, h});
      }
    }
    // The output head over the pending rows, in chunks (memory: chunk * vocab * 4 bytes).
    Backend& B = target_.backend();
    constexpr int64_t kChunk = 128;
    for (size_t c0 = 0; c0 < pending.size(); c0 += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, static_cast<int64_t>(pending.size() - c0));
      if (!x_ || x_->bytes() < kChunk * d_ * 4) x_ = B.alloc(kChunk * d_ * 4);
      if (!y_ || y_->bytes() < kChunk * vocab_ * 4) y_ = B.alloc(kChunk * vocab_ * 4);
      staging_.resize(static_cast<size_t>(m * d_));
      for (int64_t j = 0; j < m; ++j)
        std::copy(pending[c0 + j].h, pending[c0 + j].h + d_, staging_.begin() + j * d_);
      B.upload(*x_, staging_.data(), m * d_ * 4);
      B.matmul(target_.output_head(), x_->f32(), m, y_->f32());
      B.synchronize();
      logits_.resize(static_cast<size_t>(m * vocab_));
      B.download(logits_.data(), *y_, m * vocab_ * 4);
      for (int64_t j = 0; j < m; ++j) {
        const Pending& p = pending[c0 + j];
        const float* lg = logits_.data() + j * vocab_;
        const int32_t best = static_cast<int32_t>(std::max_element(lg, lg + vocab_) - lg);
        DumpSeq& s = seqs_[p.seq];
        int32_t& slot = s.argmax[static_cast<size_t>(p.pos)];
        if (slot < 0) {
          slot = best;  // a prompt row, or the last row of a sequence that stopped on a stop token
        } else {
          ++sum_->num_argmax_checked;
          if (best != slot) ++sum_->num_argmax_mismatches;
        }
      }
    }
    head_seconds_ += seconds_since(t0);
    return Status();
  }

 private:
  Transformer& target_;
  std::vector<DumpSeq>& seqs_;
  const int32_t check_every_;
  DumpHiddenSummary* sum_;
  const int64_t d_, vocab_;
  std::map<int64_t, size_t> index_of_;
  std::unique_ptr<Buffer> x_, y_;
  std::vector<float> staging_, logits_;
  double head_seconds_ = 0;
};

/// True when `t` has no character but white space.
bool blank(const std::string& t) { return t.find_first_not_of(" \t\r\n") == std::string::npos; }

/// Reads and tokenizes the prompt file (format: DumpHiddenOptions::prompts_path). Skipped
/// prompts are counted in *sum; warnings go to sum->warnings and `progress`.
Expected<std::vector<DumpSeq>> read_prompts(LoadedModel& lm, const DumpHiddenOptions& o, DumpHiddenSummary* sum,
                                            const DumpProgress& progress) {
  std::ifstream in(o.prompts_path);
  if (!in) return not_found("dump-hidden: --prompts " + o.prompts_path + ": cannot open the file");
  std::vector<DumpSeq> out;
  std::string line;
  int64_t line_no = 0, num_unknown = 0;
  std::string first_unknown;  // "LINE: KEY" of the first unknown key
  auto note_unknown = [&](const std::string& where, const std::string& key) {
    if (num_unknown++ == 0) first_unknown = where + ": \"" + key + "\"";
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (blank(line)) continue;
    if (o.max_prompts > 0 && static_cast<int64_t>(out.size()) >= o.max_prompts) break;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = o.prompts_path + ":" + std::to_string(line_no);
    if (!j.is_object()) return invalid_argument(where + ": not a JSON object");
    for (const auto& [key, value] : j.items()) {
      if (key != "messages" && key != "prompt" && key != "task") note_unknown(where, key);
    }
    if (j.contains("messages") && j.contains("prompt"))
      return invalid_argument(where + ": has both \"messages\" and \"prompt\"; give one");
    DumpSeq s;
    s.line = line_no;
    bool empty = false;
    if (j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty())
        return invalid_argument(where + ": \"messages\" must be a non-empty array");
      std::vector<ChatMessage> msgs;
      empty = true;
      for (const auto& m : j["messages"]) {
        if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
            !m["content"].is_string())
          return invalid_argument(where + ": each message needs string \"role\" and \"content\"");
        for (const auto& [key, value] : m.items()) {
          if (key != "role" && key != "content") note_unknown(where, "messages[]." + key);
        }
        std::string role = m["role"].get<std::string>();
        if (role == "developer") role = "system";  // OpenAI's newer name, as the HTTP API accepts it
        if (role != "system" && role != "user" && role != "assistant")
          return invalid_argument(where + ": role \"" + m["role"].get<std::string>() +
                                  "\": must be system, developer, user or assistant");
        msgs.push_back({role, m["content"].get<std::string>()});
        if (!blank(msgs.back().content)) empty = false;
      }
      if (!empty) {
        auto text = apply_chat_template(*lm.file, msgs, /*add_generation_prompt=*/true);
        if (!text.ok()) return Status(text.status().code(), where + ": " + text.status().message());
        s.tokens = lm.tokenizer->encode(*text, /*add_special=*/true, /*parse_special=*/true);
      }
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      empty = blank(j["prompt"].get<std::string>());
      // Special-token text is its token, as generate --prompt and the HTTP API read a prompt
      // (NOTE: it was read as text, so the dump trained on other ids than serving sees).
      if (!empty) s.tokens = lm.tokenizer->encode(j["prompt"].get<std::string>(), /*add_special=*/true, /*parse_special=*/true);
    } else {
      return invalid_argument(where + ": needs \"messages\" (chat) or \"prompt\" (string)");
    }
    // NOTE: an empty prompt is most likely a mistake upstream (a lost field), but one bad row of
    // thousands should not cost the run: it is skipped and reported (count, first line).
    if (empty || s.tokens.empty()) {
      if (sum->num_prompts_empty++ == 0) sum->first_empty_prompt_line = line_no;
      continue;
    }
    // NOTE: a cut prompt would lose its chat-template head (training on text the serving path
    // never sees), so long prompts are skipped and counted instead.
    if (static_cast<int32_t>(s.tokens.size()) > o.max_prompt_tokens) {
      ++sum->num_prompts_too_long;
      continue;
    }
    s.prompt_length = static_cast<int32_t>(s.tokens.size());
    out.push_back(std::move(s));
  }
  sum->num_prompts_skipped = sum->num_prompts_too_long + sum->num_prompts_empty;
  auto warn = [&](const std::string& w) {
    sum->warnings.push_back(w);
    if (progress) progress("warning: " + w, true);
  };
  // NOTE: extra keys are allowed (make_prompts.py adds "task"; other tools add ids or sources),
  // so an unknown key is a warning, once, not an error: a typo ("promt") still fails, as the
  // line then has neither "messages" nor "prompt".
  if (num_unknown > 0)
    warn("ignored " + std::to_string(num_unknown) + " unknown key(s) in the prompt file, the first at " + first_unknown);
  if (sum->num_prompts_empty > 0)
    warn("skipped " + std::to_string(sum->num_prompts_empty) + " empty prompt(s), the first at " + o.prompts_path + ":" +
         std::to_string(sum->first_empty_prompt_line));
  return out;
}

/// Greedy continuations of every sequence through the Engine (continuous batching).
Status generate_all(LoadedModel& lm, const DumpHiddenOptions& o, std::vector<DumpSeq>& seqs, HiddenRecorder& recorder,
                    const DumpProgress& progress) {
  EngineOptions eo;
  // One draft slot per decode row makes the engine call the recorder every step; it never
  // drafts. Prefix caching would skip computing (and so recording) a shared prompt head.
  eo.num_speculative_tokens = 1;
  eo.adaptive_k = false;
  eo.enable_prefix_caching = false;
  int32_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.prompt_length);
  eo.max_model_len = longest + o.max_new_tokens + 1;
  // NOTE: past the model's context the engine's error named its own max_model_len, a number
  // the user never gave: name the flags and what fits.
  const int64_t ctx = lm.model->config().context_length;
  if (ctx > 0 && eo.max_model_len > ctx) {
    return invalid_argument("dump-hidden: the longest prompt kept (" + std::to_string(longest) + " token(s), --max-prompt-tokens " +
                            std::to_string(o.max_prompt_tokens) + ") + --max-new-tokens " + std::to_string(o.max_new_tokens) +
                            " + 1 = " + std::to_string(eo.max_model_len) + " positions exceed the model's context length " +
                            std::to_string(ctx) + ": lower --max-new-tokens to at most " +
                            std::to_string(std::max<int64_t>(0, ctx - longest - 1)) + " or --max-prompt-tokens");
  }
  // At most as many sequences at once as there are prompts (2 prompts with --max-num-seqs 64
  // had a KV cache for 64).
  const int64_t at_once = std::min<int64_t>(o.max_num_seqs, static_cast<int64_t>(seqs.size()));
  eo.max_num_seqs = static_cast<int32_t>(at_once);
  eo.max_num_batched_tokens = std::max(2048, eo.max_model_len);
  eo.num_kv_blocks = at_once * ((eo.max_model_len + eo.block_size - 1) / eo.block_size) + 16;
  auto engine = Engine::create(*lm.model, lm.tokenizer.get(), &recorder, eo);
  if (!engine.ok()) {
    // The KV cache holds `at_once` sequences of the longest prompt + --max-new-tokens: say which
    // flags size it (the engine's message names its own block count only).
    if (engine.status().code() == StatusCode::kResourceExhausted) {
      return Status(engine.status().code(),
                    "dump-hidden: a KV cache for " + std::to_string(at_once) + " sequence(s) of " + std::to_string(eo.max_model_len) +
                        " positions (--max-num-seqs " + std::to_string(o.max_num_seqs) + ", the longest prompt kept + --max-new-tokens " +
                        std::to_string(o.max_new_tokens) + " + 1) cannot be allocated: lower --max-num-seqs below " + std::to_string(at_once) + " or --max-new-tokens (" +
                        engine.status().message() + ")");
    }
    return engine.status();
  }
  std::map<int64_t, size_t> by_id;
  for (size_t i = 0; i < seqs.size(); ++i) {
    GenerateParams p;
    p.prompt = seqs[i].tokens;
    p.max_tokens = o.max_new_tokens;
    p.sampling.temperature = 0.0f;
    auto id = (*engine)->add_request(std::move(p));
    if (!id.ok()) return Status(id.status().code(), "prompt line " + std::to_string(seqs[i].line) + ": " + id.status().message());
    by_id[*id] = i;
    recorder.bind(*id, i);
  }
  const auto t0 = Clock::now();
  auto last = t0;
  size_t done = 0;
  int64_t generated = 0;
  std::vector<SeqEvent> events;
  while ((*engine)->has_work()) {
    if (o.stop && o.stop->load()) return cancelled("dump-hidden: interrupted while generating");
    events.clear();
    Status st = (*engine)->step(&events);
    if (!st.ok()) return st;
    for (const auto& ev : events) {
      DumpSeq& s = seqs[by_id.at(ev.seq_id)];
      s.tokens.insert(s.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      generated += static_cast<int64_t>(ev.tokens.size());
      if (ev.finish != FinishReason::kNone) {
        if (ev.finish == FinishReason::kError) return internal_error("prompt line " + std::to_string(s.line) + ": " + ev.error);
        s.finish = finish_reason_name(ev.finish);
        ++done;
      }
    }
    if (progress && seconds_since(last) > 0.5) {
      last = Clock::now();
      char buf[200];
      const double t = seconds_since(t0);
      std::snprintf(buf, sizeof buf, "generate: %zu/%zu prompts done, %d running, %" PRId64 " tokens, %.0f tok/s, %.0f s",
                    done, seqs.size(), (*engine)->num_running(), generated, t > 0 ? generated / t : 0.0, t);
      progress(buf, false);
    }
  }
  if (progress) {
    char buf[200];
    const double t = seconds_since(t0);
    std::snprintf(buf, sizeof buf, "generate: %zu/%zu prompts done, %" PRId64 " tokens in %.1f s (%.0f tok/s)", done,
                  seqs.size(), generated, t, t > 0 ? generated / t : 0.0);
    progress(buf, true);
  }
  return Status();
}

}  // namespace

std::string fingerprint_hex(const GgufFile& file) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, model_fingerprint(file));
  return buf;
}

namespace fs = std::filesystem;

Status check_dump_options(const DumpHiddenOptions& o) {
  if (o.max_new_tokens < 1 || o.max_num_seqs < 1 || o.max_prompt_tokens < 1 || o.check_every < 1 || o.max_prompts < 0)
    return invalid_argument("dump-hidden: max_new_tokens must be >= 1 (got " + std::to_string(o.max_new_tokens) +
                            "); max_num_seqs, max_prompt_tokens, check_every >= 1; max_prompts >= 0");
  if (o.prompts_path.empty()) return invalid_argument("dump-hidden: --prompts is required");
  if (o.out_dir.empty()) return invalid_argument("dump-hidden: --out is required");
  std::error_code ec;
  if (fs::is_directory(o.prompts_path, ec))
    return invalid_argument("dump-hidden: --prompts " + o.prompts_path + " is a directory; expected a JSONL file");
  if (!fs::exists(o.prompts_path, ec)) return not_found("dump-hidden: --prompts " + o.prompts_path + ": no such file");
  if (fs::exists(o.out_dir, ec) && !fs::is_directory(o.out_dir, ec))
    return invalid_argument("dump-hidden: --out " + o.out_dir + " exists and is not a directory");
  // A symbolic link to nothing, --out or an ancestor: not created by this dump, so never removed.
  // NOTE: a failed dump took the link for what it had created and removed it.
  for (fs::path p = fs::path(o.out_dir); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    if (fs::is_symlink(fs::symlink_status(p, ec)) && !fs::exists(p, ec)) {
      return invalid_argument("dump-hidden: --out " + o.out_dir + ": " + p.string() + " is a symbolic link to a missing directory (" +
                              fs::read_symlink(p, ec).string() + "): create it, or give the directory itself");
    }
    if (fs::exists(p, ec)) break;
  }
  // An ancestor that is a file: create_directories would fail later with a less clear message.
  for (fs::path p = fs::path(o.out_dir).parent_path(); !p.empty() && p != p.parent_path(); p = p.parent_path()) {
    if (fs::exists(p, ec)) {
      if (!fs::is_directory(p, ec))
        return invalid_argument("dump-hidden: --out " + o.out_dir + ": " + p.string() + " is not a directory");
      break;
    }
  }
  return Status();
}

namespace {

Expected<DumpHiddenSummary> dump_into(LoadedModel& lm, const DumpHiddenOptions& o, const std::string& dir,
                                      const DumpProgress& progress);

}  // namespace

Expected<DumpHiddenSummary> dump_hidden(LoadedModel& lm, const DumpHiddenOptions& o, const DumpProgress& progress) {
  SPECSERVE_RETURN_IF_ERROR(check_dump_options(o));
  std::error_code ec;
  fs::path out = fs::absolute(fs::path(o.out_dir), ec).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();  // "a/b/" -> "a/b"
  // The topmost ancestor of --out (or itself) that does not exist yet: all that this dump
  // creates, and so all that a failure removes.
  fs::path created;
  for (fs::path p = out; !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path()) {
    created = p;
    if (p == p.parent_path()) break;
  }
  auto cleanup = [&](const fs::path& tmp) {
    std::error_code ignored;
    if (!tmp.empty()) fs::remove_all(tmp, ignored);
    if (!created.empty()) fs::remove_all(created, ignored);
  };
  fs::create_directories(out, ec);
  if (ec) {
    cleanup({});
    return invalid_argument("dump-hidden: --out " + o.out_dir + ": cannot create the directory: " + ec.message());
  }
  // NOTE: inside the output directory, so that the final renames stay on one file system; the
  // pid keeps two dumps into the same directory apart.
  const std::string partial = dump_dir::partial_prefix();
  const fs::path tmp = out / (partial + std::to_string(::getpid()));
  dump_dir::remove_dead_partials(out, partial);
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  if (ec) {
    cleanup({});
    return invalid_argument("dump-hidden: --out " + o.out_dir + ": cannot write into the directory: " + ec.message());
  }
  auto r = dump_into(lm, o, tmp.string(), progress);
  if (r.ok() && o.stop && o.stop->load()) r = cancelled("dump-hidden: interrupted while writing");
  if (r.ok()) {
    Status st = dump_dir::publish(tmp, out, o.write_weights);
    if (!st.ok()) r = st;
  }
  // NOTE: a failed dump leaves nothing of itself: the temporary directory goes, and so do the
  // output directory and its parents when it created them. A previous dump there stays whole
  // unless the failure came while moving files into place (then it has no index.json).
  if (!r.ok()) {
    cleanup(tmp);
  } else {
    fs::remove_all(tmp, ec);
  }
  return r;
}

namespace {

Expected<DumpHiddenSummary> dump_into(LoadedModel& lm, const DumpHiddenOptions& o, const std::string& out_dir,
                                      const DumpProgress& progress) {
  DumpHiddenSummary sum;
  sum.target_fingerprint = fingerprint_hex(*lm.file);
  auto seqs_or = read_prompts(lm, o, &sum, progress);
  if (!seqs_or.ok()) return seqs_or.status();
  std::vector<DumpSeq> seqs = std::move(*seqs_or);
  if (seqs.empty())
    return invalid_argument("dump-hidden: --prompts " + o.prompts_path + ": no usable prompt (" +
                            std::to_string(sum.num_prompts_too_long) + " over --max-prompt-tokens " +
                            std::to_string(o.max_prompt_tokens) + ", " + std::to_string(sum.num_prompts_empty) + " empty)");

  HiddenRecorder recorder(*lm.model, seqs, o.check_every, &sum);
  const auto t0 = Clock::now();
  if (Status st = generate_all(lm, o, seqs, recorder, progress); !st.ok()) return st;
  sum.generate_seconds = seconds_since(t0);
  sum.head_seconds = recorder.head_seconds();

  // Every position the target computed is recorded: all tokens but the last generated one of a
  // sequence that ended on its length (its hidden state was never computed); after a stop
  // token every token, the last one labelled with the target's argmax there, which must be an
  // end-of-generation token (checked). A sequence with no row (only if the engine could not
  // hand them over) is left out.
  Transformer& model = *lm.model;
  const ModelConfig& cfg = model.config();
  const int64_t d = cfg.hidden_size, V = cfg.vocab_size;
  std::vector<DumpSeq> kept;
  for (DumpSeq& s : seqs) {
    s.generated = static_cast<int32_t>(s.tokens.size()) - s.prompt_length;
    if (s.recorded() == 0) {
      ++sum.num_sequences_unrecorded;
      continue;
    }
    SPECSERVE_CHECK(s.recorded() <= static_cast<int32_t>(s.tokens.size()), "dump-hidden: more rows than tokens");
    if (s.recorded() == static_cast<int32_t>(s.tokens.size()) && s.finish == "stop") {
      // Stopped on a stop token: the last row's argmax (from the head) is that token.
      ++sum.num_argmax_checked;
      if (!lm.tokenizer->eog_ids().count(s.argmax.back())) ++sum.num_argmax_mismatches;
    }
    s.tokens.resize(static_cast<size_t>(s.recorded()));
    kept.push_back(std::move(s));
  }
  seqs = std::move(kept);
  if (seqs.empty()) return internal_error("dump-hidden: the engine handed over no hidden state of any sequence");
  int64_t total = 0;
  for (const auto& s : seqs) total += s.recorded();
  std::vector<uint16_t> hidden;
  std::vector<int32_t> tokens, argmax;
  hidden.reserve(static_cast<size_t>(total * d));
  tokens.reserve(static_cast<size_t>(total));
  argmax.reserve(static_cast<size_t>(total));
  std::vector<int64_t> offsets(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    offsets[i] = static_cast<int64_t>(tokens.size());
    tokens.insert(tokens.end(), seqs[i].tokens.begin(), seqs[i].tokens.end());
    argmax.insert(argmax.end(), seqs[i].argmax.begin(), seqs[i].argmax.end());
    hidden.insert(hidden.end(), seqs[i].hidden.begin(), seqs[i].hidden.end());
    std::vector<uint16_t>().swap(seqs[i].hidden);
  }
  sum.num_sequences = static_cast<int64_t>(seqs.size());
  sum.num_positions = total;
  for (const auto& s : seqs) sum.num_generated += std::max(0, s.recorded() - s.prompt_length);

  const std::string dir = out_dir + "/";
  if (Status st = write_npy(dir + "hidden.npy", "<f2", {total, d}, hidden.data(), hidden.size() * 2); !st.ok()) return st;
  if (Status st = write_npy(dir + "tokens.npy", "<i4", {total}, tokens.data(), tokens.size() * 4); !st.ok()) return st;
  if (Status st = write_npy(dir + "argmax.npy", "<i4", {total}, argmax.data(), argmax.size() * 4); !st.ok()) return st;
  if (o.write_weights) {
    const GgufTensorInfo* emb = lm.file->find_tensor("token_embd.weight");
    const GgufTensorInfo* head = cfg.tied_output ? emb : lm.file->find_tensor("output.weight");
    if (!emb || !head) return corrupt_data(lm.file->path() + ": token_embd.weight / output.weight missing");
    for (auto [name, t] : {std::pair{"embed.npy", emb}, std::pair{"head.npy", head}}) {
      auto w = dequantize_tensor(*t);
      if (!w.ok()) return w.status();
      if (Status st = write_npy(dir + name, "<f4", {V, d}, w->data(), w->size() * 4); !st.ok()) return st;
    }
  }
  nlohmann::json idx;
  idx["format"] = "specserve-hidden-dump/1";
  idx["model"] = lm.file->path();
  idx["target_fingerprint"] = sum.target_fingerprint;
  idx["hidden_size"] = d;
  idx["vocab_size"] = V;
  idx["num_positions"] = total;
  idx["max_new_tokens"] = o.max_new_tokens;
  idx["num_generated"] = sum.num_generated;
  idx["num_prompts_skipped"] = sum.num_prompts_skipped;
  idx["num_prompts_too_long"] = sum.num_prompts_too_long;
  idx["num_prompts_empty"] = sum.num_prompts_empty;
  idx["first_empty_prompt_line"] = sum.first_empty_prompt_line;
  idx["warnings"] = sum.warnings;
  idx["num_argmax_mismatches"] = sum.num_argmax_mismatches;
  idx["num_argmax_checked"] = sum.num_argmax_checked;
  idx["check_every"] = o.check_every;
  idx["tied_output"] = cfg.tied_output;
  idx["weights"] = o.write_weights;  // head.npy / embed.npy written (not with --no-weights)
  idx["eog_ids"] = std::vector<int32_t>(lm.tokenizer->eog_ids().begin(), lm.tokenizer->eog_ids().end());
  idx["target_config"] = {{"arch", cfg.arch},
                          {"hidden_size", cfg.hidden_size},
                          {"num_layers", cfg.num_layers},
                          {"num_heads", cfg.num_heads},
                          {"num_kv_heads", cfg.num_kv_heads},
                          {"head_dim", cfg.head_dim},
                          {"rope_dim", cfg.rope_dim},
                          {"ffn_size", cfg.ffn_size},
                          {"rope_theta", cfg.rope_theta},
                          {"rope_neox", cfg.rope_style == RopeStyle::kNeox},
                          {"norm_eps", cfg.norm_eps}};
  nlohmann::json js = nlohmann::json::array();
  for (size_t i = 0; i < seqs.size(); ++i)
    js.push_back({{"offset", offsets[i]},
                  {"length", seqs[i].tokens.size()},
                  {"prompt_length", seqs[i].prompt_length},
                  {"generated", seqs[i].generated},
                  {"line", seqs[i].line},
                  {"finish", seqs[i].finish}});
  idx["sequences"] = js;
  idx["generate_seconds"] = sum.generate_seconds;
  idx["head_seconds"] = sum.head_seconds;
  idx["num_sequences_unrecorded"] = sum.num_sequences_unrecorded;
  std::ofstream f(dir + "index.json", std::ios::trunc);
  f << idx.dump(1) << "\n";
  if (!f) return internal_error("cannot write " + dir + "index.json");
  return sum;
}

}  // namespace

}  // namespace specserve::cli
