#include "tools/cli/bench_http_lib.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <numeric>
#include <random>

namespace specserve::cli::bench_http {
namespace {

using json = nlohmann::json;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

/// The first `n` characters of `s`, with "..." when cut; for quoting a server's bytes in errors.
std::string quote_start(std::string_view s, size_t n = 200) {
  std::string out(s.substr(0, n));
  if (s.size() > n) out += "...";
  return out;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

}  // namespace

namespace {

// One prompt object: "turns" (Spec-Bench / MT-Bench: the first turn), "prompt", "text", or
// "conversations" (ShareGPT: the first turn's "value", vLLM's benchmark's choice); "category"
// optional. `raw` is the line for the error excerpt ("" for an array element: its JSON, written
// only on an error). *skip (with no error) for a conversation of fewer than 2 turns (vLLM's
// benchmark's filter; not its token-length ones), or whose first turn has no text.
Expected<BenchPrompt> prompt_of(const json& j, const std::string& where, std::string_view raw, bool* skip) {
  *skip = false;
  auto excerpt = [&] { return raw.empty() ? quote_start(j.dump(), 80) : quote_start(raw, 80); };
  if (!j.is_object()) return corrupt_data(where + " is not a JSON object: " + excerpt());
  BenchPrompt p;
  if (auto t = j.find("turns"); t != j.end() && t->is_array() && !t->empty() && t->front().is_string()) {
    p.prompt = t->front().get<std::string>();
  } else if (auto q = j.find("prompt"); q != j.end() && q->is_string()) {
    p.prompt = q->get<std::string>();
  } else if (auto x = j.find("text"); x != j.end() && x->is_string()) {
    p.prompt = x->get<std::string>();
  } else if (auto c = j.find("conversations"); c != j.end() && c->is_array()) {
    const json* value = nullptr;
    if (c->size() >= 2 && c->front().is_object()) {
      auto v = c->front().find("value");
      if (v != c->front().end() && v->is_string()) value = &*v;
    }
    if (value && !value->get_ref<const std::string&>().empty()) {
      p.prompt = value->get<std::string>();
    } else {
      *skip = true;
    }
  } else {
    return corrupt_data(where +
                        " has no prompt: expected \"turns\" (a list of strings), \"prompt\", \"text\" or "
                        "\"conversations\" (ShareGPT)");
  }
  if (auto c = j.find("category"); c != j.end() && c->is_string()) p.category = c->get<std::string>();
  return p;
}

}  // namespace

Expected<std::vector<BenchPrompt>> load_prompts(const std::string& path, int64_t* num_skipped) {
  std::error_code ec;
  // (reading a directory threw from deep in the stream library)
  if (std::filesystem::is_directory(path, ec)) return invalid_argument("dataset '" + path + "' is a directory: give a file");
  std::ifstream in(path);
  if (!in) return not_found("dataset file '" + path + "' cannot be opened (does it exist?)");
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<BenchPrompt> out;
  int64_t skipped = 0;
  if (num_skipped) *num_skipped = 0;
  // One prompt object into `out` (or counted as skipped).
  auto take = [&](const json& j, const std::string& where, std::string_view raw) -> Status {
    bool skip = false;
    auto p = prompt_of(j, where, raw, &skip);
    if (!p.ok()) return p.status();
    if (skip) {
      ++skipped;
    } else {
      out.push_back(std::move(*p));
    }
    return Status();
  };
  // A file that is one JSON array (ShareGPT's, or a list of prompt objects).
  // NOTE: it was read as plain text, one prompt per line of JSON. A text file whose first line
  // starts with '[' ("[INST] ...") is not JSON and stays text; one that opens an array of objects
  // and does not parse (cut short, a trailing comma) is an error, not text.
  if (std::string_view first = trim(all); !first.empty() && first.front() == '[') {
    const std::string_view rest = trim(first.substr(1));
    const bool looks_json = !rest.empty() && (rest.front() == '{' || rest.front() == ']');
    json j;
    try {
      j = json::parse(all);
    } catch (const json::parse_error& e) {
      if (looks_json) {
        return corrupt_data("dataset '" + path + "' is a JSON array that does not parse (at byte " +
                            std::to_string(e.byte) + "): " + e.what());
      }
      j = json();  // text
    }
    if (j.is_array()) {
      for (size_t i = 0; i < j.size(); ++i) {
        SPECSERVE_RETURN_IF_ERROR(take(j[i], "dataset '" + path + "' element " + std::to_string(i), ""));
      }
      if (num_skipped) *num_skipped = skipped;
      if (out.empty()) {
        return invalid_argument("dataset file '" + path + "' holds no prompt (a JSON array of " + std::to_string(j.size()) +
                                " element(s), " + std::to_string(skipped) +
                                " conversation(s) left out: fewer than 2 turns, or a first turn with no text)");
      }
      return out;
    }
  }
  int line_no = 0;
  int format = 0;  // 0: not known yet, 1: JSON lines, 2: plain text
  for (size_t pos = 0; pos < all.size();) {
    const size_t nl = all.find('\n', pos);
    std::string_view raw = std::string_view(all).substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
    pos = nl == std::string::npos ? all.size() : nl + 1;
    ++line_no;
    std::string_view line = trim(raw);
    if (line.empty()) continue;
    if (format == 0) format = line.front() == '{' ? 1 : 2;
    if (format == 2) {
      if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
      out.push_back({std::string(raw), ""});
      continue;
    }
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = "dataset '" + path + "' line " + std::to_string(line_no);
    if (j.is_discarded()) return corrupt_data(where + " is not a JSON object: " + quote_start(line, 80));
    SPECSERVE_RETURN_IF_ERROR(take(j, where, line));
  }
  if (num_skipped) *num_skipped = skipped;
  if (out.empty()) return invalid_argument("dataset file '" + path + "' holds no prompt");
  return out;
}

std::vector<BenchPrompt> select_prompts(const std::vector<BenchPrompt>& all, int num_prompts, uint64_t seed) {
  SPECSERVE_CHECK(!all.empty(), "select_prompts needs a non-empty set");
  std::vector<size_t> order(all.size());
  std::iota(order.begin(), order.end(), 0);
  // NOTE: Fisher-Yates by hand: std::shuffle's use of the engine is implementation-defined, and
  // the same seed should pick the same prompts wherever the benchmark runs.
  std::mt19937_64 rng(seed);
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);
  const size_t n = num_prompts <= 0 ? all.size() : static_cast<size_t>(num_prompts);
  std::vector<BenchPrompt> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(all[order[i % order.size()]]);
  return out;
}

std::string BaseUrl::scheme_host_port() const { return scheme + "://" + host + ":" + std::to_string(port); }

Expected<BaseUrl> parse_base_url(const std::string& url) {
  BaseUrl b;
  std::string_view rest = trim(url);
  if (auto p = rest.find("://"); p != std::string_view::npos) {
    b.scheme = std::string(rest.substr(0, p));
    std::transform(b.scheme.begin(), b.scheme.end(), b.scheme.begin(), [](unsigned char c) { return std::tolower(c); });
    rest.remove_prefix(p + 3);
  } else {
    b.scheme = "http";
  }
  if (b.scheme != "http" && b.scheme != "https") {
    return invalid_argument("--base-url '" + url + "': scheme '" + b.scheme + "' is not http or https");
  }
  std::string_view authority = rest.substr(0, rest.find('/'));
  if (authority.size() < rest.size()) {
    std::string_view path = rest.substr(authority.size());
    while (!path.empty() && path.back() == '/') path.remove_suffix(1);
    b.path_prefix = std::string(path);
  }
  b.port = b.scheme == "https" ? 443 : 80;
  std::string_view host = authority;
  // "[::1]:8000": the port follows the bracket; "host:8000": the last colon.
  size_t colon = std::string_view::npos;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument("--base-url '" + url + "': unclosed '[' in the host");
    host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':') return invalid_argument("--base-url '" + url + "': junk after ']'");
      colon = close + 1;
    }
  } else if (auto c = authority.rfind(':'); c != std::string_view::npos) {
    colon = c;
    host = authority.substr(0, c);
  }
  if (colon != std::string_view::npos) {
    std::string_view port = authority.substr(colon + 1);
    int v = 0;
    bool ok = !port.empty() && port.size() <= 5;
    for (char ch : port) {
      if (ch < '0' || ch > '9') ok = false;
      else v = v * 10 + (ch - '0');
    }
    if (!ok || v < 1 || v > 65535) return invalid_argument("--base-url '" + url + "': bad port '" + std::string(port) + "'");
    b.port = v;
  }
  if (host.empty()) return invalid_argument("--base-url '" + url + "': no host");
  b.host = std::string(host);
  return b;
}

