// Helpers shared by the speculative-decoding tests: synthetic models written into the test's
// temp dir and loaded on a one-thread CPU backend, and a driver that runs an Engine to the end
// and collects each request's output.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/gguf.h"
#include "model/synthetic_model.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "spec/engine.h"

namespace specserve::spec_testing {

/// The one CPU backend of the test process (one thread: ctest runs tests in parallel).
inline Backend& backend() {
  static std::unique_ptr<Backend> b = make_cpu_backend(1);
  return *b;
}

inline std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "specserve_spec_" + std::to_string(::getpid()) + "_" + stem + ".gguf";
}

/// A model loaded from a file this process wrote (the file is removed once loaded).
struct LoadedModel {
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

inline LoadedModel load_file(const std::string& path) {
  LoadedModel m;
  auto file = GgufFile::open(path);
  if (!file.ok()) {
    ADD_FAILURE() << file.status().to_string();
    return m;
  }
  auto t = Transformer::load(*file, backend());
  if (!t.ok()) {
    ADD_FAILURE() << t.status().to_string();
    return m;
  }
  m.model = std::move(*t);
  auto tok = Tokenizer::from_gguf(*file);
  if (!tok.ok()) {
    ADD_FAILURE() << tok.status().to_string();
    return m;
  }
  m.tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
  ::unlink(path.c_str());
  return m;
}

inline LoadedModel make_target(const SyntheticModelSpec& spec, const std::string& stem) {
  const std::string path = temp_path(stem);
  Status st = write_synthetic_llama(spec, path);
  if (!st.ok()) {
    ADD_FAILURE() << st.to_string();
    return {};
  }
  return load_file(path);
}

inline LoadedModel make_draft(const SyntheticModelSpec& target, const SyntheticDraftSpec& draft, const std::string& stem) {
  const std::string path = temp_path(stem);
  Status st = write_synthetic_draft(target, draft, path);
  if (!st.ok()) {
    ADD_FAILURE() << st.to_string();
    return {};
  }
  return load_file(path);
}

/// Everything one request produced.
struct RequestResult {
  std::vector<int32_t> tokens;
  std::vector<SampleResult> logprobs;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int32_t stop_token = -1;   ///< SeqEvent::stop_token of the finishing event
  std::string stop_string;   ///< SeqEvent::stop_string of the finishing event
  SpecStats spec;
  int num_events_after_finish = 0;
};

struct RunResult {
  std::vector<RequestResult> requests;  ///< in the order given
  EngineStats stats;
  int32_t final_blocks_used = -1;       ///< KV blocks still held once every request finished
};

/// Runs `requests` through a fresh engine (all queued at once; opts.max_num_seqs sets the batch)
/// until every one finished. `on_step`, when given, runs after each step with the engine.
template <typename OnStep>
RunResult run_engine(Transformer& target, const Tokenizer* tokenizer, Proposer* proposer, EngineOptions opts,
                     const std::vector<GenerateParams>& requests, OnStep on_step) {
  RunResult out;
  auto engine = Engine::create(target, tokenizer, proposer, opts);
  if (!engine.ok()) {
    ADD_FAILURE() << engine.status().to_string();
    return out;
  }
  Engine& e = **engine;
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = e.add_request(requests[i]);
    if (!id.ok()) {
      ADD_FAILURE() << "request " << i << ": " << id.status().to_string();
      return out;
    }
    index[*id] = i;
  }
  out.requests.resize(requests.size());
  int64_t guard = 0;
  while (e.has_work()) {
    std::vector<SeqEvent> events;
    Status st = e.step(&events);
    if (!st.ok()) {
      ADD_FAILURE() << st.to_string();
      return out;
    }
    for (SeqEvent& ev : events) {
      RequestResult& r = out.requests[index.at(ev.seq_id)];
      if (r.finish != FinishReason::kNone) ++r.num_events_after_finish;
      r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      r.logprobs.insert(r.logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      r.text += ev.text;
      if (ev.finish != FinishReason::kNone) {
        r.finish = ev.finish;
        r.stop_token = ev.stop_token;
        r.stop_string = ev.stop_string;
        auto s = e.take_finished_stats(ev.seq_id);
        if (s) r.spec = *s;
      }
    }
    on_step(e);
    if (++guard > 1000000) {
      ADD_FAILURE() << "engine does not finish";
      return out;
    }
  }
  out.stats = e.stats();
  out.final_blocks_used = e.block_pool().num_blocks() - e.block_pool().num_free();
  return out;
}

inline RunResult run_engine(Transformer& target, const Tokenizer* tokenizer, Proposer* proposer, EngineOptions opts,
                            const std::vector<GenerateParams>& requests) {
  return run_engine(target, tokenizer, proposer, opts, requests, [](Engine&) {});
}

}  // namespace specserve::spec_testing
