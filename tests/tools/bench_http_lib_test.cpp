// `specserve bench`'s pure parts: prompt sets, URL parsing, the SSE parser, chunk meaning,
// percentiles (checked against numpy's values) and the summary in vLLM's terms.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tools/cli/bench_http_lib.h"

namespace specserve::cli::bench_http {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / ("bench_http_lib_test_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path.string();
}

TEST(LoadPrompts, SpecBenchJsonlTakesFirstTurnAndCategory) {
  const std::string path = write_temp(
      "q.jsonl",
      "{\"question_id\": 1, \"category\": \"writing\", \"turns\": [\"first\", \"second\"]}\n"
      "\n"
      "{\"category\": \"qa\", \"prompt\": \"a prompt\"}\n"
      "{\"text\": \"just text\"}\n");
  auto p = load_prompts(path);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 3u);
  EXPECT_EQ((*p)[0].prompt, "first");
  EXPECT_EQ((*p)[0].category, "writing");
  EXPECT_EQ((*p)[1].prompt, "a prompt");
  EXPECT_EQ((*p)[1].category, "qa");
  EXPECT_EQ((*p)[2].prompt, "just text");
  EXPECT_EQ((*p)[2].category, "");
  std::filesystem::remove(path);
}

TEST(LoadPrompts, PlainTextOnePromptPerLine) {
  const std::string path = write_temp("p.txt", "Hello there\r\n\n  What is 2+2? {not json}\n");
  auto p = load_prompts(path);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].prompt, "Hello there");
  EXPECT_EQ((*p)[1].prompt, "  What is 2+2? {not json}");
  std::filesystem::remove(path);
}

// A file that is one JSON array (ShareGPT's, vLLM's usual benchmark set) is read as prompt
// objects; a text file whose first line starts with '[' stays text.
// NOTE: the array was read as plain text, each line of JSON a "prompt".
TEST(LoadPrompts, AJsonArrayIsReadAsObjectsShareGptIncluded) {
  const std::string path = write_temp(
      "sharegpt.json",
      "[\n  {\"id\": \"a\", \"conversations\": [\n"
      "     {\"from\": \"human\", \"value\": \"What is a GPU?\"}, {\"from\": \"gpt\", \"value\": \"A chip.\"}]},\n"
      "  {\"prompt\": \"second\", \"category\": \"qa\"}\n]\n");
  auto p = load_prompts(path);
  ASSERT_TRUE(p.ok()) << p.status().to_string();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].prompt, "What is a GPU?");
  EXPECT_EQ((*p)[1].prompt, "second");
  EXPECT_EQ((*p)[1].category, "qa");
  std::filesystem::remove(path);

  const std::string nums = write_temp("nums.json", "[1, 2]\n");
  auto n = load_prompts(nums);
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(n.status().message().find("element 0 is not a JSON object"), std::string::npos) << n.status().message();
  std::filesystem::remove(nums);

  // As vLLM's benchmark reads ShareGPT: the first turn's value, whatever its role; conversations
  // of fewer than 2 turns are left out, and so are those whose first turn has no text; counted.
  const std::string mixed = write_temp(
      "mixed.json",
      "[{\"conversations\": []}, {\"conversations\": [{\"from\": \"human\", \"value\": \"alone\"}]},"
      " {\"conversations\": [{\"from\": null, \"value\": 3}, {\"from\": \"gpt\", \"value\": \"x\"}]},"
      " {\"conversations\": [{\"from\": \"user\", \"value\": \"kept\"}, {\"from\": \"gpt\", \"value\": \"y\"}]}]");
  int64_t skipped = -1;
  auto h = load_prompts(mixed, &skipped);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  ASSERT_EQ(h->size(), 1u);
  EXPECT_EQ((*h)[0].prompt, "kept");
  EXPECT_EQ(skipped, 3);
  std::filesystem::remove(mixed);
  const std::string none_kept = write_temp("none.json", "[{\"conversations\": [{\"from\": \"gpt\", \"value\": \"hi\"}]}]");
  auto none = load_prompts(none_kept);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("fewer than 2 turns"), std::string::npos) << none.status().message();
  std::filesystem::remove(none_kept);

  // A directory: named, not an exception from the stream library.
  const auto d = std::filesystem::temp_directory_path() / ("load-prompts-dir-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  auto dir = load_prompts(d.string());
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos) << dir.status().message();
  std::filesystem::remove_all(d);

  // An array of objects cut short is an error naming where it stops, not lines of text.
  const std::string cut = write_temp("cut.json", "[\n {\"prompt\": \"a\"},\n {\"prompt\": \"b\"");
  auto c = load_prompts(cut);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(c.status().message().find("does not parse (at byte"), std::string::npos) << c.status().message();
  std::filesystem::remove(cut);

  const std::string empty = write_temp("empty.json", " [ ] ");
  EXPECT_EQ(load_prompts(empty).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove(empty);

  const std::string inst = write_temp("inst.txt", "[INST] Tell me a joke [/INST]\n[INST] Another [/INST]\n");
  auto t = load_prompts(inst);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prompt, "[INST] Tell me a joke [/INST]");
  std::filesystem::remove(inst);
}