bool drop_openai_v1_suffix(BaseUrl* url, const std::string& endpoint) {
  const std::string& p = url->path_prefix;
  if (endpoint.rfind("/v1/", 0) != 0 || p.size() < 3 || p.compare(p.size() - 3, 3, "/v1") != 0) return false;
  url->path_prefix.resize(p.size() - 3);
  return true;
}

void SseParser::feed(std::string_view bytes, const OnData& on_data) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial_.append(bytes);
      return;
    }
    if (partial_.empty()) {
      line(bytes.substr(0, nl), on_data);
    } else {
      partial_.append(bytes.substr(0, nl));
      std::string l = std::move(partial_);
      partial_.clear();
      line(l, on_data);
    }
    bytes.remove_prefix(nl + 1);
  }
}

void SseParser::finish(const OnData& on_data) {
  if (!partial_.empty()) {
    std::string l = std::move(partial_);
    partial_.clear();
    line(l, on_data);
  }
  dispatch(on_data);
}

void SseParser::line(std::string_view l, const OnData& on_data) {
  if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
  if (l.empty()) {
    dispatch(on_data);
    return;
  }
  if (l.front() == ':') return;  // comment (keep-alive pings)
  std::string_view field = l, value;
  if (auto c = l.find(':'); c != std::string_view::npos) {
    field = l.substr(0, c);
    value = l.substr(c + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;  // event, id, retry: nothing a completion stream needs
  if (has_data_) data_ += '\n';
  data_.append(value);
  has_data_ = true;
}

void SseParser::dispatch(const OnData& on_data) {
  if (!has_data_) return;
  ++num_events_;
  std::string d = std::move(data_);
  data_.clear();
  has_data_ = false;
  on_data(d);
}

Expected<Endpoint> endpoint_of(std::string_view path) {
  auto ends_with = [&](std::string_view s) { return path.size() >= s.size() && path.substr(path.size() - s.size()) == s; };
  if (ends_with("chat/completions")) return Endpoint::kChatCompletions;
  if (ends_with("completions")) return Endpoint::kCompletions;
  return invalid_argument("--endpoint '" + std::string(path) +
                          "' is neither /v1/completions nor /v1/chat/completions");
}

Expected<StreamChunk> parse_stream_chunk(std::string_view data, Endpoint endpoint) {
  StreamChunk c;
  std::string_view d = trim(data);
  if (d == "[DONE]") {
    c.done = true;
    return c;
  }
  json j = json::parse(d, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return corrupt_data("stream event is not a JSON object: " + quote_start(d));
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    c.error = e->is_object() && e->contains("message") && (*e)["message"].is_string() ? (*e)["message"].get<std::string>()
                                                                                        : e->dump();
    return c;
  }
  if (auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty() && ch->front().is_object()) {
    const json& choice = ch->front();
    const json* text = nullptr;
    if (endpoint == Endpoint::kChatCompletions) {
      if (auto delta = choice.find("delta"); delta != choice.end() && delta->is_object()) {
        if (auto t = delta->find("content"); t != delta->end()) text = &*t;
      }
    } else if (auto t = choice.find("text"); t != choice.end()) {
      text = &*t;
    }
    if (text && text->is_string()) c.text = text->get<std::string>();
    if (auto f = choice.find("finish_reason"); f != choice.end() && f->is_string()) c.finish_reason = f->get<std::string>();
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    if (auto p = u->find("prompt_tokens"); p != u->end() && p->is_number_integer()) c.prompt_tokens = p->get<int64_t>();
    if (auto p = u->find("completion_tokens"); p != u->end() && p->is_number_integer()) c.completion_tokens = p->get<int64_t>();
  }
  return c;
}

json request_body(Endpoint endpoint, const std::string& model, const std::string& prompt, int max_tokens, double temperature,
                  std::optional<int64_t> seed, bool ignore_eos, const json& extra) {
  json body = {{"model", model},
               {"max_tokens", max_tokens},
               {"temperature", temperature},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (endpoint == Endpoint::kChatCompletions) {
    body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
  } else {
    body["prompt"] = prompt;
  }
  if (seed) body["seed"] = *seed;
  if (ignore_eos) body["ignore_eos"] = true;
  if (extra.is_object()) {
    for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  }
  return body;
}

std::string error_message_of(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object()) {
    if (auto e = j.find("error"); e != j.end()) {
      if (e->is_string()) return e->get<std::string>();
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) return (*e)["message"].get<std::string>();
    }
    if (auto d = j.find("detail"); d != j.end()) return d->is_string() ? d->get<std::string>() : d->dump();
    if (auto m = j.find("message"); m != j.end() && m->is_string()) return m->get<std::string>();
  }
  std::string_view t = trim(body);
  return t.empty() ? std::string("(empty body)") : quote_start(t);
}

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

LatencyStats latency_stats(const std::vector<double>& values_s) {
  LatencyStats s;
  s.count = static_cast<int64_t>(values_s.size());
  if (values_s.empty()) return s;
  std::vector<double> ms(values_s.size());
  std::transform(values_s.begin(), values_s.end(), ms.begin(), [](double v) { return v * 1e3; });
  const double n = static_cast<double>(ms.size());
  s.mean_ms = std::accumulate(ms.begin(), ms.end(), 0.0) / n;
  double var = 0;
  for (double v : ms) var += (v - s.mean_ms) * (v - s.mean_ms);
  s.std_ms = std::sqrt(var / n);
  s.median_ms = percentile(ms, 50);
  s.p90_ms = percentile(ms, 90);
  s.p99_ms = percentile(ms, 99);
  return s;
}

BenchSummary summarize(const std::vector<RequestResult>& results, double duration_s, int max_concurrency) {
  BenchSummary s;
  s.max_concurrency = max_concurrency;
  s.num_requests = static_cast<int>(results.size());
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++s.failed;
      std::string key = r.http_status ? "HTTP " + std::to_string(r.http_status) + ": " + r.error : r.error;
      ++s.errors[key];
      continue;
    }
    ++s.completed;
    if (r.prompt_tokens >= 0) s.total_input_tokens += r.prompt_tokens;
    else ++s.num_prompt_tokens_unknown;
    if (r.prompt_tokens >= 0 && r.prompt_tokens_from_tokenizer) ++s.num_prompt_tokens_counted;
    if (!r.usage_reported) ++s.num_without_usage;
    s.total_output_tokens += r.output_tokens;
    ++s.finish_reasons[r.finish_reason.empty() ? "none" : r.finish_reason];
    if (r.num_deltas > 0) ttft.push_back(r.ttft_s);
    e2el.push_back(r.latency_s);
    if (r.output_tokens > 1 && r.num_deltas > 0) {
      tpot.push_back((r.latency_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1));
    }
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
  }
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.output_throughput = static_cast<double>(s.total_output_tokens) / duration_s;
    s.total_token_throughput = static_cast<double>(s.total_input_tokens + s.total_output_tokens) / duration_s;
  }
  s.ttft = latency_stats(ttft);
  s.tpot = latency_stats(tpot);
  s.itl = latency_stats(itl);
  s.e2el = latency_stats(e2el);
  return s;
}

