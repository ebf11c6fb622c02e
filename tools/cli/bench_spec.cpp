// `specserve bench-spec`: speculative decoding on Spec-Bench (Xia et al., ACL 2024 Findings),
// reported in the shape of its leaderboard: per task and overall, the speedup over plain
// decoding measured in the same run, tokens/s, acceptance rate and mean accepted tokens per
// step; plus acceptance by draft position. Greedy outputs are checked against the baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/backend_factory.h"
#include "actors/gpu_memory_plan.h"
#include "core/logging.h"
#include "cpu/attention.h"
#include "cpu/cpu_backend.h"
#include "cpu/matmul.h"
#include "model/chat_template.h"
#include "spec/engine.h"
#include "spec/lookup_first_proposer.h"
#include "tools/cli/common.h"
#include "tools/cli/output_file_lib.h"
#include "tools/cli/registry.h"
#include "tools/cli/spec_options.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct BenchArgs {
  std::string model;
  std::string questions = std::string(SPECSERVE_SOURCE_DIR) + "/../shared/data/spec_bench/question.jsonl";
  int per_task = 3;
  int max_tokens = 64;
  int threads = 0;
  std::string device = "cpu";
  std::string dtype = "auto";
  double gpu_memory_utilization = 0.9;
  std::vector<int> batch_sizes = {1};
  std::vector<std::string> specs = {R"({"method":"ngram","num_speculative_tokens":4})"};
  std::string output;
};

// Spec-Bench's six tasks; MT-bench's eight categories form "mt_bench". Any other category is not
// Spec-Bench's: "" (the caller refuses it, naming the line; it used to count as mt_bench).
std::string task_of(const std::string& category) {
  static const std::set<std::string> kOwn = {"translation", "summarization", "qa", "math_reasoning", "rag"};
  static const std::set<std::string> kMtBench = {"writing", "roleplay", "reasoning", "math",
                                                 "coding", "extraction", "stem", "humanities", "mt_bench"};
  if (kOwn.count(category)) return category;
  return kMtBench.count(category) ? "mt_bench" : "";
}

struct Question { int id; std::string task; std::vector<int32_t> prompt; };

struct TaskResult {
  int64_t tokens = 0;
  double seconds = 0;          ///< wall time of the whole generation, prefill included
  int64_t decode_tokens = 0;   ///< tokens after each sequence's first
  double decode_seconds = 0;   ///< wall time after every sequence of the group had its first token
  /// Target steps each sequence took after its first token, summed over sequences (a step with
  /// or without a draft). decode_tokens / decode_steps: tokens per step, Spec-Bench's mean
  /// accepted tokens counted over every step (SpecStats' mean counts drafted steps only).
  int64_t decode_steps = 0;
  SpecStats spec;
  int mismatches = 0;
  /// The decode phase's engine steps (one per Engine::step, whatever the batch) and the time they
  /// spent in Proposer::propose and in target forward passes, the verification pass included
  /// (EngineStats::draft_seconds, forward_seconds), over the same window as decode_seconds; the
  /// rest of it is the engine's own work (scheduling, KV blocks, the acceptance check, sampling).
  int64_t engine_steps = 0;
  double draft_seconds = 0, forward_seconds = 0;
};

struct RunResult {
  std::string name;
  int batch = 1;
  int32_t max_depth = 0;  ///< the deepest draft (Proposer::max_draft_depth): a tree's depth, not k
  /// Prompt lookup first (spec/lookup_first_proposer.h) only: drafting steps the lookup drafted
  /// and steps handed to the method; both -1 for other proposers.
  int64_t lookup_drafts = -1, inner_drafts = -1;
  /// The engine's drafts by who drafted them (EngineStats::by_source).
  DraftSourceCounts by_source{};
  std::string model_name;  ///< what drafted as DraftSource::kModel (the method, or the inner one)
  std::map<std::string, TaskResult> tasks;
  std::map<int, std::vector<int32_t>> outputs;
  TaskResult total;
};

