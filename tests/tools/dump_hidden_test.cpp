// `specserve dump-hidden` on the real default model: shapes and index of the dump, hidden
// states recorded during generation equal to a teacher-forced forward pass over the same
// tokens (bit for bit, before the float16 rounding), greedy continuation consistent with the
// argmax, and hidden x output head = logits' argmax (the property Medusa/EAGLE training relies
// on). Also the .npy and half helpers.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/dequant.h"
#include "model/model_fingerprint.h"
#include "model/transformer.h"
#include "tests/test_util.h"
#include "tools/cli/dump_hidden_lib.h"

namespace specserve::cli {
namespace {

std::filesystem::path temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("dump_hidden_test_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(p);
  return p;
}

template <typename T>
std::vector<T> load(const std::string& path, const std::string& want_descr, std::vector<int64_t>* shape) {
  std::string descr;
  std::vector<uint8_t> bytes;
  Status st = read_npy(path, &descr, shape, &bytes);
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_EQ(descr, want_descr) << path;
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(Half, KnownValuesAndRoundTrip) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.5f), 0xc100);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);          // overflow -> inf
  EXPECT_EQ(float_to_half(1e-8f), 0x0000);         // underflow -> 0
  EXPECT_EQ(float_to_half(5.9604645e-8f), 0x0001); // smallest subnormal
  EXPECT_EQ(float_to_half(1.0f + 1.0f / 2048), 0x3c00);  // tie -> even
  for (float f : {0.1f, -3.14159f, 1234.5f, 6.1e-5f, -0.0004f})
    EXPECT_NEAR(half_to_float(float_to_half(f)), f, std::abs(f) * 1e-3f) << f;
}

TEST(DumpHidden, RejectsBadPromptLine) {
  auto backend = make_cpu_backend(1);
  auto lm = load_model(specserve::testing::default_model_path(), *backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  const auto dir = temp_dir("bad");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"ok\"}\n[1, 2]\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("p.jsonl:2"), std::string::npos) << r.status().message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out")) << "a failed dump left the directory it made";

  // A role the chat template does not know, named with its line and value.
  std::ofstream(dir / "roles.jsonl") << "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"}, "
                                        "{\"role\": \"user\", \"content\": \"Hi\"}]}\n"
                                        "{\"messages\": [{\"role\": \"wizard\", \"content\": \"Hi\"}]}\n";
  o.prompts_path = (dir / "roles.jsonl").string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("roles.jsonl:2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("\"wizard\""), std::string::npos) << r.status().message();

  // --out naming a file: refused as bad input (not an internal error), the file untouched.
  std::ofstream(dir / "file") << "keep";
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "file").string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a directory"), std::string::npos) << r.status().message();
  EXPECT_EQ(std::filesystem::file_size(dir / "file"), 4u);

  // max_new_tokens < 1: refused naming the field and value.
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 0;
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("max_new_tokens must be >= 1 (got 0)"), std::string::npos) << r.status().message();
  o.max_new_tokens = 96;

  // --prompts naming a directory: bad input naming the flag and the path.
  o.prompts_path = dir.string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--prompts " + dir.string() + " is a directory"), std::string::npos) << r.status().message();
  o.prompts_path = (dir / "p.jsonl").string();

  // A line with both "messages" and "prompt" is ambiguous: refused with its line.
  std::ofstream(dir / "both.jsonl") << "{\"prompt\": \"a\", \"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}\n";
  o.prompts_path = (dir / "both.jsonl").string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("both.jsonl:1: has both"), std::string::npos) << r.status().message();
  o.prompts_path = (dir / "p.jsonl").string();

  // --out that cannot be created (/proc refuses new entries): bad input naming --out and the
  // path, not an internal error.
  o.out_dir = "/proc/specserve_dump_hidden_test/out";
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().to_string();
  EXPECT_NE(r.status().message().find("--out /proc/specserve_dump_hidden_test/out"), std::string::npos) << r.status().message();

  // A failed dump removes the parents of --out it created too (a/b/c where a did not exist),
  // and leaves an --out that existed (empty here) as it was.
  o.out_dir = (dir / "a" / "b" / "c").string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "a")) << "a failed dump left the parent directories it made";
  std::filesystem::create_directories(dir / "existing");
  o.out_dir = (dir / "existing").string();
  r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  ASSERT_TRUE(std::filesystem::is_directory(dir / "existing"));
  EXPECT_TRUE(std::filesystem::is_empty(dir / "existing")) << "a failed dump left files in a directory it did not make";
  std::filesystem::remove_all(dir);
}

