// Bad input the CLI refuses up front, through the real binary: a head file where the target
// goes (generate, serve), a head that does not fit its method or target (serve: before the HTTP
// banner), `up --dry-run` listing every problem of a topology (exit 2); and --help showing the
// defaults of the flags that have one.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cpu/matmul.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

using CmdResult = specserve::testing::CliResult;

// `timeout_s` > 0: killed after that long (coreutils timeout: exit code 124).
// `env`: "NAME=VALUE ..." put before the command (the shell sets them for it alone).
CmdResult run(const std::string& args, int timeout_s = 0, const std::string& env = "") {
  return specserve::testing::run_specserve(args, timeout_s, env);
}

std::string head_path(const char* method) {
  return std::string(SPECSERVE_SOURCE_DIR) + "/models/heads/" + method + "-smollm2-135m.gguf";
}

using specserve::testing::temp_dir;

// The help line of `flag` (the line that names it first).
std::string help_line(const std::string& help, const std::string& flag) {
  const size_t at = help.find(flag + " ");
  if (at == std::string::npos) return "";
  const size_t begin = help.rfind('\n', at) + 1;
  return help.substr(begin, help.find('\n', at) - begin);
}

// dir/bad.yaml: a topology whose speculative entry has two problems (an EAGLE head for method
// medusa, a tree that does not parse); the head on `actor_port` and actor_port + 1, one target
// shard on `device`. Returns its path.
std::string write_bad_topology(const std::string& dir, int actor_port, const std::string& device) {
  const std::string yaml = dir + "/bad.yaml";
  std::ofstream(yaml) << "cluster: {name: bad, token_file: " << dir << "/token}\n"
                      << "head: {host: 127.0.0.1, actor_port: " << actor_port << ", http_port: " << actor_port + 1 << "}\n"
                      << "models:\n"
                      << "  target: {path: " << SPECSERVE_SOURCE_DIR << "/models/SmolLM2-135M-Instruct.Q4_1.gguf}\n"
                      << "  speculative: {method: medusa, model: " << head_path("eagle")
                      << ", num_speculative_tokens: 4, speculative_token_tree: \"[(0,), (0, 0\"}\n"
                      << "nodes:\n"
                      << "  - {name: n0, devices: [" << device << "], workers: [{role: target_shard, device: " << device << "}]}\n";
  return yaml;
}

TEST(CliChecks, HeadFileAsModelSaysWhereItGoes) {
  if (!fs::exists(head_path("medusa"))) GTEST_SKIP() << "no " << head_path("medusa");
  const CmdResult g = run("generate --model " + head_path("medusa") + " --prompt hi --max-tokens 1");
  EXPECT_EQ(g.exit_code, 2) << g.out;
  for (const std::string& w : {"--model " + head_path("medusa"), std::string("this is a medusa head"),
                               std::string("general.architecture=medusa"), std::string("--speculative-config")}) {
    EXPECT_NE(g.out.find(w), std::string::npos) << "'" << w << "' in " << g.out;
  }
  EXPECT_EQ(g.out.find("tokenizer.ggml.model"), std::string::npos) << g.out;
  const std::string dir = temp_dir("specserve_cli_model_");
  const CmdResult s = run("serve --model " + head_path("medusa") + " --port 0 --actor-port 0 --token-file " + dir + "/token");
  fs::remove_all(dir);
  EXPECT_EQ(s.exit_code, 2) << s.out;
  EXPECT_NE(s.out.find("this is a medusa head"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("http://"), std::string::npos) << "the HTTP banner came before the error:\n" << s.out;
}

TEST(CliChecks, ServeWithAHeadOfAnotherMethodFailsBeforeTheBanner) {
  if (!fs::exists(head_path("eagle"))) GTEST_SKIP() << "no " << head_path("eagle");
  const std::string dir = temp_dir("specserve_cli_head_");
  const CmdResult s = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --speculative-config '{\"method\": \"medusa\", \"model\": \"" +
                    head_path("eagle") + "\", \"num_speculative_tokens\": 4, \"speculative_token_tree\": \"[(0,), (0, 0\"}'");
  fs::remove_all(dir);
  EXPECT_EQ(s.exit_code, 2) << s.out;
  // Both problems, each naming its source: the head's architecture and the tree.
  for (const std::string& w : {"--speculative-config \"model\" " + head_path("eagle"), std::string("general.architecture = 'eagle'"),
                               std::string("expected 'medusa'"), std::string("--speculative-config speculative_token_tree")}) {
    EXPECT_NE(s.out.find(w), std::string::npos) << "'" << w << "' in " << s.out;
  }
  EXPECT_EQ(s.out.find("http://"), std::string::npos) << "the HTTP banner came before the error:\n" << s.out;
}