Expected<RunResult> run_config(LoadedModel& lm, Backend& backend, const DeviceMemoryBudget& memory,
                               const std::vector<Question>& qs, const SpecArgs& sa, int batch, int max_tokens,
                               const std::string& name) {
  EngineOptions eo;
  eo.max_num_seqs = batch;
  eo.max_model_len = 4096;
  // GPU: the KV pools (target and draft) from --gpu-memory-utilization, less the weights.
  EngineKvPlanner kv_plan(memory, engine_memory_inputs(lm.model->config(), eo), &eo);
  auto proposer = make_proposer(sa, lm, backend, &eo, kv_plan.draft_planner());
  if (!proposer.ok()) return proposer.status();
  SPECSERVE_RETURN_IF_ERROR(kv_plan.finish());
  auto engine = Engine::create(*lm.model, lm.tokenizer.get(), proposer->get(), eo);
  if (!engine.ok()) return engine.status();
  RunResult rr;
  rr.name = name;
  rr.batch = batch;
  rr.max_depth = *proposer ? (*proposer)->max_draft_depth(eo.num_speculative_tokens) : 0;
  // Questions go in groups of `batch` from the same task, so per-task timing stays clean.
  std::map<std::string, std::vector<const Question*>> by_task;
  for (const auto& q : qs) by_task[q.task].push_back(&q);
  size_t done = 0;
  for (auto& [task, list] : by_task) {
    for (size_t i = 0; i < list.size(); i += static_cast<size_t>(batch)) {
      std::map<int64_t, const Question*> ids;
      for (size_t j = i; j < std::min(list.size(), i + static_cast<size_t>(batch)); ++j) {
        GenerateParams p;
        p.prompt = list[j]->prompt;
        p.max_tokens = max_tokens;
        p.sampling.temperature = 0;
        p.sampling.ignore_eos = true;  // equal lengths across methods: tokens/s compares like with like
        auto id = (*engine)->add_request(p);
        if (!id.ok()) return id.status();
        ids[*id] = list[j];
      }
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<SeqEvent> evs;
      size_t started = 0;
      double t_first_all = -1;
      // Engine counters where the decode window starts: when every sequence has its first token,
      // or (if that never happens, e.g. a refused request) the group's start, as decode_seconds.
      EngineStats at_first_all = (*engine)->stats();
      while ((*engine)->has_work()) {
        evs.clear();
        SPECSERVE_RETURN_IF_ERROR((*engine)->step(&evs));
        for (auto& e : evs) {
          auto& out = rr.outputs[ids[e.seq_id]->id];
          if (out.empty() && !e.tokens.empty()) ++started;
          if (!out.empty() && !e.tokens.empty()) ++rr.tasks[task].decode_steps;
          out.insert(out.end(), e.tokens.begin(), e.tokens.end());
        }
        if (t_first_all < 0 && started == ids.size()) {
          t_first_all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          at_first_all = (*engine)->stats();
        }
      }
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      TaskResult& tr = rr.tasks[task];
      const EngineStats& end = (*engine)->stats();
      tr.engine_steps += end.num_steps - at_first_all.num_steps;
      tr.draft_seconds += end.draft_seconds - at_first_all.draft_seconds;
      tr.forward_seconds += end.forward_seconds - at_first_all.forward_seconds;
      tr.seconds += dt;
      tr.decode_seconds += dt - std::max(0.0, t_first_all);
      for (auto& [id, q] : ids) {
        tr.tokens += static_cast<int64_t>(rr.outputs[q->id].size());
        tr.decode_tokens += std::max<int64_t>(0, static_cast<int64_t>(rr.outputs[q->id].size()) - 1);
        if (auto s = (*engine)->take_finished_stats(id)) tr.spec.add(*s);
      }
      done += ids.size();
      std::fprintf(stderr, "\r[bench-spec] %-40s batch %d: %zu/%zu questions", name.c_str(), batch, done, qs.size());
    }
  }
  std::fprintf(stderr, "\n");
  for (auto& [t, tr] : rr.tasks) {
    rr.total.tokens += tr.tokens;
    rr.total.seconds += tr.seconds;
    rr.total.decode_tokens += tr.decode_tokens;
    rr.total.decode_seconds += tr.decode_seconds;
    rr.total.decode_steps += tr.decode_steps;
    rr.total.spec.add(tr.spec);
    rr.total.engine_steps += tr.engine_steps;
    rr.total.draft_seconds += tr.draft_seconds;
    rr.total.forward_seconds += tr.forward_seconds;
  }
  rr.by_source = (*engine)->stats().by_source;
  rr.model_name = *proposer ? (*proposer)->name() : "";
  if (const auto* lookup = dynamic_cast<const LookupFirstProposer*>(proposer->get())) {
    rr.lookup_drafts = lookup->num_lookup_drafts();
    rr.inner_drafts = lookup->num_inner_drafts();
    rr.model_name = lookup->inner().name();
  }
  return rr;
}