json summary_json(const BenchSummary& s) {
  json j = {{"max_concurrency", s.max_concurrency},
            {"num_requests", s.num_requests},
            {"duration", s.duration_s},
            {"completed", s.completed},
            {"failed", s.failed},
            {"total_input_tokens", s.total_input_tokens},
            {"total_output_tokens", s.total_output_tokens},
            {"num_without_usage", s.num_without_usage},
            {"num_prompt_tokens_counted", s.num_prompt_tokens_counted},
            {"num_prompt_tokens_unknown", s.num_prompt_tokens_unknown},
            {"request_throughput", s.request_throughput},
            {"output_throughput", s.output_throughput},
            {"total_token_throughput", s.total_token_throughput},
            {"finish_reasons", s.finish_reasons},
            {"errors", s.errors}};
  auto put = [&](const char* name, const LatencyStats& l) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = l.mean_ms;
    j["median_" + n + "_ms"] = l.median_ms;
    j["std_" + n + "_ms"] = l.std_ms;
    j["p90_" + n + "_ms"] = l.p90_ms;
    j["p99_" + n + "_ms"] = l.p99_ms;
    j["num_" + n] = l.count;
  };
  put("ttft", s.ttft);
  put("tpot", s.tpot);
  put("itl", s.itl);
  put("e2el", s.e2el);
  return j;
}