TEST(CliChecks, UpDryRunListsEveryProblemAndExitsTwo) {
  const std::string dir = temp_dir("specserve_cli_up_");
  const std::string yaml = write_bad_topology(dir, 47391, "cuda:63");
  const CmdResult r = run("up --dry-run " + yaml);
  fs::remove_all(dir);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  for (const char* w : {"nodes[0].workers[0].device", "cuda:63", "models.speculative.speculative_token_tree",
                        "models.speculative.model", "problem(s)"}) {
    EXPECT_NE(r.out.find(w), std::string::npos) << "'" << w << "' in " << r.out;
  }
}

TEST(CliChecks, UpWithoutDryRunRefusesTheSameProblemsBeforeStartingAnything) {
  const std::string dir = temp_dir("specserve_cli_up_run_");
  const std::string yaml = write_bad_topology(dir, 47393, "cpu");
  // A timeout: were the checks skipped, the cluster would start and serve until stopped.
  const CmdResult r = run("up " + yaml, 60);
  const bool token_written = fs::exists(dir + "/token");
  fs::remove_all(dir);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  for (const char* w : {"specserve up: ", "models.speculative.speculative_token_tree", "models.speculative.model",
                        "nothing was started"}) {
    EXPECT_NE(r.out.find(w), std::string::npos) << "'" << w << "' in " << r.out;
  }
  EXPECT_FALSE(token_written) << "the cluster token was created before the checks failed";
}

TEST(CliChecks, GenerateExitsTwoForASpeculativeConfigNamingAMissingFile) {
  const CmdResult g = run("generate --prompt hi --max-tokens 1 --speculative-config "
                          "'{\"method\": \"eagle\", \"model\": \"/nonexistent/eagle.gguf\", \"num_speculative_tokens\": 2}'");
  EXPECT_EQ(g.exit_code, 2) << g.out;
  EXPECT_NE(g.out.find("/nonexistent/eagle.gguf"), std::string::npos) << g.out;
}

TEST(CliChecks, GenerateChecksTheSpeculativeFilesBeforeLoadingTheTarget) {
  if (!fs::exists(head_path("eagle"))) GTEST_SKIP() << "no " << head_path("eagle");
  // The target does not exist: had generate loaded it first, the error would be about it.
  const CmdResult g = run("generate --model /nonexistent/target.gguf --prompt hi --max-tokens 1 --speculative-config "
                          "'{\"method\": \"medusa\", \"model\": \"" + head_path("eagle") +
                          "\", \"num_speculative_tokens\": 4, \"speculative_token_tree\": \"[(0,), (0, 0\"}'");
  EXPECT_EQ(g.exit_code, 2) << g.out;
  for (const std::string w : {std::string("--speculative-config \"model\" ") + head_path("eagle"), std::string("speculative_token_tree")}) {
    EXPECT_NE(g.out.find(w), std::string::npos) << "'" << w << "' in " << g.out;
  }
  EXPECT_EQ(g.out.find("/nonexistent/target.gguf"), std::string::npos) << g.out;
  // The k conflict is found by the flag parser, also before the load.
  const CmdResult k = run("generate --model /nonexistent/target.gguf --prompt hi --num-speculative-tokens 3 --speculative-config "
                          "'{\"method\": \"ngram\", \"num_speculative_tokens\": 5}'");
  EXPECT_EQ(k.exit_code, 2) << k.out;
  EXPECT_NE(k.out.find("num_speculative_tokens"), std::string::npos) << k.out;
  EXPECT_EQ(k.out.find("/nonexistent/target.gguf"), std::string::npos) << k.out;
}