/// Rows of hidden.npy in `out` and num_positions of its index.json (-1 when absent).
std::pair<int64_t, int64_t> rows_and_index(const std::filesystem::path& out) {
  int64_t rows = -1, indexed = -1;
  std::vector<int64_t> shape;
  std::string descr;
  std::vector<uint8_t> bytes;
  if (read_npy((out / "hidden.npy").string(), &descr, &shape, &bytes).ok()) rows = shape.at(0);
  if (std::filesystem::exists(out / "index.json")) {
    std::ifstream jf(out / "index.json");
    indexed = nlohmann::json::parse(jf)["num_positions"].get<int64_t>();
  }
  return {rows, indexed};
}

/// True when `out` holds a partial directory of a dump (.dump-hidden.partial-*).
bool has_partial(const std::filesystem::path& out) {
  for (const auto& e : std::filesystem::directory_iterator(out)) {
    if (e.path().filename().string().rfind(".dump-hidden.partial-", 0) == 0) return true;
  }
  return false;
}

TEST(DumpHidden, OverwriteIsWholeOrHasNoIndex) {
  // Replacing a dump: the new files are written aside and moved in only when complete, the old
  // index.json removed first, so whatever happens a directory with an index.json holds one
  // whole dump (its num_positions = hidden.npy's rows), and unrelated files stay.
  auto backend = make_cpu_backend(1);
  auto lm = load_model(specserve::testing::default_model_path(), *backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  const auto dir = temp_dir("overwrite");
  std::ofstream(dir / "one.jsonl") << "{\"prompt\": \"The capital of France is\"}\n";
  std::ofstream(dir / "two.jsonl") << "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"One, two, three,\"}\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "one.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 3;
  o.write_weights = false;
  // A previous dump's weights (of another model, perhaps): a dump --no-weights removes them
  // (they were left, and the trainers read them as this dump's).
  std::filesystem::create_directories(dir / "out");
  std::ofstream(dir / "out" / "head.npy") << "stale";
  std::ofstream(dir / "out" / "embed.npy") << "stale";
  ASSERT_TRUE(dump_hidden(*lm, o).ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "head.npy"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out" / "embed.npy"));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(dir / "out" / "index.json"))["weights"], false);
  const auto [rows1, indexed1] = rows_and_index(dir / "out");
  ASSERT_GT(rows1, 0);
  ASSERT_EQ(rows1, indexed1);
  std::ofstream(dir / "out" / "notes.txt") << "mine";

  // A failure while the files move in (argmax.npy is a directory there): never an index.json
  // over files of another dump (the old in-place writer left the old index over new rows).
  std::filesystem::remove(dir / "out" / "argmax.npy");
  std::filesystem::create_directories(dir / "out" / "argmax.npy" / "x");
  o.prompts_path = (dir / "two.jsonl").string();
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  auto [rows, indexed] = rows_and_index(dir / "out");
  EXPECT_TRUE(indexed == -1 || indexed == rows) << "index.json says " << indexed << " positions, hidden.npy has " << rows;
  EXPECT_FALSE(has_partial(dir / "out"));

  // And without the obstacle: replaced whole, other files kept, nothing left aside.
  std::filesystem::remove_all(dir / "out" / "argmax.npy");
  auto ok = dump_hidden(*lm, o);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  std::tie(rows, indexed) = rows_and_index(dir / "out");
  EXPECT_EQ(rows, indexed);
  EXPECT_EQ(rows, ok->num_positions);
  EXPECT_GT(rows, rows1);
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "argmax.npy"));
  EXPECT_TRUE(std::filesystem::exists(dir / "out" / "notes.txt"));
  EXPECT_FALSE(has_partial(dir / "out"));
  std::filesystem::remove_all(dir);
}