// Prints a --speculative-config error (one problem a line) as bench-spec's, each line after
// "--spec VALUE: ", which already names the flag: "--speculative-config: method ..." ->
// "method ...", "--speculative-config \"model\" PATH: ..." -> "\"model\" PATH: ...", and
// "... PATH in --speculative-config" -> "... PATH".
void print_spec_error(const std::string& spec, const std::string& message) {
  const std::string mine = "specserve bench-spec: ";
  for (size_t b = 0, e; b <= message.size(); b = e + 1) {
    e = message.find('\n', b);
    if (e == std::string::npos) e = message.size();
    std::string line = message.substr(b, e - b);
    if (line.rfind(mine, 0) == 0) line.erase(0, mine.size());
    for (const char* flag : {"--speculative-config: ", "--speculative-config "}) {
      if (line.rfind(flag, 0) == 0) {
        line.erase(0, std::strlen(flag));
        break;
      }
    }
    if (const size_t at = line.find(" in --speculative-config"); at != std::string::npos) line.erase(at, 24);
    std::fprintf(stderr, "%s--spec %s: %s\n", mine.c_str(), spec.c_str(), line.c_str());
  }
}

int run_bench(const BenchArgs& a) {
  if (!a.output.empty()) {
    if (Status st = check_output_file("--output", a.output); !st.ok()) {
      std::fprintf(stderr, "specserve bench-spec: %s\n", st.message().c_str());
      return 2;
    }
  }
  // Every --spec is parsed and its files checked (opened, a head of its method, trained on this
  // target, its tree parsed) before the model loads: a malformed one used to fail only after
  // the whole baseline had run, and a missing or foreign head file after the methods before it
  // (their results lost).
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  for (const auto& spec : a.specs) {
    SpecArgs sa;
    sa.speculative_config = spec;
    if (Status st = check_spec_args_before_load(sa, path, "specserve bench-spec"); !st.ok()) {
      print_spec_error(spec, st.message());
      return exit_status_for(st);
    }
  }
  if (Status st = apply_dtype_option(a.dtype, a.device); !st.ok()) {
    std::fprintf(stderr, "specserve bench-spec: %s\n", st.message().c_str());
    return exit_status_for(st);
  }
  DeviceMemoryBudget memory(a.device, a.gpu_memory_utilization, "--gpu-memory-utilization");
  auto made = make_backend_for_device("--device", a.device, a.threads);
  if (!made.ok()) {
    std::fprintf(stderr, "specserve bench-spec: %s\n", made.status().to_string().c_str());
    return 2;
  }
  std::unique_ptr<Backend> backend = std::move(*made);
  auto loaded = load_model(path, *backend);
  if (!loaded.ok()) {
    std::fprintf(stderr, "specserve bench-spec: %s\n", loaded.status().to_string().c_str());
    return exit_status_for(loaded.status());  // a missing or corrupt --model: 2, as generate
  }
  memory.target_loaded(*backend);
  std::ifstream in(a.questions);
  if (!in) {
    std::fprintf(stderr, "specserve bench-spec: --questions: cannot read %s\n", a.questions.c_str());
    return 1;
  }
  std::vector<Question> qs;
  std::map<std::string, int> taken;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "specserve bench-spec: %s:%d: malformed JSON: %s\n", a.questions.c_str(), lineno, e.what());
      return 1;
    }
    // NOTE: the types too: a number where a string belongs escaped as an uncaught json
    // type_error ("specserve: error: [json.exception.type_error.302] ...", no file or line).
    if (!j.is_object() || !j.contains("turns") || !j["turns"].is_array() || j["turns"].empty() || !j["turns"][0].is_string() ||
        !j.contains("category") || !j["category"].is_string() || (j.contains("question_id") && !j["question_id"].is_number_integer())) {
      std::fprintf(stderr, "specserve bench-spec: %s:%d: needs a string 'category', a non-empty 'turns' of strings and an integer "
                   "'question_id' if any\n", a.questions.c_str(), lineno);
      return 1;
    }
    const std::string task = task_of(j["category"].get<std::string>());
    if (task.empty()) {
      std::fprintf(stderr, "specserve bench-spec: %s:%d: category '%s' is not a Spec-Bench task (translation, summarization, qa, "
                   "math_reasoning, rag, or one of MT-bench's: writing, roleplay, reasoning, math, coding, extraction, stem, "
                   "humanities)\n", a.questions.c_str(), lineno, j["category"].get<std::string>().c_str());
      return 1;
    }
    if (j["turns"][0].get_ref<const std::string&>().empty()) {
      std::fprintf(stderr, "specserve bench-spec: %s:%d: turns[0] is empty\n", a.questions.c_str(), lineno);
      return 1;
    }
    if (taken[task] >= a.per_task) continue;
    ++taken[task];
    // First turn only, through the chat template (Spec-Bench's setting for one-turn tasks).
    auto text = apply_chat_template(*loaded->file, {{"user", j["turns"][0].get<std::string>()}}, true);
    if (!text.ok()) {
      std::fprintf(stderr, "specserve bench-spec: %s\n", text.status().to_string().c_str());
      return 1;
    }
    qs.push_back({j.value("question_id", lineno), task, loaded->tokenizer->encode(*text, true, true)});
  }
  if (qs.empty()) {
    // An empty file ran every configuration over nothing and printed "-nanx" speedups (exit 0).
    std::fprintf(stderr, "specserve bench-spec: --questions %s holds no question\n", a.questions.c_str());
    return 2;
  }
  // Questions are batched within a task (per-task timing stays clean), so a batch can be no larger
  // than the smallest task's question count: "--batch-sizes 8" with 3 questions a task ran
  // batches of 3 under the heading "batch 8".
  const auto smallest = std::min_element(taken.begin(), taken.end(), [](const auto& x, const auto& y) { return x.second < y.second; });
  for (int batch : a.batch_sizes) {
    if (batch > smallest->second) {
      // (When --per-task already allows the batch, the questions file holds too few of that
      // task: asking for a larger --per-task, as it did, would not help.)
      const std::string fix = a.per_task < batch ? "give --per-task " + std::to_string(batch) + " or more, or a smaller batch"
                                                 : "--questions holds only " + std::to_string(smallest->second) +
                                                       " of that task: give a smaller batch, or more of its questions";
      std::fprintf(stderr, "specserve bench-spec: --batch-sizes %d: a batch holds questions of one task, and %s has %d (--per-task %d); %s\n",
                   batch, smallest->first.c_str(), smallest->second, a.per_task, fix.c_str());
      return 2;
    }
  }
  nlohmann::json report;
  report["model"] = path;
  report["questions_per_task"] = a.per_task;
  report["max_tokens"] = a.max_tokens;
  report["threads"] = a.threads;
  report["dtype"] = a.dtype;
  report["cpu_matmul"] = matmul_isa_name(matmul_isa());  // cpu/matmul.h: avx2, avx512, amx or vnni (SPECSERVE_CPU_MATMUL)
  report["cpu_attention"] = attention_kernel_name();  // cpu/attention.h: tiled or rowwise (SPECSERVE_CPU_ATTENTION)
  report["cpu_weights"] = cpu_weight_storage();  // cpu/cpu_backend.h: blocks or f32 (SPECSERVE_CPU_WEIGHTS)
  report["cpu_fused_dequant"] = fused_block_matmul() ? "1" : "0";  // cpu/matmul.h (SPECSERVE_CPU_FUSED_DEQUANT)
  report["device"] = backend->name();
  report["runs"] = nlohmann::json::array();
  for (int batch : a.batch_sizes) {
    auto base = run_config(*loaded, *backend, memory, qs, SpecArgs{}, batch, a.max_tokens, "baseline");
    if (!base.ok()) {
      std::fprintf(stderr, "specserve bench-spec: %s\n", base.status().to_string().c_str());
      return 1;
    }
    std::vector<RunResult> runs = {*base};
    for (const auto& spec : a.specs) {
      SpecArgs sa;
      sa.speculative_config = spec;
      auto r = run_config(*loaded, *backend, memory, qs, sa, batch, a.max_tokens, spec);
      if (!r.ok()) {
        print_spec_error(spec, r.status().message());
        return 1;
      }
      for (auto& [qid, toks] : r->outputs) {
        if (toks != base->outputs[qid]) ++r->total.mismatches;
      }
      runs.push_back(std::move(*r));
    }
    // A task whose question count is not a multiple of the batch runs a smaller last group.
    int64_t groups = 0;
    for (const auto& [task, count] : taken) groups += (count + batch - 1) / batch;
    const double mean_batch = static_cast<double>(qs.size()) / static_cast<double>(groups);
    std::string questions_line;
    for (const auto& [task, count] : taken) {
      questions_line += (questions_line.empty() ? "" : ", ") + task + " " + std::to_string(count);
    }
    std::printf("\n## batch %d, greedy, %d tokens each; questions per task: %s", batch, a.max_tokens, questions_line.c_str());
    if (mean_batch < batch) std::printf("; mean batch %.2f (a task's last group is smaller)", mean_batch);
    std::printf("\n\n");
    std::printf("| method | mt_bench | translation | summarization | qa | math_reasoning | rag | overall | overall end-to-end | mean accepted tokens | tokens per step | acceptance rate | decode tokens/s | greedy mismatches |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    const char* order[] = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"};
    for (const auto& r : runs) {
      nlohmann::json jr;
      jr["name"] = r.name;
      jr["batch"] = batch;
      jr["mean_batch"] = mean_batch;
      std::printf("| %s |", r.name.c_str());
      for (const char* t : order) {
        auto it = r.tasks.find(t);
        auto bt = base->tasks.find(t);
        if (it == r.tasks.end() || bt == base->tasks.end() || it->second.seconds <= 0) {
          std::printf(" - |");
          continue;
        }
        const TaskResult& x = it->second;
        const TaskResult& y = bt->second;
        const double tps = x.tokens / x.seconds, btps = y.tokens / y.seconds;
        const double dtps = x.decode_tokens / x.decode_seconds, bdtps = y.decode_tokens / y.decode_seconds;
        std::printf(" %.2fx (%.2f) |", dtps / bdtps, x.spec.mean_acceptance_length());
        jr["tasks"][t] = {{"tokens", x.tokens}, {"seconds", x.seconds}, {"tokens_per_s", tps},
                          {"decode_tokens_per_s", dtps}, {"speedup", dtps / bdtps}, {"speedup_end_to_end", tps / btps},
                          {"mean_accepted_tokens", x.spec.mean_acceptance_length()},
                          {"decode_tokens", x.decode_tokens}, {"decode_steps", x.decode_steps},
                          {"tokens_per_step", x.decode_steps ? static_cast<double>(x.decode_tokens) / x.decode_steps : 0.0},
                          {"acceptance_rate", x.spec.acceptance_rate()}, {"accepted_per_pos", x.spec.accepted_per_pos},
                          {"drafted_per_pos", x.spec.drafted_per_pos}};
      }
      const double tps = r.total.tokens / r.total.seconds, btps = base->total.tokens / base->total.seconds;
      const double dtps = r.total.decode_tokens / r.total.decode_seconds;
      const double bdtps = base->total.decode_tokens / base->total.decode_seconds;
      const double per_step = r.total.decode_steps ? static_cast<double>(r.total.decode_tokens) / r.total.decode_steps : 0.0;
      std::printf(" %.2fx | %.2fx | %.2f | %.2f | %.3f | %.2f | %d |\n", dtps / bdtps, tps / btps, r.total.spec.mean_acceptance_length(),
                  per_step, r.total.spec.acceptance_rate(), dtps, r.total.mismatches);
      jr["overall"] = {{"tokens", r.total.tokens}, {"seconds", r.total.seconds}, {"tokens_per_s", tps},
                       {"decode_tokens_per_s", dtps}, {"speedup", dtps / bdtps}, {"speedup_end_to_end", tps / btps},
                       {"mean_accepted_tokens", r.total.spec.mean_acceptance_length()},
                       {"decode_tokens", r.total.decode_tokens}, {"decode_steps", r.total.decode_steps}, {"tokens_per_step", per_step},
                       {"acceptance_rate", r.total.spec.acceptance_rate()}, {"num_drafts", r.total.spec.num_drafts},
                       {"num_draft_tokens", r.total.spec.num_draft_tokens},
                       {"num_accepted_tokens", r.total.spec.num_accepted_tokens},
                       {"accepted_per_pos", r.total.spec.accepted_per_pos}, {"drafted_per_pos", r.total.spec.drafted_per_pos},
                       {"greedy_mismatches", r.total.mismatches}};
      if (r.total.engine_steps > 0) {
        const double n = static_cast<double>(r.total.engine_steps);
        jr["overall"]["decode_engine_steps"] = r.total.engine_steps;
        jr["overall"]["ms_per_engine_step"] = 1e3 * r.total.decode_seconds / n;
        jr["overall"]["draft_ms_per_engine_step"] = 1e3 * r.total.draft_seconds / n;
        jr["overall"]["forward_ms_per_engine_step"] = 1e3 * r.total.forward_seconds / n;
        jr["overall"]["other_ms_per_engine_step"] = 1e3 * (r.total.decode_seconds - r.total.draft_seconds - r.total.forward_seconds) / n;
      }
      jr["overall"]["drafts_by_source"] = nlohmann::json::parse(draft_sources_json(r.by_source));
      if (r.lookup_drafts >= 0) {
        jr["overall"]["lookup_drafts"] = r.lookup_drafts;
        jr["overall"]["inner_drafts"] = r.inner_drafts;
      }
      report["runs"].push_back(jr);
    }
    std::printf("\nCells: decode-phase speedup over the baseline of this run (mean accepted tokens per step). Decode phase:\n"
                "after every sequence of a batch had its first token (prefill is the same for every method and, on 2 CPU\n"
                "cores, long: end-to-end includes it). Mean accepted tokens: 1 + accepted / drafts over the steps that\n"
                "drafted (vLLM's); tokens per step: decode tokens / target steps after each sequence's first token, every\n"
                "step counted (Spec-Bench's measure; lower than the mean when some steps draft nothing, e.g. draft_p_min).\n");
    // Where a decode step's time goes: Spec-Bench reports only the speedup; this says whether a
    // method loses to its proposer or to the wider target pass.
    std::printf("\nTime per engine step in the decode phase (ms; proposer: Proposer::propose; target forward: the target's\n"
                "passes, verification included; other: the engine's own work between them: scheduling, KV blocks, the\n"
                "acceptance check, sampling. A sequence's first proposer call in the decode phase also runs the head over\n"
                "its prompt (EAGLE: the draft layer's own KV), which weighs more in short outputs. Tokens per engine step:\n"
                "decode tokens / engine steps, all sequences of a batch):\n\n"
                "| method | engine steps | ms per step | proposer | target forward | other | tokens per engine step |\n|---|---|---|---|---|---|---|\n");
    for (const auto& r : runs) {
      if (r.total.engine_steps <= 0) continue;
      const double n = static_cast<double>(r.total.engine_steps);
      const double all = 1e3 * r.total.decode_seconds / n, dr = 1e3 * r.total.draft_seconds / n, fw = 1e3 * r.total.forward_seconds / n;
      std::printf("| %s | %lld | %.2f | %.2f | %.2f | %.2f | %.2f |\n", r.name.c_str(), static_cast<long long>(r.total.engine_steps), all, dr,
                  fw, all - dr - fw, static_cast<double>(r.total.decode_tokens) / n);
    }
    // Acceptance by depth: the share of verification steps whose draft token at depth i (a
    // chain's i-th token; a tree's accepted node at depth i) was accepted.
    size_t max_depth = 0;
    // A tree's columns stop at its depth (accepted_per_pos has k entries, those past it always 0).
    for (const auto& r : runs) max_depth = std::max(max_depth, std::min(r.total.spec.accepted_per_pos.size(), static_cast<size_t>(r.max_depth)));
    if (max_depth > 0) {
      max_depth = std::min<size_t>(max_depth, 12);
      std::printf("\nAcceptance by depth (share of steps whose token at depth i was accepted):\n\n| method |");
      for (size_t i = 0; i < max_depth; ++i) std::printf(" %zu |", i + 1);
      std::printf("\n|---|");
      for (size_t i = 0; i < max_depth; ++i) std::printf("---|");
      std::printf("\n");
      for (const auto& r : runs) {
        if (r.total.spec.num_drafts == 0) continue;
        std::printf("| %s |", r.name.c_str());
        for (size_t i = 0; i < max_depth; ++i) {
          if (i < r.total.spec.accepted_per_pos.size() && i < static_cast<size_t>(r.max_depth)) {
            std::printf(" %.3f |", static_cast<double>(r.total.spec.accepted_per_pos[i]) / static_cast<double>(r.total.spec.num_drafts));
          } else {
            std::printf(" - |");
          }
        }
        std::printf("\n");
      }
      // The same counts over the steps whose draft reached depth i: adaptive k (chains shrink to
      // 1 after a rejection) and draft_p_min draft shorter than k, which the table above counts
      // as rejections at the depths not drafted.
      std::printf("\nAcceptance by depth among the drafts that reached it (accepted at depth i / steps drafting depth i;\n"
                  "in parentheses the share of steps that drafted that deep):\n\n| method |");
      for (size_t i = 0; i < max_depth; ++i) std::printf(" %zu |", i + 1);
      std::printf("\n|---|");
      for (size_t i = 0; i < max_depth; ++i) std::printf("---|");
      std::printf("\n");
      for (const auto& r : runs) {
        const SpecStats& sp = r.total.spec;
        if (sp.num_drafts == 0) continue;
        std::printf("| %s |", r.name.c_str());
        for (size_t i = 0; i < max_depth; ++i) {
          if (i < sp.drafted_per_pos.size() && i < sp.accepted_per_pos.size() && sp.drafted_per_pos[i] > 0) {
            std::printf(" %.3f (%.2f) |", static_cast<double>(sp.accepted_per_pos[i]) / static_cast<double>(sp.drafted_per_pos[i]),
                        static_cast<double>(sp.drafted_per_pos[i]) / static_cast<double>(sp.num_drafts));
          } else {
            std::printf(" - |");
          }
        }
        std::printf("\n");
      }
    }
    // Who drafted, for the methods that look up n-grams (ngram, prompt lookup first, earlier
    // requests' outputs).
    auto mixed = [](const RunResult& r) {
      return r.by_source[static_cast<size_t>(DraftSource::kPromptLookup)].num_drafts +
                 r.by_source[static_cast<size_t>(DraftSource::kCachedRequests)].num_drafts > 0;
    };
    if (std::any_of(runs.begin(), runs.end(), mixed)) {
      std::printf("\nDrafts by source (verification steps whose draft came from each source; acceptance: accepted / drafted\n"
                  "tokens; tokens per step: 1 + accepted / drafts):\n\n"
                  "| method | source | drafts | share of drafts | acceptance | tokens per step |\n|---|---|---|---|---|---|\n");
      for (const auto& r : runs) {
        if (!mixed(r)) continue;
        int64_t all = 0;
        for (const DraftSourceStats& b : r.by_source) all += b.num_drafts;
        for (size_t i = 0; i < r.by_source.size(); ++i) {
          const DraftSourceStats& b = r.by_source[i];
          if (b.num_drafts == 0) continue;
          const auto src = static_cast<DraftSource>(i);
          std::printf("| %s | %s | %lld | %.3f | %.3f | %.2f |\n", r.name.c_str(),
                      draft_source_label(src, r.model_name).c_str(), static_cast<long long>(b.num_drafts),
                      static_cast<double>(b.num_drafts) / static_cast<double>(all),
                      b.num_draft_tokens ? static_cast<double>(b.num_accepted_tokens) / static_cast<double>(b.num_draft_tokens) : 0.0,
                      1.0 + static_cast<double>(b.num_accepted_tokens) / static_cast<double>(b.num_drafts));
        }
      }
    }
    std::fflush(stdout);
  }
  if (!a.output.empty()) {
    if (Status st = write_output_file("--output", a.output, report.dump(1) + "\n"); !st.ok()) {
      std::fprintf(stderr, "specserve bench-spec: %s\n", st.message().c_str());
      return 1;
    }
    std::fprintf(stderr, "[bench-spec] wrote %s\n", a.output.c_str());
  }
  return 0;
}

}  // namespace