json requests_json(const std::vector<RequestResult>& results) {
  json a = json::array();
  for (const RequestResult& r : results) {
    json itl = json::array();
    for (double v : r.itl_s) itl.push_back(std::round(v * 1e6) / 1e3);  // ms, to the microsecond
    a.push_back({{"success", r.success},
                 {"category", r.category},
                 {"prompt_tokens", r.prompt_tokens},
                 {"prompt_tokens_source", r.prompt_tokens < 0 ? "" : r.prompt_tokens_from_tokenizer ? "tokenizer" : "usage"},
                 {"output_tokens", r.output_tokens},
                 {"usage_reported", r.usage_reported},
                 {"num_deltas", r.num_deltas},
                 {"ttft_ms", r.num_deltas > 0 ? json(r.ttft_s * 1e3) : json(nullptr)},  // null: no token came
                 {"e2el_ms", r.latency_s * 1e3},
                 {"itl_ms", std::move(itl)},
                 {"finish_reason", r.finish_reason},
                 {"generated_text", r.generated_text},
                 {"http_status", r.http_status},
                 {"error", r.error}});
  }
  return a;
}

std::string format_summary(const BenchSummary& s, const std::string& label) {
  std::ostringstream o;
  auto row = [&](const std::string& name, const std::string& value) {
    char buf[128];
    std::snprintf(buf, sizeof(buf), "%-40s %s\n", (name + ":").c_str(), value.c_str());
    o << buf;
  };
  auto head = [&](const std::string& title) {
    const int width = 50;
    const int pad = std::max(0, width - static_cast<int>(title.size()) - 2);
    o << std::string(pad / 2, '-') << ' ' << title << ' ' << std::string(pad - pad / 2, '-') << '\n';
  };
  std::string title = " Serving Benchmark Result" + (label.empty() ? "" : " (" + label + ")") + " ";
  const int pad = std::max(4, 50 - static_cast<int>(title.size()));
  o << std::string(pad / 2, '=') << title << std::string(pad - pad / 2, '=') << '\n';
  row("Maximum request concurrency", std::to_string(s.max_concurrency));
  row("Successful requests", std::to_string(s.completed));
  row("Failed requests", std::to_string(s.failed));
  row("Benchmark duration (s)", fmt("%.2f", s.duration_s));
  row("Total input tokens", std::to_string(s.total_input_tokens));
  row("Total generated tokens", std::to_string(s.total_output_tokens));
  row("Request throughput (req/s)", fmt("%.2f", s.request_throughput));
  row("Output token throughput (tok/s)", fmt("%.2f", s.output_throughput));
  row("Total Token throughput (tok/s)", fmt("%.2f", s.total_token_throughput));
  auto block = [&](const char* title, const char* abbrev, const LatencyStats& l) {
    head(title);
    const std::string a = abbrev;
    // No samples (no request produced a token, or none produced two): "n/a", not a 0.00 that
    // reads as a measurement.
    auto v = [&](double ms) { return l.count > 0 ? fmt("%.2f", ms) : std::string("n/a"); };
    row("Mean " + a + " (ms)", v(l.mean_ms));
    row("Median " + a + " (ms)", v(l.median_ms));
    row("P90 " + a + " (ms)", v(l.p90_ms));
    row("P99 " + a + " (ms)", v(l.p99_ms));
  };
  block("Time to First Token", "TTFT", s.ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", s.tpot);
  block("Inter-token Latency", "ITL", s.itl);
  block("End-to-end Latency", "E2EL", s.e2el);
  o << std::string(50, '=') << '\n';
  if (s.num_without_usage > 0) {
    o << "note: " << s.num_without_usage
      << " completed request(s) came without usage: output tokens counted as content deltas\n";
  }
  if (s.num_prompt_tokens_counted > 0) {
    o << "note: prompt tokens of " << s.num_prompt_tokens_counted << " request(s) counted by --tokenizer\n";
  }
  if (s.num_prompt_tokens_unknown > 0) {
    o << "note: prompt tokens of " << s.num_prompt_tokens_unknown
      << " request(s) unknown (no usage; --tokenizer counts them): missing from the input and total tokens\n";
  }
  for (const auto& [msg, n] : s.errors) o << "error x" << n << ": " << msg << '\n';
  return o.str();
}

std::string format_table(const std::vector<BenchSummary>& runs) {
  std::ostringstream o;
  o << "| concurrency | ok / failed | req/s | output tok/s | total tok/s | TTFT p50 / p90 / p99 (ms) "
       "| TPOT p50 / p90 / p99 (ms) | ITL p50 / p99 (ms) | E2E p50 / p99 (s) |\n"
    << "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  // A latency with no sample: "n/a" (as in format_summary), not a 0 that reads as measured.
  auto cell = [](const LatencyStats& l, std::initializer_list<double> values, const char* f, double scale) {
    if (l.count == 0) return std::string("n/a");
    std::string out;
    char buf[64];
    for (double v : values) {
      std::snprintf(buf, sizeof(buf), f, v / scale);
      out += (out.empty() ? "" : " / ") + std::string(buf);
    }
    return out;
  };
  for (const BenchSummary& s : runs) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "| %d | %d / %d | %.2f | %.1f | %.1f | ", s.max_concurrency, s.completed, s.failed,
                  s.request_throughput, s.output_throughput, s.total_token_throughput);
    o << buf << cell(s.ttft, {s.ttft.median_ms, s.ttft.p90_ms, s.ttft.p99_ms}, "%.0f", 1) << " | "
      << cell(s.tpot, {s.tpot.median_ms, s.tpot.p90_ms, s.tpot.p99_ms}, "%.1f", 1) << " | "
      << cell(s.itl, {s.itl.median_ms, s.itl.p99_ms}, "%.1f", 1) << " | "
      << cell(s.e2el, {s.e2el.median_ms, s.e2el.p99_ms}, "%.2f", 1e3) << " |\n";
  }
  return o.str();
}

}  // namespace specserve::cli::bench_http
