// `specserve bench` (the HTTP serving benchmark) against a fake OpenAI-compatible server on
// loopback: what counts as a completed request, latencies with no sample, and the output paths
// checked before the run.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/test_util.h"

namespace specserve {
namespace {

namespace fs = std::filesystem;

using CmdResult = specserve::testing::CliResult;
using specserve::testing::run_specserve;
using specserve::testing::temp_dir;

// A fake OpenAI-compatible server on loopback for `specserve bench`: /good streams two content
// chunks, a finish_reason and data: [DONE]; /cut stops after the first chunk (a server that died,
// a proxy's timeout); /empty finishes with no content at all; /nodone sends no [DONE].
class FakeStreamServer {
 public:
  FakeStreamServer() {
    for (const char* prefix : {"/good", "/cut", "/empty", "/nodone"}) {
      const std::string p = prefix;
      srv_.Get(p + "/v1/models", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(R"({"object": "list", "data": [{"id": "fake", "object": "model"}]})", "application/json");
      });
      srv_.Post(p + "/v1/chat/completions", [p](const httplib::Request&, httplib::Response& res) {
        auto chunk = [](const std::string& delta, const char* finish) {
          nlohmann::json c = {{"object", "chat.completion.chunk"},
                              {"choices", {{{"index", 0}, {"delta", {{"content", delta}}}, {"finish_reason", nullptr}}}}};
          if (finish) c["choices"][0]["finish_reason"] = finish;
          return "data: " + c.dump() + "\n\n";
        };
        std::string body;
        if (p == "/empty") {
          body = chunk("", "stop") + "data: [DONE]\n\n";
        } else {
          body = chunk("Hello", nullptr);
          if (p == "/good") body += chunk(" world", "stop") + "data: [DONE]\n\n";
          if (p == "/nodone") body += chunk(" world", "length");  // a finish_reason, no [DONE]
        }
        res.set_content(body, "text/event-stream");
      });
    }
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    while (!srv_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FakeStreamServer() {
    srv_.stop();
    thread_.join();
  }
  std::string url(const char* prefix) const { return "http://127.0.0.1:" + std::to_string(port_) + prefix; }

 private:
  httplib::Server srv_;
  int port_ = 0;
  std::thread thread_;
};

// Bugs: `bench` counted a stream cut short (no finish_reason, no data: [DONE]) as a successful
// request; a run where no token came printed "Mean TTFT (ms): 0.00"; --output-json in a missing
// directory was found only after the run, and a --plot that could not be drawn exited 0.
TEST(CliChecks, BenchCountsACutStreamAsFailedAndChecksItsOutputsFirst) {
  FakeStreamServer fake;
  const std::string dir = temp_dir("bench_http_checks");
  const std::string prompts = dir + "/p.txt";
  std::ofstream(prompts) << "one\ntwo\n";
  const std::string common = " --dataset " + prompts + " --num-prompts 2 --no-warmup --max-tokens 4";

  const CmdResult good = run_specserve("bench --base-url " + fake.url("/good") + common + " --output-json " + dir + "/g.json", 60);
  EXPECT_EQ(good.exit_code, 0) << good.out;
  EXPECT_NE(good.out.find("Successful requests:                     2"), std::string::npos) << good.out;
  const nlohmann::json g = nlohmann::json::parse(std::ifstream(dir + "/g.json"));
  EXPECT_EQ(g["runs"][0]["completed"], 2) << g.dump();
  EXPECT_TRUE(g["runs"][0]["requests"][0]["ttft_ms"].is_number()) << g.dump();

  const CmdResult cut = run_specserve("bench --base-url " + fake.url("/cut") + common + " --output-json " + dir + "/c.json", 60);
  EXPECT_EQ(cut.exit_code, 1) << cut.out;  // no request completed
  EXPECT_NE(cut.out.find("Successful requests:                     0"), std::string::npos) << cut.out;
  EXPECT_NE(cut.out.find("Failed requests:                         2"), std::string::npos) << cut.out;
  EXPECT_NE(cut.out.find("ended with no finish_reason and no data: [DONE] (cut short)"), std::string::npos) << cut.out;
  EXPECT_NE(cut.out.find("Mean TTFT (ms):                          n/a"), std::string::npos) << cut.out;

  // A finish_reason without data: [DONE] (older llama.cpp servers): complete.
  const CmdResult nodone = run_specserve("bench --base-url " + fake.url("/nodone") + common, 60);
  EXPECT_EQ(nodone.exit_code, 0) << nodone.out;
  EXPECT_NE(nodone.out.find("Successful requests:                     2"), std::string::npos) << nodone.out;

  // Completed with no content: no TTFT sample, "n/a" and a null per-request ttft_ms.
  const CmdResult empty = run_specserve("bench --base-url " + fake.url("/empty") + common + " --output-json " + dir + "/e.json", 60);
  EXPECT_EQ(empty.exit_code, 0) << empty.out;
  EXPECT_NE(empty.out.find("Mean TTFT (ms):                          n/a"), std::string::npos) << empty.out;
  const nlohmann::json e = nlohmann::json::parse(std::ifstream(dir + "/e.json"));
  EXPECT_TRUE(e["runs"][0]["requests"][0]["ttft_ms"].is_null()) << e.dump();

  // Output paths that cannot be written: refused before any request, naming the flag.
  for (const char* flag : {"--output-json", "--plot"}) {
    const CmdResult bad = run_specserve("bench --base-url " + fake.url("/good") + common + " " + flag + " " + dir + "/no/such/x.out", 60);
    EXPECT_EQ(bad.exit_code, 1) << flag << "\n" << bad.out;
    EXPECT_NE(bad.out.find(std::string(flag) + " " + dir + "/no/such/x.out"), std::string::npos) << bad.out;
    EXPECT_EQ(bad.out.find("Serving Benchmark Result"), std::string::npos) << "it ran:\n" << bad.out;
  }
  // --plot with no python that has matplotlib: refused before the run, not skipped after it.
  // (a python3 first on PATH that has no matplotlib; no venv, no SPECSERVE_PYTHON)
  fs::create_directories(dir + "/bin");
  std::ofstream(dir + "/bin/python3") << "#!/bin/sh\nexit 1\n";
  fs::permissions(dir + "/bin/python3", fs::perms::owner_all);
  const CmdResult noplot = run_specserve("bench --base-url " + fake.url("/good") + common + " --plot " + dir + "/p.png", 60,
                               "SPECSERVE_PYTHON= SPECSERVE_CACHE=" + dir + "/nocache PATH=" + dir + "/bin:/usr/bin:/bin");
  EXPECT_EQ(noplot.exit_code, 1) << noplot.out;
  EXPECT_NE(noplot.out.find("--plot " + dir + "/p.png: no python with matplotlib"), std::string::npos) << noplot.out;
  EXPECT_EQ(noplot.out.find("Serving Benchmark Result"), std::string::npos) << "it ran:\n" << noplot.out;
  fs::remove_all(dir);
}

// Comma lists: "1,2" runs two levels; an empty item ("1,,4", "1,", ",4") or an item out of range
// is refused naming the value (exit 2), before any request.
// NOTE: CLI11's delimiter dropped empty items: "1,,4" ran 1 and 4 without a word.
TEST(CliChecks, CommaListFlagsRefuseEmptyItemsNamingTheValue) {
  FakeStreamServer fake;
  const std::string dir = temp_dir("bench_lists");
  const std::string prompts = dir + "/p.txt";
  std::ofstream(prompts) << "one\ntwo\n";
  const std::string common = " --dataset " + prompts + " --num-prompts 2 --no-warmup --max-tokens 4";
  const CmdResult two = run_specserve("bench --base-url " + fake.url("/good") + common + " --max-concurrency 1,2", 60);
  EXPECT_EQ(two.exit_code, 0) << two.out;
  EXPECT_NE(two.out.find("Maximum request concurrency:             1"), std::string::npos) << two.out;
  EXPECT_NE(two.out.find("Maximum request concurrency:             2"), std::string::npos) << two.out;
  // (0x10 and 010: CLI11 read them as 16 and 8, the conversion as 0 and 10)
  for (const char* bad : {"1,,4", "1,", ",4", "1,0", "0x10", "2,010"}) {
    const CmdResult b = run_specserve("bench --base-url " + fake.url("/good") + common + " --max-concurrency " + bad, 60);
    EXPECT_EQ(b.exit_code, 2) << bad << ": " << b.out;
    EXPECT_NE(b.out.find(std::string("--max-concurrency: ") + bad), std::string::npos) << b.out;
    EXPECT_EQ(b.out.find("Serving Benchmark Result"), std::string::npos) << "it ran:\n" << b.out;
  }
  const CmdResult c = run_specserve("bench-actors --mode concurrency --concurrency 2,,4", 60);
  EXPECT_EQ(c.exit_code, 2) << c.out;
  EXPECT_NE(c.out.find("--concurrency: 2,,4: an empty item"), std::string::npos) << c.out;
  const CmdResult p = run_specserve("bench-actors --mode overhead --paths direct,,actor", 60);
  EXPECT_EQ(p.exit_code, 2) << p.out;
  EXPECT_NE(p.out.find("--paths: direct,,actor: an empty item"), std::string::npos) << p.out;
  const CmdResult q = run_specserve("bench-actors --mode overhead --paths direct,nope", 60);
  EXPECT_EQ(q.exit_code, 2) << q.out;
  EXPECT_NE(q.out.find("nope"), std::string::npos) << q.out;
  fs::remove_all(dir);
}

// bench-actors stopped by a signal (SIGTERM from coreutils' timeout) while its network path's
// `specserve up` starts: the cluster goes with it, and the run's folder it keeps is named.
// NOTE: the folder (topology, up.log) was left in /tmp without a word.
TEST(CliChecks, BenchActorsStoppedByASignalNamesTheFolderItKeepsAndStopsItsCluster) {
  // Its own questions (Spec-Bench's lines): a clone need not sit beside ../shared/data.
  const std::string tmp = temp_dir("bench-actors-signal");
  const std::string questions = tmp + "/question.jsonl";
  std::ofstream(questions) << "{\"question_id\": 1, \"category\": \"writing\", \"turns\": [\"Write a story about a robot.\"]}\n"
                           << "{\"question_id\": 2, \"category\": \"qa\", \"turns\": [\"What is the capital of France?\"]}\n";
  const CmdResult r = run_specserve(
      // (enough work that no machine finishes it in 6 s: 2 x 2048 tokens on each path)
      "bench-actors --mode overhead --paths direct network --questions " + questions +
          " --prompts 2 --repeats 1 --max-tokens 2048 --threads 1 --quiet-wait 0",
      /*timeout_s=*/6);
  fs::remove_all(tmp);
  EXPECT_EQ(r.exit_code, 124) << r.out;  // timeout's status: the run was still going
  const std::string key = "interrupted: kept ";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string dir = r.out.substr(at + key.size(), r.out.find(' ', at + key.size()) - (at + key.size()));
  ASSERT_EQ(dir.rfind("/tmp/specserve-bench-actors-", 0), 0u) << dir;
  EXPECT_TRUE(fs::is_directory(dir)) << dir;
  // Its `up` (whose command line names the folder's topology) is gone within its drain timeout.
  bool up_gone = false;
  for (int i = 0; i < 150 && !up_gone; ++i) {
    // ("[/]tmp...": the pattern does not match the shell that runs pgrep)
    up_gone = std::system(("pgrep -f '[/]" + dir.substr(1) + "' > /dev/null").c_str()) != 0;
    if (!up_gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(up_gone) << "a process of " << dir << " is still running";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace specserve