void add_bench_spec(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand("bench-spec", "Speculative decoding on Spec-Bench: speedup, acceptance, per task (a benchmark)");
  sub->add_option("--model", a->model, "Target GGUF (default: the fetched SmolLM2-135M-Instruct)")->check(non_empty_path());
  sub->add_option("--questions", a->questions,
                 "Spec-Bench question.jsonl (default: the project's shared/ folder beside the checkout, "
                 "../shared/data/spec_bench/question.jsonl)");
  sub->add_option("--per-task", a->per_task, "Questions per task (the first N of each)")->check(CLI::Range(1, 80))->capture_default_str();
  sub->add_option("--max-tokens", a->max_tokens, "Tokens generated per question (2 or more: the speedup is measured after each sequence's first token)")->check(CLI::Range(2, 4096))->capture_default_str();
  sub->add_option("--threads", a->threads, "CPU threads (default: all)")->check(CLI::Range(0, 1024));
  sub->add_option("--device", a->device, "Where the model runs: cpu or cuda:N (default: cpu)");
  add_dtype_option(*sub, &a->dtype);
  add_enforce_eager_flag(*sub);
  add_gpu_memory_utilization_option(*sub, &a->gpu_memory_utilization,
                                    "cuda:N: fraction of the GPU's total memory to use for weights, activations and KV (vLLM's)");
  sub->add_option("--batch-sizes", a->batch_sizes, "Batch sizes to run (e.g. 1 8); a batch holds questions of one task, so each must be at most --per-task")->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--spec", a->specs, "A --speculative-config JSON per method to compare with the baseline (repeatable; default: one, "
                 R"({"method":"ngram","num_speculative_tokens":4}))")->check(non_empty_json());
  sub->add_option("--output", a->output, "Write the results as JSON here");
  register_command("bench-spec", [a] { return run_bench(*a); });
}

}  // namespace specserve::cli
