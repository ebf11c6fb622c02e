// `specserve bench-migrate`: the time to migrate a prefilled sequence (about 2,000 tokens) to
// another process over the KV data plane, against re-prefilling it there — the two ways a
// draining replica or a prefill worker can hand a sequence over (spec/engine.h add_migrated).
//
// Two processes on this host, both with the model on the CPU backend:
//   - the exporter (a child forked before any UCX or OpenMP state exists: UCX is not fork-safe)
//     prefills the prompt in an Engine until its first token, then per transport times
//     Engine::export_sequence + export_kv_blocks (kv/transfer.h) into a registered UCX region and
//     announces it; it also steps once more to give the uninterrupted run's next token;
//   - the importer (this process) per transport connects a UcxAgent, times the get of the export
//     into its own registered region (KvEndpoint::get, pipelined), then the import into a fresh
//     Engine (Engine::add_migrated whose SequenceImport::load_kv calls import_kv_blocks) and the
//     first decode step, whose token must equal the uninterrupted run's;
//   - the alternative, re-prefilling: a fresh Engine given the same request through add_migrated
//     without KV (num_cached 0: it recomputes prompt + first token), timed until it emits that
//     same next token.
// Every timed piece runs --repeats times (a fresh, warmed-up Engine each time: workers are
// pre-warmed); medians are reported.
// Protocol on the socketpair: the child announces, per transport, its worker address, region
// and the sequence's state; then it serves (busy progress, as bench-kv-transfer's peer) the
// transport whose index the parent writes, idles on 'i' and exits on 'q'.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cpu/cpu_backend.h"
#include "kv/transfer.h"
#include "kv/ucx_transport.h"
#include "model/model_fingerprint.h"
#include "spec/engine.h"
#include "tools/cli/common.h"
#include "tools/cli/registry.h"
#include "tools/cli/subcommands.h"