// An interrupted dump (DumpHiddenOptions::stop, set by the CLI's SIGINT/SIGTERM handler) fails
// as kCancelled and leaves nothing of itself; the partial directory a dump killed outright left
// (its process gone) is removed by the next dump there, a live process's is not.
// NOTE: both were left behind for good.
TEST(DumpHidden, AnInterruptedDumpLeavesNothingAndADeadDumpsPartialIsRemoved) {
  auto backend = make_cpu_backend(1);
  auto lm = load_model(specserve::testing::default_model_path(), *backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  const auto dir = temp_dir("interrupt");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"One, two, three,\"}\n";
  const auto out = dir / "out";
  std::filesystem::create_directories(out);
  // A process that is gone: a child that exited and was reaped.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  // And one killed but not reaped yet (a zombie: its parent has not waited for it).
  const pid_t zombie = ::fork();
  ASSERT_GE(zombie, 0);
  if (zombie == 0) ::_exit(0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(zombie), &info, WEXITED | WNOWAIT), 0);  // exited, left unreaped
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string mine = std::string(".dump-hidden.partial-") + host + "-";
  const auto dead = out / (mine + std::to_string(child));
  const auto undead = out / (mine + std::to_string(zombie));
  // The same process id on another host (a shared file system): not ours to judge.
  const auto elsewhere = out / (".dump-hidden.partial-another-host-" + std::to_string(child));
  std::filesystem::create_directories(elsewhere);
  std::filesystem::create_directories(undead);
  const auto live = out / (mine + std::to_string(::getppid()));  // the test runner's parent: alive
  std::filesystem::create_directories(dead);
  std::ofstream(dead / "hidden.npy") << "partial";
  std::filesystem::create_directories(live);

  std::atomic<bool> stop{false};
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = out.string();
  o.max_new_tokens = 64;
  o.write_weights = false;
  o.stop = &stop;
  int32_t calls = 0;
  auto r = dump_hidden(*lm, o, [&](const std::string&, bool) {
    ++calls;
    stop.store(true);  // as the handler does on the first signal
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().to_string();
  EXPECT_NE(r.status().message().find("interrupted"), std::string::npos) << r.status().message();
  EXPECT_GT(calls, 0);
  EXPECT_FALSE(std::filesystem::exists(out / (mine + std::to_string(::getpid()))));
  EXPECT_TRUE(std::filesystem::exists(elsewhere)) << "another host's partial dump is left alone";
  EXPECT_FALSE(std::filesystem::exists(dead)) << "a gone process's partial dump is removed";
  EXPECT_FALSE(std::filesystem::exists(undead)) << "a zombie's partial dump is removed";
  ::waitpid(zombie, nullptr, 0);
  EXPECT_TRUE(std::filesystem::exists(live)) << "a live process's partial dump is its own";
  EXPECT_FALSE(std::filesystem::exists(out / "index.json"));
  EXPECT_TRUE(std::filesystem::exists(out)) << "--out existed before: it stays";

  // Not interrupted: the same dump completes.
  stop.store(false);
  o.stop = nullptr;
  auto ok = dump_hidden(*lm, o);
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(out / "index.json"));
  std::filesystem::remove_all(dir);
}

// A fresh-user trial: --out a symbolic link to a missing directory was refused with "File
// exists", and the failed dump removed the link as if it had created it.
TEST(DumpHidden, AnOutThatLinksToNothingIsRefusedAndTheLinkKept) {
  const auto dir = temp_dir("dangling");
  std::ofstream(dir / "p.jsonl") << "{\"prompt\": \"Hello\"}\n";
  std::filesystem::create_symlink(dir / "nowhere", dir / "out");
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  Status st = check_dump_options(o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("symbolic link to a missing directory"), std::string::npos) << st.message();
  o.out_dir = (dir / "out" / "sub").string();  // under it
  EXPECT_FALSE(check_dump_options(o).ok());
  // The dump itself: refused, and the link is not removed as if the dump had created it.
  auto backend = make_cpu_backend(1);
  auto lm = load_model(specserve::testing::default_model_path(), *backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  o.out_dir = (dir / "out").string();
  auto r = dump_hidden(*lm, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("symbolic link to a missing directory"), std::string::npos) << r.status().message();
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "out"));
  std::filesystem::remove_all(dir);
}