TEST(LoadPrompts, ErrorsNameTheFileAndLine) {
  auto missing = load_prompts("/nonexistent/dir/q.jsonl");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/q.jsonl"), std::string::npos);

  const std::string bad = write_temp("bad.jsonl", "{\"turns\": [\"ok\"]}\n{\"turns\": [\"broken\"\n");
  auto b = load_prompts(bad);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(b.status().message().find("line 2"), std::string::npos) << b.status().message();
  std::filesystem::remove(bad);

  const std::string no_prompt = write_temp("np.jsonl", "{\"turns\": []}\n");
  auto n = load_prompts(no_prompt);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("line 1"), std::string::npos);
  std::filesystem::remove(no_prompt);

  const std::string empty = write_temp("empty.txt", "\n\n");
  EXPECT_EQ(load_prompts(empty).status().code(), StatusCode::kInvalidArgument);
  std::filesystem::remove(empty);
}

TEST(SelectPrompts, SeededPermutationCycledAndStable) {
  std::vector<BenchPrompt> all;
  for (int i = 0; i < 5; ++i) all.push_back({"p" + std::to_string(i), ""});
  auto a = select_prompts(all, 12, 7);
  auto b = select_prompts(all, 12, 7);
  ASSERT_EQ(a.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].prompt, b[i].prompt);
  // The first five are a permutation, then it repeats.
  std::set<std::string> first;
  for (int i = 0; i < 5; ++i) first.insert(a[i].prompt);
  EXPECT_EQ(first.size(), 5u);
  for (int i = 5; i < 12; ++i) EXPECT_EQ(a[i].prompt, a[i - 5].prompt);
  EXPECT_EQ(select_prompts(all, 0, 7).size(), 5u);
  // Another seed, another order (for this seed pair; a guard against ignoring the seed).
  auto c = select_prompts(all, 5, 8);
  bool differs = false;
  for (int i = 0; i < 5; ++i) differs |= c[i].prompt != a[i].prompt;
  EXPECT_TRUE(differs);
}

// An OpenAI client's base URL ("http://host:8000/v1") sent every request to /v1/v1/... (404).
TEST(ParseBaseUrl, OpenAiStyleV1SuffixIsDroppedForV1Endpoints) {
  auto u = parse_base_url("http://127.0.0.1:8000/v1/");
  ASSERT_TRUE(u.ok());
  EXPECT_TRUE(drop_openai_v1_suffix(&*u, "/v1/chat/completions"));
  EXPECT_EQ(u->path_prefix, "");
  auto proxy = parse_base_url("https://gw.example.com/team/v1");
  ASSERT_TRUE(proxy.ok());
  EXPECT_TRUE(drop_openai_v1_suffix(&*proxy, "/v1/completions"));
  EXPECT_EQ(proxy->path_prefix, "/team");
  // Left alone: no /v1 at the end, or an endpoint without /v1/.
  auto plain = parse_base_url("http://127.0.0.1:8000/v1x");
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(drop_openai_v1_suffix(&*plain, "/v1/completions"));
  EXPECT_EQ(plain->path_prefix, "/v1x");
  auto other = parse_base_url("http://127.0.0.1:8000/v1");
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(drop_openai_v1_suffix(&*other, "/completion"));
  EXPECT_EQ(other->path_prefix, "/v1");
}