TEST(CliChecks, CpuKernelVariablesAreReadInAnyCaseAndLogged) {
  // Trimmed and case-insensitive; the log line says where the choice came from. The child
  // processes inherit this process's environment.
  ::setenv("SPECSERVE_CPU_MATMUL", " AVX2 ", 1);
  const CmdResult g = run("generate --prompt hi --max-tokens 1 --temperature 0");
  // Another value is named in a warning and ignored.
  ::setenv("SPECSERVE_CPU_MATMUL", "avx1024", 1);
  const CmdResult b = run("generate --prompt hi --max-tokens 1 --temperature 0");
  // amx runs where the CPU and kernel allow it, else falls back with a warning that says so.
  ::setenv("SPECSERVE_CPU_MATMUL", "Amx", 1);
  const CmdResult x = run("generate --prompt hi --max-tokens 1 --temperature 0");
  // vnni likewise (int8 x against Q4_1 / Q8_0 weights, where CPUID has avx512vnni).
  ::setenv("SPECSERVE_CPU_MATMUL", "VNNI", 1);
  const CmdResult vn = run("generate --prompt hi --max-tokens 1 --temperature 0");
  // ... but with every weight dequantised at load it has nothing to multiply: avx512, said so.
  ::setenv("SPECSERVE_CPU_WEIGHTS", "f32", 1);
  const CmdResult vf = run("generate --prompt hi --max-tokens 1 --temperature 0");
  ::unsetenv("SPECSERVE_CPU_WEIGHTS");
  ::unsetenv("SPECSERVE_CPU_MATMUL");
  // The attention kernel choice likewise (both kernels give the same bits).
  ::setenv("SPECSERVE_CPU_ATTENTION", " RowWise\t", 1);
  const CmdResult a = run("generate --prompt hi --max-tokens 1 --temperature 0");
  ::setenv("SPECSERVE_CPU_ATTENTION", "flash", 1);
  const CmdResult af = run("generate --prompt hi --max-tokens 1 --temperature 0");
  ::unsetenv("SPECSERVE_CPU_ATTENTION");
  // And the weight storage.
  ::setenv("SPECSERVE_CPU_WEIGHTS", " F32 ", 1);
  const CmdResult w = run("generate --prompt hi --max-tokens 1 --temperature 0");
  ::setenv("SPECSERVE_CPU_WEIGHTS", "q4", 1);
  const CmdResult wq = run("generate --prompt hi --max-tokens 1 --temperature 0");
  ::unsetenv("SPECSERVE_CPU_WEIGHTS");
  const CmdResult d = run("generate --prompt hi --max-tokens 1 --temperature 0");
  EXPECT_EQ(w.exit_code, 0) << w.out;
  EXPECT_NE(w.out.find("Q4_1/Q8_0 weights dequantised at load"), std::string::npos) << w.out;
  EXPECT_EQ(wq.exit_code, 0) << wq.out;
  EXPECT_NE(wq.out.find("SPECSERVE_CPU_WEIGHTS = 'q4' is not one of blocks, f32"), std::string::npos) << wq.out;
  EXPECT_NE(wq.out.find("Q4_1/Q8_0 weights kept as blocks"), std::string::npos) << wq.out;
  EXPECT_EQ(d.exit_code, 0) << d.out;
  EXPECT_NE(d.out.find("Q4_1/Q8_0 weights kept as blocks"), std::string::npos) << d.out;
  EXPECT_EQ(a.exit_code, 0) << a.out;
  EXPECT_NE(a.out.find("attention rowwise (SPECSERVE_CPU_ATTENTION"), std::string::npos) << a.out;
  EXPECT_EQ(af.exit_code, 0) << af.out;
  EXPECT_NE(af.out.find("SPECSERVE_CPU_ATTENTION = 'flash' is not one of tiled, rowwise"), std::string::npos) << af.out;
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_NE(g.out.find("matmul kernel avx2 (set by SPECSERVE_CPU_MATMUL=avx2)"), std::string::npos) << g.out;
  EXPECT_EQ(b.exit_code, 0) << b.out;
  EXPECT_NE(b.out.find("SPECSERVE_CPU_MATMUL = 'avx1024' is not one of avx2, avx512, amx"), std::string::npos) << b.out;
  EXPECT_EQ(x.exit_code, 0) << x.out;
  const MatmulIsa saved = matmul_isa();
  if (set_matmul_isa(MatmulIsa::kAmx)) {  // can this process run it?
    set_matmul_isa(saved);
    EXPECT_NE(x.out.find("matmul kernel amx (set by SPECSERVE_CPU_MATMUL=amx)"), std::string::npos) << x.out;
  } else {
    EXPECT_NE(x.out.find("SPECSERVE_CPU_MATMUL = 'amx': "), std::string::npos) << x.out;
    EXPECT_NE(x.out.find("; using avx"), std::string::npos) << x.out;
  }
  EXPECT_EQ(vn.exit_code, 0) << vn.out;
  EXPECT_EQ(vf.exit_code, 0) << vf.out;
  if (vnni_usable()) {
    EXPECT_NE(vn.out.find("matmul kernel vnni (set by SPECSERVE_CPU_MATMUL=vnni)"), std::string::npos) << vn.out;
    EXPECT_NE(vf.out.find("matmul kernel avx512 (SPECSERVE_CPU_MATMUL=vnni, but SPECSERVE_CPU_WEIGHTS=f32 leaves it no Q4_1/Q8_0 blocks)"),
              std::string::npos) << vf.out;
  } else {
    EXPECT_NE(vn.out.find("SPECSERVE_CPU_MATMUL = 'vnni': this CPU lacks avx512vnni"), std::string::npos) << vn.out;
    EXPECT_NE(vn.out.find("; using avx"), std::string::npos) << vn.out;
  }
}