TEST(DumpHidden, RealModelDumpMatchesOutputHead) {
  auto backend = make_cpu_backend(1);
  auto lm = load_model(specserve::testing::default_model_path(), *backend, /*quiet=*/true);
  ASSERT_TRUE(lm.ok()) << lm.status().to_string();
  const auto dir = temp_dir("real");
  std::ofstream(dir / "p.jsonl")
      << "{\"messages\": [{\"role\": \"user\", \"content\": \"Name three colours.\"}]}\n"
      << "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": "
         "\"What is 12 times 7?\"}]}\n"
      << "{\"prompt\": \"The capital of France is\"}\n";
  DumpHiddenOptions o;
  o.prompts_path = (dir / "p.jsonl").string();
  o.out_dir = (dir / "out").string();
  o.max_new_tokens = 12;
  o.max_num_seqs = 2;      // fewer slots than prompts: continuous batching admits the third later
  auto sum = dump_hidden(*lm, o);
  ASSERT_TRUE(sum.ok()) << sum.status().to_string();
  EXPECT_EQ(sum->num_sequences, 3);
  EXPECT_EQ(sum->num_argmax_mismatches, 0);
  EXPECT_GT(sum->num_generated, 3);
  char fp[32];
  std::snprintf(fp, sizeof fp, "%016llx", static_cast<unsigned long long>(model_fingerprint(*lm->file)));
  EXPECT_EQ(sum->target_fingerprint, fp);

  std::ifstream jf(dir / "out" / "index.json");
  const auto idx = nlohmann::json::parse(jf);
  const int64_t d = lm->model->config().hidden_size, V = lm->model->config().vocab_size;
  EXPECT_EQ(idx["target_fingerprint"], fp);
  EXPECT_EQ(idx["hidden_size"], d);
  const int64_t N = idx["num_positions"];
  ASSERT_EQ(idx["sequences"].size(), 3u);
  int64_t off = 0, num_by_length = 0;
  for (const auto& s : idx["sequences"]) {
    EXPECT_EQ(s["offset"], off);
    // Every generated token is recorded but the last of a sequence that reached max_new_tokens
    // (its hidden state is never computed; see dump_hidden_lib.h).
    const int64_t len = s["length"], pl = s["prompt_length"], gen = s["generated"];
    if (s["finish"] == "length") {
      ++num_by_length;
      EXPECT_EQ(gen, 12);
      EXPECT_EQ(len, pl + gen - 1) << s.dump();
    } else {
      EXPECT_EQ(s["finish"], "stop");
      EXPECT_EQ(len, pl + gen) << s.dump();
    }
    off += len;
  }
  EXPECT_EQ(off, N);
  EXPECT_GE(num_by_length, 1) << "premise: a sequence reaches max_new_tokens";
  EXPECT_LT(num_by_length, 3) << "premise: a sequence ends on EOS (\"12 times 7\" does, after 10 tokens)";

  std::vector<int64_t> shape;
  const auto hidden = load<uint16_t>((dir / "out" / "hidden.npy").string(), "<f2", &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{N, d}));
  const auto tokens = load<int32_t>((dir / "out" / "tokens.npy").string(), "<i4", &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{N}));
  const auto argmax = load<int32_t>((dir / "out" / "argmax.npy").string(), "<i4", &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{N}));
  // After EOS the last position is recorded too, labelled with the end-of-generation token.
  for (const auto& s : idx["sequences"]) {
    if (s["finish"] != "stop") continue;
    const int32_t last = argmax[s["offset"].get<int64_t>() + s["length"].get<int64_t>() - 1];
    EXPECT_TRUE(lm->tokenizer->eog_ids().count(last)) << "last argmax " << last << " of " << s.dump();
  }
  const auto head = load<float>((dir / "out" / "head.npy").string(), "<f4", &shape);
  ASSERT_EQ(shape, (std::vector<int64_t>{V, d}));
  const GgufTensorInfo* out_t = lm->file->find_tensor(lm->model->config().tied_output ? "token_embd.weight" : "output.weight");
  ASSERT_NE(out_t, nullptr);
  auto ref = dequantize_tensor(*out_t);
  ASSERT_TRUE(ref.ok());
  ASSERT_EQ(ref->size(), head.size());
  EXPECT_EQ(std::memcmp(ref->data(), head.data(), head.size() * 4), 0);

  // Recorded during generation (batched with other sequences, prefill then one row per step)
  // == one teacher-forced forward pass over each sequence alone: hidden rows and the prompt
  // rows' argmax.
  {
    Transformer& model = *lm->model;
    auto kv = model.create_kv(64, 16);
    ASSERT_TRUE(kv.ok()) << kv.status().to_string();
    for (const auto& s : idx["sequences"]) {
      const int64_t o0 = s["offset"], len = s["length"], pl = s["prompt_length"];
      ForwardBatch batch;
      batch.return_hidden = true;
      SequenceInput in;
      in.tokens.assign(tokens.begin() + o0, tokens.begin() + o0 + len);
      for (int32_t b = 0; b < (len + 15) / 16; ++b) in.block_table.push_back(b);
      for (int32_t r = 0; r < len; ++r) in.hidden_rows.push_back(r);
      for (int32_t r = 0; r < pl; ++r) in.logit_rows.push_back(r);
      batch.seqs.push_back(std::move(in));
      ForwardOutput fo;
      ASSERT_TRUE(model.forward(batch, **kv, &fo).ok());
      for (int32_t r = 0; r < len; ++r) {
        const float* h = fo.hidden_row(0, r);
        for (int64_t c = 0; c < d; ++c)
          ASSERT_EQ(hidden[(o0 + r) * d + c], float_to_half(h[c])) << "position " << r << " of the sequence at " << o0;
      }
      for (int32_t r = 0; r < pl; ++r) {
        const float* lg = fo.row(0, r);
        EXPECT_EQ(argmax[o0 + r], std::max_element(lg, lg + V) - lg) << "prompt row " << r;
      }
    }
  }

  // Greedy continuation == argmax, and hidden (float16) x head reproduces the
  // logits' argmax (rows where the top two are closer than the float16 rounding may differ).
  int64_t checked = 0, agree = 0;
  for (const auto& s : idx["sequences"]) {
    const int64_t o0 = s["offset"], len = s["length"], pl = s["prompt_length"];
    for (int64_t p = o0 + pl - 1; p + 1 < o0 + len; ++p) EXPECT_EQ(argmax[p], tokens[p + 1]) << "position " << p;
    for (int64_t p = o0; p < o0 + len; ++p) {
      if ((p - o0) % 3 != 0 && p + 1 != o0 + len) continue;  // a third of the rows and each last one: keeps it fast
      std::vector<float> h(d);
      for (int64_t c = 0; c < d; ++c) h[c] = half_to_float(hidden[p * d + c]);
      float best = -1e30f, at_stored = 0;
      int32_t best_id = -1;
      for (int64_t v = 0; v < V; ++v) {
        float acc = 0;
        for (int64_t c = 0; c < d; ++c) acc += head[v * d + c] * h[c];
        if (acc > best) best = acc, best_id = static_cast<int32_t>(v);
        if (v == argmax[p]) at_stored = acc;
      }
      ++checked;
      agree += best_id == argmax[p];
      EXPECT_GE(at_stored, best - 0.05f * std::max(1.0f, std::abs(best))) << "position " << p;
    }
  }
  EXPECT_GE(checked, N / 3);
  EXPECT_GE(agree, checked * 95 / 100) << agree << "/" << checked;

  // check_every 1 computes every continuation row's logits: the same files, more rows checked.
  DumpHiddenOptions all = o;
  all.out_dir = (dir / "all").string();
  all.check_every = 1;
  all.write_weights = false;
  auto sum_all = dump_hidden(*lm, all);
  ASSERT_TRUE(sum_all.ok()) << sum_all.status().to_string();
  EXPECT_EQ(sum_all->num_argmax_mismatches, 0);
  // Every continuation row: the last prompt row and each recorded generated token's.
  EXPECT_EQ(sum_all->num_argmax_checked, sum_all->num_generated + sum_all->num_sequences);
  EXPECT_LT(sum->num_argmax_checked, sum_all->num_argmax_checked);
  EXPECT_GE(sum->num_argmax_checked, 3);  // at least the first continuation row of each sequence
  EXPECT_EQ(load<int32_t>((dir / "all" / "argmax.npy").string(), "<i4", &shape), argmax);
  EXPECT_EQ(load<uint16_t>((dir / "all" / "hidden.npy").string(), "<f2", &shape), hidden);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace specserve::cli