TEST(ParseBaseUrl, Forms) {
  auto a = parse_base_url("http://127.0.0.1:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->scheme, "http");
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  EXPECT_EQ(a->path_prefix, "");
  EXPECT_EQ(a->scheme_host_port(), "http://127.0.0.1:8000");

  auto b = parse_base_url("https://api.example.com/proxy/");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->port, 443);
  EXPECT_EQ(b->path_prefix, "/proxy");

  auto c = parse_base_url("localhost:9000");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->scheme, "http");
  EXPECT_EQ(c->host, "localhost");
  EXPECT_EQ(c->port, 9000);

  auto d = parse_base_url("http://[::1]:8080/x");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->host, "::1");
  EXPECT_EQ(d->port, 8080);
  EXPECT_EQ(d->path_prefix, "/x");

  EXPECT_FALSE(parse_base_url("ftp://host").ok());
  EXPECT_FALSE(parse_base_url("http://host:99999").ok());
  EXPECT_FALSE(parse_base_url("http://host:80a").ok());
  EXPECT_FALSE(parse_base_url("http://:8000").ok());
}

std::vector<std::string> sse_events(const std::vector<std::string>& pieces, bool finish = true) {
  SseParser p;
  std::vector<std::string> out;
  auto on = [&](std::string_view d) { out.emplace_back(d); };
  for (const auto& piece : pieces) p.feed(piece, on);
  if (finish) p.finish(on);
  return out;
}

TEST(SseParser, EventsSplitAnywhere) {
  const std::string body =
      "data: {\"a\":1}\n\n"
      ": ping - 2025-01-01\r\n\r\n"
      "event: message\r\ndata: {\"b\":2}\r\n\r\n"
      "data:no-space\n\n"
      "data: line1\ndata: line2\n\n"
      "data: [DONE]\n\n";
  const std::vector<std::string> want = {"{\"a\":1}", "{\"b\":2}", "no-space", "line1\nline2", "[DONE]"};
  EXPECT_EQ(sse_events({body}), want);
  // Every split point, including inside "\r\n" and inside "data:".
  for (size_t cut = 1; cut < body.size(); ++cut) {
    EXPECT_EQ(sse_events({body.substr(0, cut), body.substr(cut)}), want) << "cut at " << cut;
  }
  // Byte by byte.
  std::vector<std::string> bytes;
  for (char c : body) bytes.emplace_back(1, c);
  EXPECT_EQ(sse_events(bytes), want);
}

TEST(SseParser, FinishDeliversAnUnterminatedEvent) {
  EXPECT_EQ(sse_events({"data: {\"x\":1}"}), std::vector<std::string>{"{\"x\":1}"});
  EXPECT_EQ(sse_events({"data: {\"x\":1}\n"}), std::vector<std::string>{"{\"x\":1}"});
  EXPECT_TRUE(sse_events({"data: {\"x\":1}\n"}, /*finish=*/false).empty());
  EXPECT_TRUE(sse_events({"{\"not\": \"sse\"}"}).empty());  // a plain JSON body has no data lines
}