namespace specserve::cli {
namespace {

struct Args {
  std::string model, output;
  std::vector<std::string> transports = {"tcp", "sm"};
  int prompt_tokens = 2000;
  int max_model_len = 8192;
  int threads = 2;
  int repeats = 3;
};

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// ---- the socketpair channel (lengths first) ----
bool write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w <= 0) return false;
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
template <typename T>
bool send_vec(int fd, const std::vector<T>& v) {
  const uint64_t n = v.size();
  return write_all(fd, &n, 8) && write_all(fd, v.data(), n * sizeof(T));
}
template <typename T>
bool recv_vec(int fd, std::vector<T>& v) {
  uint64_t n = 0;
  if (!read_all(fd, &n, 8) || n > (uint64_t{1} << 32)) return false;
  v.resize(n);
  return read_all(fd, v.data(), n * sizeof(T));
}
bool send_str(int fd, const std::string& s) { return send_vec(fd, std::vector<char>(s.begin(), s.end())); }
bool recv_str(int fd, std::string& s) {
  std::vector<char> v;
  if (!recv_vec(fd, v)) return false;
  s.assign(v.begin(), v.end());
  return true;
}

// The prompt: an English paragraph repeated (numbered, so blocks differ) until `n` tokens.
std::vector<int32_t> make_prompt(const Tokenizer& tok, int n) {
  std::vector<int32_t> out;
  for (int i = 1; static_cast<int>(out.size()) < n; ++i) {
    const std::string para = "Section " + std::to_string(i) +
                             ". The scheduler batches requests, the draft model proposes tokens, and the target "
                             "model verifies them in one forward pass; accepted tokens stream to the client while "
                             "the KV cache keeps every block of the sequence for the next step. ";
    const auto t = tok.encode(para, /*add_special=*/false, /*parse_special=*/false);
    out.insert(out.end(), t.begin(), t.end());
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

EngineOptions engine_options(const Args& a) {
  EngineOptions o;
  o.max_model_len = a.max_model_len;
  o.max_num_batched_tokens = std::max(2048, a.prompt_tokens + 1);  // one prefill step, as a shard's
  o.num_kv_blocks = (a.prompt_tokens + 64) / 16 + 8;                // one sequence: keep the cache small
  o.enable_prefix_caching = false;
  return o;
}

GenerateParams request(const std::vector<int32_t>& prompt) {
  GenerateParams p;
  p.prompt = prompt;
  p.sampling.temperature = 0;  // greedy: the next token is a check, not a sample
  p.max_tokens = 8;
  return p;
}

// Steps `e` until sequence `id` emitted a token; returns it (-1 on error).
int32_t step_until_token(Engine& e, int64_t id) {
  std::vector<SeqEvent> evs;
  for (int guard = 0; guard < 1000 && e.has_work(); ++guard) {
    if (!e.step(&evs).ok()) return -1;
    for (const SeqEvent& ev : evs) {
      if (ev.seq_id == id && !ev.tokens.empty()) return ev.tokens.front();
    }
    evs.clear();
  }
  return -1;
}

// A fresh engine, warmed by a short request run to completion: worker engines are pre-warmed
// (DESIGN.md section 5), so neither side's timing pays first-step allocations.
Expected<std::unique_ptr<Engine>> warm_engine(LoadedModel& lm, const EngineOptions& eo) {
  auto e = Engine::create(*lm.model, lm.tokenizer.get(), nullptr, eo);
  if (!e.ok()) return e.status();
  GenerateParams w = request(lm.tokenizer->encode("Warm up.", false, false));
  w.max_tokens = 2;
  auto id = (*e)->add_request(w);
  if (!id.ok()) return id.status();
  std::vector<SeqEvent> evs;
  for (int guard = 0; guard < 100 && (*e)->has_work(); ++guard) SPECSERVE_RETURN_IF_ERROR((*e)->step(&evs));
  return e;
}

struct Announcement {  // per transport, child -> parent
  std::vector<uint8_t> address;
  KvRemoteRegion region;
  int64_t bytes = 0;
  std::vector<double> export_ms;
};

// ---- the exporter (child) ----
[[noreturn]] void exporter(int fd, const Args& a) {
  auto die = [](int code, const std::string& m) {
    std::fprintf(stderr, "bench-migrate exporter: %s\n", m.c_str());
    _exit(code);
  };
  auto backend = make_cpu_backend(a.threads);
  auto lm = load_model(a.model.empty() ? default_model_path() : a.model, *backend, /*quiet=*/true);
  if (!lm.ok()) die(2, lm.status().to_string());
  const auto prompt = make_prompt(*lm->tokenizer, a.prompt_tokens);
  auto engine = Engine::create(*lm->model, lm->tokenizer.get(), nullptr, engine_options(a));
  if (!engine.ok()) die(3, engine.status().to_string());
  auto id = (*engine)->add_request(request(prompt));
  if (!id.ok()) die(3, id.status().to_string());
  const int32_t first = step_until_token(**engine, *id);
  if (first < 0) die(3, "prefill failed");
  const KvExportFormat fmt = kv_export_format((*engine)->kv_storage(), model_fingerprint(*lm->file));
  auto ex = (*engine)->export_sequence(*id);
  if (!ex.ok()) die(3, ex.status().to_string());
  const int64_t nblocks = static_cast<int64_t>(ex->blocks.size());
  const int64_t bytes = kv_export_bytes(fmt, nblocks);

  std::vector<std::unique_ptr<UcxAgent>> agents;
  std::vector<std::unique_ptr<UcxRegion>> regions;
  std::vector<Announcement> ann;
  for (const std::string& tls : a.transports) {
    UcxAgentOptions o;
    o.name = "exporter-" + tls;
    o.transports = tls;
    auto agent = UcxAgent::create(o);
    if (!agent.ok()) die(4, agent.status().to_string());
    auto region = (*agent)->allocate_region(bytes);
    if (!region.ok()) die(4, region.status().to_string());
    Announcement an;
    for (int r = 0; r < a.repeats; ++r) {
      // What a shard pays when a sequence leaves: its state, then its KV blocks in export format.
      const auto t0 = Clock::now();
      auto e2 = (*engine)->export_sequence(*id);
      if (!e2.ok()) die(4, e2.status().to_string());
      auto h = export_kv_blocks(*backend, (*engine)->kv_storage(), fmt, e2->blocks.data(), nblocks, e2->num_cached,
                                (*region)->data(), bytes);
      an.export_ms.push_back(ms_since(t0));
      if (!h.ok()) die(4, h.status().to_string());
    }
    an.address = (*agent)->address();
    an.region = (*region)->remote();
    an.bytes = bytes;
    ann.push_back(std::move(an));
    agents.push_back(std::move(*agent));
    regions.push_back(std::move(*region));
  }
  // The uninterrupted run's next token (the exports above are already taken).
  const int32_t next = step_until_token(**engine, *id);
  // State the importer's add_migrated needs.
  if (!send_vec(fd, prompt) || !send_vec(fd, ex->output) || !send_str(fd, ex->rng_state) ||
      !write_all(fd, &ex->num_cached, 4) || !write_all(fd, &next, 4) || !write_all(fd, &fmt.model_fingerprint, 8)) {
    _exit(5);
  }
  for (const Announcement& an : ann) {
    const uint64_t base = an.region.base, rb = an.region.bytes;
    if (!send_vec(fd, an.address) || !write_all(fd, &base, 8) || !write_all(fd, &rb, 8) ||
        !send_vec(fd, an.region.rkey) || !write_all(fd, &an.bytes, 8) || !send_vec(fd, an.export_ms)) {
      _exit(5);
    }
  }
  for (;;) {
    char cmd = 0;
    if (!read_all(fd, &cmd, 1) || cmd == 'q') break;
    if (cmd == 'i') continue;
    const size_t i = static_cast<size_t>(cmd - '0');
    if (i >= agents.size()) break;
    // Serve transport i: over tcp the target answers gets, so progress busily until told.
    uint32_t spins = 0;
    agents[i]->progress_until(KvDeadline::max(), [&] {
      if ((++spins & 1023) != 0) return false;
      pollfd p{fd, POLLIN, 0};
      return ::poll(&p, 1, 0) > 0;
    });
  }
  regions.clear();
  agents.clear();
  _exit(0);
}

int run(const Args& a) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  std::fprintf(stderr, "[bench-migrate] forking the exporter (before any UCX agent exists)\n");
  const pid_t pid = ::fork();
  if (pid < 0) return 1;
  if (pid == 0) {
    ::close(sv[0]);
    exporter(sv[1], a);
  }
  ::close(sv[1]);
  const int fd = sv[0];
  auto fail = [&](const std::string& m) {
    std::fprintf(stderr, "specserve bench-migrate: %s\n", m.c_str());
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return 1;
  };

  auto backend = make_cpu_backend(a.threads);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  auto lm = load_model(path, *backend, /*quiet=*/true);
  if (!lm.ok()) return fail(lm.status().to_string());
  const auto prompt = make_prompt(*lm->tokenizer, a.prompt_tokens);
  std::fprintf(stderr, "[bench-migrate] model %s loaded; prompt of %d tokens; waiting for the exporter's prefill\n",
               path.c_str(), a.prompt_tokens);

  std::vector<int32_t> their_prompt, output;
  std::string rng_state;
  int32_t num_cached = 0, want_next = -1;
  uint64_t fingerprint = 0;
  if (!recv_vec(fd, their_prompt) || !recv_vec(fd, output) || !recv_str(fd, rng_state) ||
      !read_all(fd, &num_cached, 4) || !read_all(fd, &want_next, 4) || !read_all(fd, &fingerprint, 8)) {
    return fail("the exporter exited before announcing (see its error above)");
  }
  if (their_prompt != prompt) return fail("the exporter built another prompt");
  if (fingerprint != model_fingerprint(*lm->file)) return fail("the exporter loaded another model");
  std::vector<Announcement> ann(a.transports.size());
  for (Announcement& an : ann) {
    if (!recv_vec(fd, an.address) || !read_all(fd, &an.region.base, 8) || !read_all(fd, &an.region.bytes, 8) ||
        !recv_vec(fd, an.region.rkey) || !read_all(fd, &an.bytes, 8) || !recv_vec(fd, an.export_ms)) {
      return fail("short announcement from the exporter");
    }
  }
  std::fprintf(stderr, "[bench-migrate] exporter ready: %d tokens cached, %lld bytes of KV, next token %d\n", num_cached,
               static_cast<long long>(ann.front().bytes), want_next);

  const EngineOptions eo = engine_options(a);
  GenerateParams req = request(prompt);
  req.resume_output = output;

  // Re-prefill: a fresh engine recomputes prompt + output (add_migrated without KV) up to the
  // next token. The exporter idles meanwhile (blocked on read), so both cores are ours.
  std::vector<double> reprefill_ms;
  for (int r = 0; r < a.repeats; ++r) {
    auto e = warm_engine(*lm, eo);
    if (!e.ok()) return fail(e.status().to_string());
    SequenceImport none;
    none.rng_state = rng_state;
    const auto t0 = Clock::now();
    auto id = (*e)->add_migrated(req, std::move(none));
    if (!id.ok()) return fail(id.status().to_string());
    const int32_t next = step_until_token(**e, *id);
    reprefill_ms.push_back(ms_since(t0));
    if (next != want_next) {
      return fail("re-prefill gave token " + std::to_string(next) + ", the uninterrupted run " + std::to_string(want_next));
    }
    std::fprintf(stderr, "[bench-migrate] re-prefill %d/%d: %.1f ms\n", r + 1, a.repeats, reprefill_ms.back());
  }

  // Migration, per transport: get the export into a registered region, import it into a fresh
  // engine (add_migrated -> load_kv -> import_kv_blocks), one decode step to the next token.
  nlohmann::json rows = nlohmann::json::array();
  std::printf("| UCX_TLS | KV bytes | export ms | transfer ms | import ms | migrate ms | + decode step ms | "
              "re-prefill ms | speed-up (to next token) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t t = 0; t < a.transports.size(); ++t) {
    const std::string& tls = a.transports[t];
    const Announcement& an = ann[t];
    UcxAgentOptions o;
    o.name = "importer-" + tls;
    o.transports = tls;
    auto agent = UcxAgent::create(o);
    if (!agent.ok()) return fail(agent.status().to_string());
    auto local = (*agent)->allocate_region(an.bytes);
    if (!local.ok()) return fail(local.status().to_string());
    std::memset((*local)->data(), 0, static_cast<size_t>(an.bytes));  // first-touch outside the timing
    const char cmd = static_cast<char>('0' + t);
    if (!write_all(fd, &cmd, 1)) return fail("the exporter is gone");
    auto ep = (*agent)->connect(an.address, "exporter-" + tls, kv_deadline_after(std::chrono::seconds(30)));
    if (!ep.ok()) return fail(ep.status().to_string());
    std::vector<double> transfer_ms, import_ms, decode_ms;
    for (int r = 0; r < a.repeats; ++r) {
      auto t0 = Clock::now();
      const Status st = (*ep)->get((*local)->data(), an.bytes, an.region, 0, kv_deadline_after(std::chrono::seconds(60)));
      transfer_ms.push_back(ms_since(t0));
      if (!st.ok()) return fail(st.to_string());
      auto e = warm_engine(*lm, eo);
      if (!e.ok()) return fail(e.status().to_string());
      const KvExportFormat fmt = kv_export_format((*e)->kv_storage(), fingerprint);
      SequenceImport imp;
      imp.rng_state = rng_state;
      imp.num_cached = num_cached;
      Status load_status;
      imp.load_kv = [&](KvStorage& kv, std::span<const int32_t> blocks) -> Status {
        auto h = import_kv_blocks(*backend, kv, fmt, static_cast<const uint8_t*>((*local)->data()), an.bytes,
                                  blocks.data(), static_cast<int64_t>(blocks.size()));
        load_status = h.ok() ? Status() : h.status();
        return load_status;
      };
      bool loaded = false;
      t0 = Clock::now();
      auto id = (*e)->add_migrated(req, std::move(imp), &loaded);
      import_ms.push_back(ms_since(t0));
      if (!id.ok()) return fail(id.status().to_string());
      if (!loaded) return fail("the KV did not load: " + load_status.to_string());
      t0 = Clock::now();
      const int32_t next = step_until_token(**e, *id);
      decode_ms.push_back(ms_since(t0));
      if (next != want_next) {
        return fail("after migrating over " + tls + " the next token is " + std::to_string(next) +
                    ", the uninterrupted run's " + std::to_string(want_next));
      }
      std::fprintf(stderr, "[bench-migrate] %s %d/%d: transfer %.1f ms, import %.1f ms, decode step %.1f ms; next token ok\n",
                   tls.c_str(), r + 1, a.repeats, transfer_ms.back(), import_ms.back(), decode_ms.back());
    }
    const char idle = 'i';
    if (!write_all(fd, &idle, 1)) return fail("the exporter is gone");
    ep->reset();
    const double ex_ms = median(an.export_ms), tr_ms = median(transfer_ms), im_ms = median(import_ms);
    const double dec_ms = median(decode_ms), re_ms = median(reprefill_ms);
    const double migrate_ms = ex_ms + tr_ms + im_ms;
    const double speedup = re_ms / (migrate_ms + dec_ms);
    std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1fx |\n", tls.c_str(),
                static_cast<long long>(an.bytes), ex_ms, tr_ms, im_ms, migrate_ms, dec_ms, re_ms, speedup);
    std::fflush(stdout);
    rows.push_back({{"transports", tls},
                    {"bytes", an.bytes},
                    {"tokens", num_cached},
                    {"export_ms", ex_ms},
                    {"transfer_ms", tr_ms},
                    {"import_ms", im_ms},
                    {"migrate_ms", migrate_ms},
                    {"decode_step_ms", dec_ms},
                    {"reprefill_ms", re_ms},
                    {"speedup_to_next_token", speedup},
                    {"transfer_mib_per_s", static_cast<double>(an.bytes) / (tr_ms / 1000.0) / (1 << 20)},
                    {"runs", {{"export_ms", an.export_ms},
                              {"transfer_ms", transfer_ms},
                              {"import_ms", import_ms},
                              {"decode_step_ms", decode_ms},
                              {"reprefill_ms", reprefill_ms}}}});
  }
  const char quit = 'q';
  (void)write_all(fd, &quit, 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fd);
  if (!a.output.empty()) {
    std::ofstream out(a.output);
    out << nlohmann::json{{"tool", "specserve bench-migrate"},
                          {"model", path},
                          {"prompt_tokens", a.prompt_tokens},
                          {"max_model_len", a.max_model_len},
                          {"threads", a.threads},
                          {"repeats", a.repeats},
                          {"next_token", want_next},
                          {"results", rows}}
                .dump(2)
        << "\n";
    if (!out) {
      std::fprintf(stderr, "specserve bench-migrate: cannot write %s\n", a.output.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

void add_bench_migrate(CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "bench-migrate", "Time to migrate a prefilled sequence's KV to another process over UCX vs re-prefilling it (a benchmark)");
  sub->add_option("--model", a->model, "GGUF model (default: the default model)")->check(non_empty_path());
  sub->add_option("--transports", a->transports, "UCX_TLS values to measure, one run each")->expected(1, -1);
  sub->add_option("--prompt-tokens", a->prompt_tokens, "Prompt length in tokens")->check(CLI::Range(16, 100000));
  sub->add_option("--max-model-len", a->max_model_len, "Engine context length")->check(CLI::Range(32, 1 << 20));
  sub->add_option("--threads", a->threads, "CPU backend threads (each process)")->check(CLI::Range(1, 256));
  sub->add_option("--repeats", a->repeats, "Timed runs of each piece; medians are reported")->check(CLI::Range(1, 100));
  sub->add_option("--output", a->output, "Write the results as JSON here");
  register_command("bench-migrate", [a] { return run(*a); });
}

}  // namespace specserve::cli
