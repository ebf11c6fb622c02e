#include "tests/spec/spec_test_util.h"
#include "spec/model_drafter.h"
#include "spec/ngram_proposer.h"
#include <random>
#include <chrono>
#include <cstdlib>
namespace specserve { namespace {
using namespace spec_testing;
TEST(Explore, Acceptance) {
  SyntheticModelSpec s;
  s.num_layers = 3;
  s.residual_scale = std::getenv("RS") ? std::atof(std::getenv("RS")) : 0.5f;
  s.logit_scale = std::getenv("LS") ? std::atof(std::getenv("LS")) : 4.0f;
  float noise = std::getenv("NZ") ? std::atof(std::getenv("NZ")) : 0.05f;
  auto t0 = std::chrono::steady_clock::now();
  LoadedModel tgt = make_target(s, "t");
  SyntheticDraftSpec ds; ds.num_layers = 1; ds.noise = noise;
  LoadedModel dr = make_draft(s, ds, "d");
  std::mt19937 rng(7);
  std::vector<GenerateParams> reqs;
  for (int i = 0; i < 50; ++i) {
    GenerateParams p; p.sampling.temperature = 0; p.max_tokens = 40;
    int len = 1 + rng() % 60;
    for (int j = 0; j < len; ++j) p.prompt.push_back(rng() % 512);
    reqs.push_back(p);
  }
  EngineOptions o; o.max_num_seqs = 8; o.num_speculative_tokens = 4; o.adaptive_k = false;
  auto base = run_engine(*tgt.model, nullptr, nullptr, o, reqs);
  auto t1 = std::chrono::steady_clock::now();
  DrafterOptions dopt; auto dm = ModelDrafter::create(*dr.model, dopt);
  DrafterOptions lopt; lopt.name = "layer_skip"; lopt.num_layers = 1; auto ls = ModelDrafter::create(*tgt.model, lopt);
  NgramProposer ng(1, 3);
  std::set<int32_t> distinct; for (auto& r : base.requests) for (auto t : r.tokens) distinct.insert(t);
  printf("distinct output tokens %zu; base %.3fs\n", distinct.size(), std::chrono::duration<double>(t1-t0).count());
  for (auto& r : std::vector<RequestResult>(base.requests.begin(), base.requests.begin()+3)) { for (auto t : r.tokens) printf("%d ", t); printf("\n"); }
  for (Proposer* p : std::vector<Proposer*>{dm->get(), ls->get(), &ng}) {
    auto a = std::chrono::steady_clock::now();
    auto r = run_engine(*tgt.model, nullptr, p, o, reqs);
    int same = 0; for (size_t i = 0; i < reqs.size(); ++i) same += r.requests[i].tokens == base.requests[i].tokens;
    printf("%s: acc rate %.3f drafts %ld same %d/%zu %.3fs\n", p->name().c_str(), r.stats.spec.acceptance_rate(), (long)r.stats.spec.num_drafts, same, reqs.size(),
      std::chrono::duration<double>(std::chrono::steady_clock::now()-a).count());
  }
}
}}