TEST(StreamChunk, ChatCompletionsAndUsage) {
  auto role = parse_stream_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})",
                                 Endpoint::kChatCompletions);
  ASSERT_TRUE(role.ok());
  EXPECT_EQ(role->text, "");
  auto tok = parse_stream_chunk(R"({"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]})",
                                Endpoint::kChatCompletions);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->text, "Hi");
  EXPECT_EQ(tok->finish_reason, "");
  auto fin = parse_stream_chunk(R"({"choices":[{"delta":{},"finish_reason":"length"}]})", Endpoint::kChatCompletions);
  ASSERT_TRUE(fin.ok());
  EXPECT_EQ(fin->finish_reason, "length");
  auto usage = parse_stream_chunk(R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}})",
                                  Endpoint::kChatCompletions);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ(usage->prompt_tokens.value_or(-1), 12);
  EXPECT_EQ(usage->completion_tokens.value_or(-1), 34);
  auto null_usage = parse_stream_chunk(R"({"choices":[{"delta":{"content":"x"}}],"usage":null})", Endpoint::kChatCompletions);
  ASSERT_TRUE(null_usage.ok());
  EXPECT_FALSE(null_usage->completion_tokens.has_value());
  auto done = parse_stream_chunk(" [DONE] ", Endpoint::kChatCompletions);
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(done->done);
}

TEST(StreamChunk, CompletionsErrorsAndGarbage) {
  auto t = parse_stream_chunk(R"({"choices":[{"text":" world","index":0,"finish_reason":"stop"}]})", Endpoint::kCompletions);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->text, " world");
  EXPECT_EQ(t->finish_reason, "stop");
  auto e = parse_stream_chunk(R"({"error":{"message":"out of KV blocks","type":"server_error"}})", Endpoint::kCompletions);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->error, "out of KV blocks");
  auto g = parse_stream_chunk("<html>502 Bad Gateway</html>", Endpoint::kCompletions);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(g.status().message().find("502 Bad Gateway"), std::string::npos);
}

TEST(Endpoint, OfPath) {
  EXPECT_EQ(*endpoint_of("/v1/chat/completions"), Endpoint::kChatCompletions);
  EXPECT_EQ(*endpoint_of("/v1/completions"), Endpoint::kCompletions);
  EXPECT_FALSE(endpoint_of("/v1/embeddings").ok());
}

TEST(RequestBody, ShapeSeedIgnoreEosAndExtra) {
  auto chat = request_body(Endpoint::kChatCompletions, "m", "hello", 64, 0.0, std::nullopt, false, nlohmann::json::object());
  EXPECT_EQ(chat["model"], "m");
  EXPECT_EQ(chat["messages"][0]["role"], "user");
  EXPECT_EQ(chat["messages"][0]["content"], "hello");
  EXPECT_EQ(chat["max_tokens"], 64);
  EXPECT_EQ(chat["stream"], true);
  EXPECT_EQ(chat["stream_options"]["include_usage"], true);
  EXPECT_FALSE(chat.contains("seed"));
  EXPECT_FALSE(chat.contains("ignore_eos"));
  EXPECT_FALSE(chat.contains("prompt"));
  auto comp = request_body(Endpoint::kCompletions, "m", "hello", 8, 0.7, 42, true,
                           nlohmann::json{{"top_p", 0.9}, {"max_tokens", 3}});
  EXPECT_EQ(comp["prompt"], "hello");
  EXPECT_EQ(comp["seed"], 42);
  EXPECT_EQ(comp["ignore_eos"], true);
  EXPECT_EQ(comp["top_p"], 0.9);
  EXPECT_EQ(comp["max_tokens"], 3);  // extra keys win
}

TEST(ErrorMessage, Shapes) {
  EXPECT_EQ(error_message_of(R"({"error":{"message":"Invalid API key","type":"auth"}})"), "Invalid API key");
  EXPECT_EQ(error_message_of(R"({"detail":"Invalid API key"})"), "Invalid API key");
  EXPECT_EQ(error_message_of("Not Found"), "Not Found");
  EXPECT_EQ(error_message_of(""), "(empty body)");
}