// vLLM's --dtype: float32 wins over SPECSERVE_CPU_MATMUL=amx, bfloat16 runs the AMX kernel or
// is refused (exit 2) saying why, float16 has no CPU kernel; serve and `up --dry-run` refuse the
// same before anything starts.
TEST(CliChecks, DtypeChoosesTheCpuKernelOrIsRefusedSayingWhy) {
  const std::string gen = "generate --prompt hi --max-tokens 1 --temperature 0 --dtype ";
  ::setenv("SPECSERVE_CPU_MATMUL", "amx", 1);
  const CmdResult f32 = run(gen + "float32");
  ::unsetenv("SPECSERVE_CPU_MATMUL");
  const CmdResult bf16 = run(gen + "bfloat16");
  const CmdResult half = run(gen + "half");
  const CmdResult typo = run(gen + "bf16");
  const std::string dir = temp_dir("specserve_cli_dtype_");
  const CmdResult serve = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --dtype float16", 60);
  const std::string yaml = dir + "/f16.yaml";
  std::ofstream(yaml) << "cluster: {name: f16, token_file: " << dir << "/token}\n"
                      << "head: {host: 127.0.0.1, actor_port: 7491, http_port: 7492}\n"
                      << "models:\n"
                      << "  target: {path: " << SPECSERVE_SOURCE_DIR << "/models/SmolLM2-135M-Instruct.Q4_1.gguf, dtype: float16}\n"
                      << "nodes:\n"
                      << "  - {name: n0, devices: [cpu], workers: [{role: target_shard, device: cpu}]}\n";
  const CmdResult up = run("up " + yaml + " --dry-run", 60);
  fs::remove_all(dir);

  const bool has512 = __builtin_cpu_supports("avx512f");
  EXPECT_EQ(f32.exit_code, 0) << f32.out;
  EXPECT_NE(f32.out.find(std::string("matmul kernel ") + (has512 ? "avx512" : "avx2") + " (set by --dtype float32)"),
            std::string::npos) << f32.out;
  const MatmulIsa saved = matmul_isa();
  if (set_matmul_isa(MatmulIsa::kAmx)) {  // can this process run it?
    set_matmul_isa(saved);
    EXPECT_EQ(bf16.exit_code, 0) << bf16.out;
    EXPECT_NE(bf16.out.find("matmul kernel amx (set by --dtype bfloat16)"), std::string::npos) << bf16.out;
  } else {
    EXPECT_EQ(bf16.exit_code, 2) << bf16.out;
    EXPECT_NE(bf16.out.find("--dtype = 'bfloat16': the CPU backend's bf16 matmul needs Intel AMX"), std::string::npos)
        << bf16.out;
  }
  EXPECT_EQ(half.exit_code, 2) << half.out;
  EXPECT_NE(half.out.find("--dtype = 'float16': the CPU backend has no float16 kernel"), std::string::npos) << half.out;
  EXPECT_EQ(typo.exit_code, 2) << typo.out;
  EXPECT_NE(typo.out.find("--dtype: 'bf16' is not one of auto, float32, float, bfloat16, float16, half"), std::string::npos)
      << typo.out;
  EXPECT_EQ(serve.exit_code, 2) << serve.out;
  EXPECT_NE(serve.out.find("--dtype = 'float16': the CPU backend has no float16 kernel"), std::string::npos) << serve.out;
  EXPECT_EQ(serve.out.find("http://"), std::string::npos) << "the HTTP banner came before the error:\n" << serve.out;
  EXPECT_EQ(up.exit_code, 2) << up.out;
  EXPECT_NE(up.out.find("f16.yaml:4:"), std::string::npos) << up.out;
  EXPECT_NE(up.out.find("models.target.dtype = 'float16': the CPU backend has no float16 kernel"), std::string::npos)
      << up.out;
}

TEST(CliChecks, GenerateWithNoTokenSaysTimeToFirstTokenIsNotApplicable) {
  // The default model's first greedy token for this raw prompt ends the sequence (found by a
  // fresh-user try; the report said "-1000.0 ms").
  const CmdResult g = run("generate --prompt 'Explain why the sky is blue in two sentences.' --max-tokens 5 --temperature 0");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  ASSERT_NE(g.out.find("generated tokens: 0"), std::string::npos) << "the model now generates here; pick another prompt:\n" << g.out;
  EXPECT_NE(g.out.find("time to first token: n/a"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("-1000"), std::string::npos) << g.out;
}

// --min-tokens (vLLM's min_tokens) on the real model: the prompt above ends on EOS at once; with
// --min-tokens 3 EOS is held off for three tokens. Above --max-tokens it is refused before
// loading; `client` refuses it and an empty --prompt / --chat (as generate does) before connecting.
TEST(CliChecks, MinTokensHoldsEosOffAndIsCheckedAgainstMaxTokens) {
  const CmdResult g = run("generate --prompt 'Explain why the sky is blue in two sentences.' --max-tokens 5 --min-tokens 3 --temperature 0");
  EXPECT_EQ(g.exit_code, 0) << g.out;
  EXPECT_EQ(g.out.find("generated tokens: 0"), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("generated tokens: 1 "), std::string::npos) << g.out;
  EXPECT_EQ(g.out.find("generated tokens: 2 "), std::string::npos) << g.out;
  const CmdResult bad = run("generate --prompt hi --max-tokens 4 --min-tokens 5");
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--min-tokens = 5: must be <= --max-tokens = 4"), std::string::npos) << bad.out;
  const CmdResult client = run("client --prompt hi --connect 127.0.0.1:1 --min-tokens 200", 60);
  EXPECT_EQ(client.exit_code, 2) << client.out;
  EXPECT_NE(client.out.find("--min-tokens = 200: must be <= --max-tokens = 128"), std::string::npos) << client.out;
  for (const char* flag : {"--chat", "--prompt"}) {
    const CmdResult empty = run(std::string("client ") + flag + " '' --connect 127.0.0.1:1", 60);
    EXPECT_EQ(empty.exit_code, 2) << empty.out;
    EXPECT_NE(empty.out.find(std::string(flag) + " is empty"), std::string::npos) << empty.out;
  }
}

TEST(CliChecks, ServeRefusesAKvCacheSmallerThanOneSequenceBeforeTheBanner) {
  const std::string dir = temp_dir("specserve_cli_kv_");
  const CmdResult s = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --kv-cache-bytes 2MiB", 60);
  const CmdResult l = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --max-model-len 100000", 60);
  const CmdResult big = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --kv-cache-bytes 99TiB", 60);
  fs::remove_all(dir);
  EXPECT_EQ(s.exit_code, 2) << s.out;
  for (const char* w : {"--kv-cache-bytes", "2097152", "max_model_len 8192", "--max-model-len to at most 32"}) {
    EXPECT_NE(s.out.find(w), std::string::npos) << "'" << w << "' in " << s.out;
  }
  EXPECT_EQ(s.out.find("http://"), std::string::npos) << "the HTTP banner came before the error:\n" << s.out;
  EXPECT_EQ(l.exit_code, 2) << l.out;
  EXPECT_NE(l.out.find("--max-model-len = 100000 exceeds the model's context length 8192"), std::string::npos) << l.out;
  EXPECT_EQ(big.exit_code, 2) << big.out;
  EXPECT_NE(big.out.find("--kv-cache-bytes: scheduler.kv_cache_bytes = 108851651149824 is more than this machine's memory"),
            std::string::npos) << big.out;
  EXPECT_EQ(big.out.find("http://"), std::string::npos) << big.out;
}

TEST(CliChecks, ServeRefusesABatchBudgetBelowItsSeqsAndOnePortForBothBeforeLoading) {
  const std::string dir = temp_dir("specserve_cli_sched_");
  // 30 s bounds a regression that loads the model (and would then serve): the refusals take ms.
  const CmdResult b = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --max-num-seqs 8 --max-num-batched-tokens 4", 30);
  const CmdResult p = run("serve --port 18765 --actor-port 18765 --token-file " + dir + "/token", 30);
  // --no-http: nothing listens on --port (default 8000), so --actor-port 8000 is no clash; the
  // run goes on to the next check (a KV cache too small), still before loading.
  const CmdResult n = run("serve --no-http --actor-port 8000 --token-file " + dir + "/token --kv-cache-bytes 2MiB", 30);
  fs::remove_all(dir);
  EXPECT_EQ(n.exit_code, 2) << n.out;
  EXPECT_EQ(n.out.find("is also --actor-port"), std::string::npos) << n.out;
  EXPECT_NE(n.out.find("--kv-cache-bytes"), std::string::npos) << n.out;
  EXPECT_EQ(b.exit_code, 2) << b.out;
  EXPECT_NE(b.out.find("--max-num-batched-tokens = 4 is less than --max-num-seqs = 8"), std::string::npos) << b.out;
  EXPECT_EQ(p.exit_code, 2) << p.out;
  EXPECT_NE(p.out.find("--port = 18765 is also --actor-port = 18765"), std::string::npos) << p.out;
  for (const CmdResult* r : {&b, &p}) {
    EXPECT_EQ(r->out.find("loading"), std::string::npos) << "the model loaded before the refusal:\n" << r->out;
    EXPECT_EQ(r->out.find("http://"), std::string::npos) << r->out;
  }
}

// Found by a new user: --threads 100000 crashed inside OpenMP (SIGSEGV) on every command without
// serve's 0..1024 range; a --ready-file that cannot be written was ignored, leaving whoever
// waits for it waiting; a negative --max-model-len was taken as the model's.
TEST(CliChecks, ThreadsReadyFileAndMaxModelLenAreCheckedBeforeLoading) {
  for (const char* cmd : {"generate --prompt x", "bench-model", "bench-spec", "dump-hidden --prompts x.txt --out /tmp/x"}) {
    const CmdResult r = run(std::string(cmd) + " --threads 100000", 30);
    EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.out;
    EXPECT_NE(r.out.find("--threads"), std::string::npos) << cmd << "\n" << r.out;
  }
  const std::string dir = temp_dir("specserve_cli_ready_");
  const CmdResult s = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --ready-file " + dir + "/no/such/dir/ready", 30);
  EXPECT_EQ(s.exit_code, 2) << s.out;
  EXPECT_NE(s.out.find("--ready-file " + dir + "/no/such/dir/ready"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("loading"), std::string::npos) << "the model loaded before the refusal:\n" << s.out;
  const CmdResult m = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --max-model-len -1", 30);
  EXPECT_EQ(m.exit_code, 2) << m.out;
  EXPECT_NE(m.out.find("--max-model-len"), std::string::npos) << m.out;
  const CmdResult one = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token --max-model-len 1", 30);
  EXPECT_EQ(one.exit_code, 2) << one.out;
  EXPECT_NE(one.out.find("leaves no room for a completion"), std::string::npos) << one.out;
  fs::remove_all(dir);
}

TEST(CliChecks, UsageErrorsExitTwoAndAMistypedCommandIsNamed) {
  const CmdResult bogus = run("bogus");
  EXPECT_EQ(bogus.exit_code, 2) << bogus.out;
  EXPECT_NE(bogus.out.find("unknown command 'bogus'"), std::string::npos) << bogus.out;
  EXPECT_NE(bogus.out.find("generate"), std::string::npos) << bogus.out;
  const CmdResult range = run("generate --prompt x --max-tokens 0");
  EXPECT_EQ(range.exit_code, 2) << range.out;
  EXPECT_NE(range.out.find("--max-tokens"), std::string::npos) << range.out;
  EXPECT_EQ(run("generate --help").exit_code, 0);
  const CmdResult version = run("--version");
  EXPECT_EQ(version.exit_code, 0) << version.out;
  EXPECT_EQ(version.out.rfind("specserve 0.", 0), 0u) << version.out;
}

// `client` / `status`: a malformed --connect is bad input (exit 2, as every other usage error)
// — it used to exit 1 like a head that cannot be reached, which still does.
TEST(CliChecks, ClientAndStatusExitTwoForAMalformedEndpointAndOneForAnUnreachableHead) {
  const std::string dir = temp_dir("client_exit");
  const std::string token = dir + "/token";
  std::ofstream(token) << "0123456789abcdef\n";
  fs::permissions(token, fs::perms::owner_read | fs::perms::owner_write);
  for (const char* cmd : {"client --prompt hi", "status"}) {
    for (const char* ep : {"nonsense", "127.0.0.1:99999"}) {
      const CmdResult r = run(std::string(cmd) + " --connect " + ep + " --token-file " + token, 60);
      EXPECT_EQ(r.exit_code, 2) << cmd << " " << ep << "\n" << r.out;
      EXPECT_NE(r.out.find("--connect"), std::string::npos) << r.out;
    }
    const CmdResult down = run(std::string(cmd) + " --connect 127.0.0.1:1 --token-file " + token, 60);
    EXPECT_EQ(down.exit_code, 1) << cmd << "\n" << down.out;
    EXPECT_NE(down.out.find("is the cluster running?"), std::string::npos) << down.out;
  }
  fs::remove_all(dir);
}

// Bug: CLI11 reads an int64 flag with strtoll and ignores ERANGE, so `client --seed
// 99999999999999999999` sent the seed 9223372036854775807 (CLI::Range checked the clamped value)
// and `bench --seed` took it too. Refused naming the flag and the value, before connecting.
TEST(CliChecks, ClientAndBenchRefuseAnOutOfRangeSeed) {
  for (const char* cmd : {"client --prompt hi --connect 127.0.0.1:1", "bench --base-url http://127.0.0.1:1 --num-prompts 1"}) {
    for (const char* seed : {"99999999999999999999", "-1"}) {
      const CmdResult r = run(std::string(cmd) + " --seed " + seed, 60);
      EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.out;
      EXPECT_NE(r.out.find(std::string("--seed: ") + seed + ": must be an integer in [0, 9223372036854775807]"),
                std::string::npos)
          << cmd << "\n" << r.out;
    }
  }
}

// `serve --api-key "$KEY"` with KEY unset served with no key at all (the banner only left out
// "API key required"); an empty --served-model-name fell back to the default. Both exit 2 now.
TEST(CliChecks, ServeRefusesAnEmptyApiKeyOrModelName) {
  for (const char* flag : {"--api-key", "--served-model-name"}) {
    const CmdResult r = run(std::string("serve --no-http --port 0 --actor-port 0 ") + flag + " ''", 60);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.out;
    EXPECT_NE(r.out.find(std::string(flag) + ": an empty"), std::string::npos) << r.out;
  }
  // The same for an empty SPECSERVE_API_KEY (the flag's default): refused before the HTTP port
  // listens, not served without a key.
  const std::string dir = temp_dir("specserve_cli_envkey_");
  const CmdResult e = run("serve --port 0 --actor-port 0 --token-file " + dir + "/token", 90, "SPECSERVE_API_KEY=");
  fs::remove_all(dir);
  EXPECT_EQ(e.exit_code, 2) << e.out;
  EXPECT_NE(e.out.find("SPECSERVE_API_KEY is set but empty"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("http://"), std::string::npos) << "it listened:\n" << e.out;
}

TEST(CliChecks, HelpShowsTheDefaults) {
  const CmdResult g = run("generate --help");
  EXPECT_NE(help_line(g.out, "--max-tokens").find("=128"), std::string::npos) << g.out;
  EXPECT_NE(help_line(g.out, "--temperature").find("=0"), std::string::npos) << g.out;
  EXPECT_NE(help_line(g.out, "--device").find("=cpu"), std::string::npos) << g.out;
  // The example in --speculative-config's help is the real default (EagleOptions::depth).
  EXPECT_NE(g.out.find("\"eagle_depth\": 4"), std::string::npos) << g.out;
  const CmdResult s = run("serve --help");
  EXPECT_NE(help_line(s.out, "--max-num-seqs").find("=64"), std::string::npos) << s.out;
  EXPECT_NE(help_line(s.out, "--max-num-batched-tokens").find("=2048"), std::string::npos) << s.out;
  EXPECT_NE(help_line(s.out, "--kv-cache-bytes").find("=1GiB"), std::string::npos) << s.out;
  EXPECT_NE(help_line(s.out, "--drain-timeout").find("=60"), std::string::npos) << s.out;
  const CmdResult u = run("up --help");
  EXPECT_NE(help_line(u.out, "--drain-timeout").find("=60"), std::string::npos) << u.out;
  // The topology as the first argument or --config: neither is REQUIRED alone (both said so);
  // with neither, up says how to give it (exit 2).
  EXPECT_EQ(u.out.find("REQUIRED"), std::string::npos) << u.out;
  const CmdResult none = run("up --dry-run");
  EXPECT_EQ(none.exit_code, 2) << none.out;
  EXPECT_NE(none.out.find("a topology file is required: `specserve up FILE` or `--config FILE`"), std::string::npos) << none.out;
  // bench-model's --repeats, --prompt-lengths and --decode-tokens said nothing of their defaults
  // (helper review of the CLI). CLI11 puts a long option's text on the next line.
  const CmdResult b = run("bench-model --help");
  for (const auto& [flag, want] : std::vector<std::pair<std::string, std::string>>{
           {"--repeats", "(default 3)"}, {"--prompt-lengths", "default: 256 512"}, {"--decode-tokens", "(default 128)"}}) {
    const size_t at = b.out.find(flag + " ");
    ASSERT_NE(at, std::string::npos) << flag << "\n" << b.out;
    const size_t next = b.out.find("\n  --", at + 1);
    EXPECT_NE(b.out.substr(at, next == std::string::npos ? std::string::npos : next - at).find(want), std::string::npos)
        << flag << "\n" << b.out;
  }
}

}  // namespace
}  // namespace specserve