// Reference values: numpy 2.4.6 (the project venv), np.percentile(v, p) (linear), np.std(v).
TEST(Percentile, MatchesNumpy) {
  const std::vector<double> v = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile(v, 50), 35);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 46);    // np.percentile([15,20,35,40,50], 90)
  EXPECT_DOUBLE_EQ(percentile(v, 99), 49.6);  // ... 99
  EXPECT_DOUBLE_EQ(percentile(v, 0), 15);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 50);
  EXPECT_DOUBLE_EQ(percentile({3, 1, 2, 4}, 50), 2.5);  // unsorted input, even count
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  auto s = latency_stats({0.015, 0.020, 0.035, 0.040, 0.050});  // seconds -> ms
  EXPECT_EQ(s.count, 5);
  EXPECT_NEAR(s.mean_ms, 32.0, 1e-9);
  EXPECT_NEAR(s.median_ms, 35.0, 1e-9);
  EXPECT_NEAR(s.std_ms, 12.884098726725126, 1e-9);  // np.std([15,20,35,40,50])
  EXPECT_NEAR(s.p90_ms, 46.0, 1e-9);
}

TEST(Summarize, VllmDefinitions) {
  RequestResult a;
  a.success = true;
  a.prompt_tokens = 10;
  a.output_tokens = 5;
  a.usage_reported = true;
  a.num_deltas = 3;  // speculative: some deltas carry several tokens
  a.ttft_s = 0.1;
  a.latency_s = 0.5;
  a.itl_s = {0.2, 0.2};
  a.finish_reason = "length";
  RequestResult b;
  b.success = true;
  b.output_tokens = 1;  // no usage, one delta: no TPOT
  b.num_deltas = 1;
  b.ttft_s = 0.3;
  b.latency_s = 0.3;
  b.finish_reason = "stop";
  RequestResult c;
  c.http_status = 400;
  c.error = "max_tokens must be at least 1";
  const BenchSummary s = summarize({a, b, c}, 2.0, 4);
  EXPECT_EQ(s.max_concurrency, 4);
  EXPECT_EQ(s.num_requests, 3);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_input_tokens, 10);
  EXPECT_EQ(s.total_output_tokens, 6);
  EXPECT_EQ(s.num_without_usage, 1);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(s.output_throughput, 3.0);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 8.0);
  EXPECT_EQ(s.tpot.count, 1);
  EXPECT_NEAR(s.tpot.mean_ms, (0.5 - 0.1) / 4 * 1e3, 1e-9);
  EXPECT_EQ(s.ttft.count, 2);
  EXPECT_NEAR(s.ttft.mean_ms, 200.0, 1e-9);
  EXPECT_EQ(s.itl.count, 2);
  EXPECT_EQ(s.finish_reasons.at("length"), 1);
  EXPECT_EQ(s.finish_reasons.at("stop"), 1);
  EXPECT_EQ(s.errors.at("HTTP 400: max_tokens must be at least 1"), 1);

  const nlohmann::json j = summary_json(s);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 200.0);
  EXPECT_TRUE(j.contains("p99_tpot_ms"));
  EXPECT_TRUE(j.contains("median_e2el_ms"));
  const std::string text = format_summary(s, "demo");
  EXPECT_NE(text.find("Serving Benchmark Result (demo)"), std::string::npos);
  EXPECT_NE(text.find("Successful requests:"), std::string::npos);
  EXPECT_NE(text.find("HTTP 400: max_tokens must be at least 1"), std::string::npos);
  const std::string table = format_table({s, s});
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 4);
  EXPECT_EQ(table.find("n/a"), std::string::npos) << table;
  // A run where nothing completed: its latencies are "n/a" in the summary and the table, not 0.
  const BenchSummary none = summarize({}, 1.0, 1);
  EXPECT_NE(format_summary(none, "x").find("Mean TTFT (ms):                          n/a"), std::string::npos);
  const std::string t2 = format_table({none});
  EXPECT_NE(t2.find("| n/a | n/a | n/a | n/a |"), std::string::npos) << t2;
}

}  // namespace
}  // namespace specserve::cli::bench_http
