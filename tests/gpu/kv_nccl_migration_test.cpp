// A sequence's KV moving between two GPU workers through the KV data plane
// (actors/kv_data_plane.h): greedy continuation on the receiving worker token for token the same
// as without the move, with the transport choose_kv_transport (kv/transport.h) picks.
//
// Each "worker" is an Engine on its own CudaBackend with its own KvDataPlane; the two planes are
// given two process ids (KvPlaneOptions::process), so they take the transport of two processes,
// and share an InProcessStore for the NCCL unique ids (a worker uses the scheduler's store).
//   - two GPUs (cuda:0 -> cuda:1): the channels join when the peers connect, the fetch goes over
//     NCCL (recv here, send on the source's thread as KvSendMsg makes it), the import checks every
//     block's checksum, and the output equals the unmoved run's;
//   - two GPUs, a source that never sends: the NCCL recv fails by its deadline and the fetch is
//     retried over UCX, with the same output; that channel is then not chosen again;
//   - one GPU (both workers on cuda:0, two communicators' worth of workers): NCCL refuses two ranks
//     of one group on one GPU ("Duplicate GPU detected"), so choose_kv_transport picks UCX, and
//     the KV of two CudaBackends on one device moves over it with the same output.
// Skips with the reason where there is no GPU, no NCCL, or (for the first two) one GPU only.
// NOTE: written on a machine without a GPU: it has not run on one yet (tools/gpu-check.sh runs it).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "actors/kv_data_plane.h"
#include "gpu/cuda_backend.h"
#include "gpu/nccl_communicator.h"
#include "model/communicator.h"
#include "model/model_fingerprint.h"
#include "model/model_loader.h"
#include "spec/engine.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

#define SKIP_WITHOUT_GPUS(n) \
  do { \
    if (nccl_version() == 0) GTEST_SKIP() << "this build has no NCCL (see gpu/CMakeLists.txt)"; \
    const int found_ = cuda_device_count(); \
    if (found_ < (n)) { \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << found_ \
                   << ((n) > 1 ? " (NCCL refuses two ranks of one group on one GPU)" : ""); \
    } \
  } while (0)

constexpr int32_t kMaxTokens = 24;
constexpr int kStepsBeforeMove = 6;

// One worker: a model on cuda:`device`, its engine and data plane.
struct Worker {
  std::unique_ptr<Backend> backend;
  LoadedModel model;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<KvDataPlane> plane;
  KvExportFormat format;
};

std::unique_ptr<Worker> make_worker(const std::string& name, int device, uint64_t process,
                                    std::shared_ptr<RendezvousStore> store) {
  auto w = std::make_unique<Worker>();
  auto b = make_cuda_backend(device);
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  if (!b.ok()) return nullptr;
  w->backend = std::move(*b);
  auto m = load_model(testing::default_model_path(), *w->backend, /*quiet=*/true);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  if (!m.ok()) return nullptr;
  w->model = std::move(*m);
  EngineOptions eo;
  eo.max_model_len = 512;
  eo.num_kv_blocks = 128;
  auto e = Engine::create(*w->model.model, w->model.tokenizer.get(), nullptr, eo);
  EXPECT_TRUE(e.ok()) << e.status().to_string();
  if (!e.ok()) return nullptr;
  w->engine = std::move(*e);
  KvPlaneOptions po;
  po.node = "local";
  po.cuda_device = device;
  po.process = process;
  po.nccl_store = std::move(store);
  po.nccl_join_timeout = seconds(60);
  auto p = KvDataPlane::create(name, po);
  EXPECT_TRUE(p.ok()) << p.status().to_string();
  if (!p.ok()) return nullptr;
  w->plane = std::move(*p);
  w->format = kv_export_format(w->engine->kv_storage(), model_fingerprint(*w->model.file));
  return w;
}

KvPeer peer_of(const KvDataPlane& p) {
  return KvPeer{p.name(), p.address(), p.place().node, p.place().process, p.place().cuda_device, p.place().nccl};
}

GenerateParams greedy(const std::vector<int32_t>& prompt) {
  GenerateParams p;
  p.prompt = prompt;
  p.max_tokens = kMaxTokens;
  p.sampling.temperature = 0;
  p.sampling.ignore_eos = true;
  return p;
}

std::vector<int32_t> prompt_tokens() {
  // Longer than one block (16 tokens) so the export holds full and partial blocks.
  return testing::default_tokenizer().encode(
      "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is", true, false);
}

// Steps `e` until it has no work, appending the tokens of sequence `id` to `out`.
void run_to_end(Engine& e, int64_t id, std::vector<int32_t>* out) {
  std::vector<SeqEvent> evs;
  for (int guard = 0; e.has_work() && guard < 10000; ++guard) {
    ASSERT_TRUE(e.step(&evs).ok());
    for (const SeqEvent& ev : evs) {
      if (ev.seq_id == id) out->insert(out->end(), ev.tokens.begin(), ev.tokens.end());
    }
    evs.clear();
  }
}

struct MoveResult {
  std::vector<int32_t> tokens;
  KvTransport chosen = KvTransport::kInProcess;  // what start_fetch chose
  KvTransport used = KvTransport::kInProcess;    // what delivered the bytes
  Status nccl_error;
  bool kv_loaded = false;  // loaded during add_migrated (an idle engine admits it at once)
};

// Runs the prompt on `src` for kStepsBeforeMove steps, moves the sequence with its KV to `dst`
// through the data planes, and finishes it there. `serve` = false: the source never posts its
// NCCL send (a stalled peer), and the fetch's deadline is short.
MoveResult move_and_continue(Worker& src, Worker& dst, bool serve = true) {
  MoveResult r;
  auto id = src.engine->add_request(greedy(prompt_tokens()));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  if (!id.ok()) return r;
  std::vector<SeqEvent> evs;
  for (int s = 0; s < kStepsBeforeMove && src.engine->has_work(); ++s) {
    EXPECT_TRUE(src.engine->step(&evs).ok());
    for (const SeqEvent& ev : evs) r.tokens.insert(r.tokens.end(), ev.tokens.begin(), ev.tokens.end());
    evs.clear();
  }
  auto ex = src.engine->export_sequence(*id);
  EXPECT_TRUE(ex.ok()) << ex.status().to_string();
  if (!ex.ok()) return r;
  EXPECT_GT(ex->num_cached, 16) << "the move should carry more than one block";
  std::vector<int32_t> cached = ex->prompt;
  cached.insert(cached.end(), ex->output.begin(), ex->output.end());
  cached.resize(static_cast<size_t>(ex->num_cached));
  auto offer = src.plane->offer(*src.backend, src.engine->kv_storage(), src.format, ex->blocks, ex->num_cached,
                                kv_tokens_hash(cached));
  EXPECT_TRUE(offer.ok()) << offer.status().to_string();
  if (!offer.ok()) return r;
  src.engine->remove_sequence(*id);
  const int64_t num_blocks = (offer->num_cached + dst.format.block_size - 1) / dst.format.block_size;
  auto f = dst.plane->start_fetch(*offer, dst.format, num_blocks, kv_deadline_after(serve ? seconds(20) : seconds(2)));
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  if (!f.ok()) return r;
  std::shared_ptr<KvFetch> fetch = *f;
  r.chosen = fetch->transport;
  // What the source does on KvSendMsg (actors/target_shard.cpp).
  if (serve && fetch->transport == KvTransport::kNccl) {
    Status st = src.plane->serve_send(offer->offer_id, dst.plane->name(), kv_deadline_after(seconds(20)));
    EXPECT_TRUE(st.ok()) << st.to_string();
  }
  std::thread t([fetch] { fetch->run(); });
  t.join();
  EXPECT_TRUE(fetch->status.ok()) << fetch->status.to_string();
  r.used = fetch->transport;
  r.nccl_error = fetch->nccl_error;
  GenerateParams p = greedy(ex->prompt);
  p.resume_output = ex->output;
  SequenceImport imp;
  imp.rng_state = ex->rng_state;
  imp.k = ex->k;
  imp.num_cached = offer->num_cached;
  auto load_status = std::make_shared<Status>(Status(StatusCode::kUnavailable, "load_kv not called"));
  Worker* d = &dst;
  imp.load_kv = [d, fetch, load_status](KvStorage& kv, std::span<const int32_t> blocks) {
    *load_status = d->plane->finish_fetch(*fetch, *d->backend, kv, d->format, blocks);
    d->plane->end_fetch(*fetch);
    return *load_status;
  };
  auto nid = dst.engine->add_migrated(std::move(p), std::move(imp), &r.kv_loaded);
  EXPECT_TRUE(nid.ok()) << nid.status().to_string();
  if (!nid.ok()) return r;
  run_to_end(*dst.engine, *nid, &r.tokens);
  // The KV must have been imported (a failed load_kv recomputes, which would hide a broken move).
  EXPECT_TRUE(load_status->ok()) << load_status->to_string();
  src.plane->release(offer->offer_id);
  return r;
}

// The same request on `w` without a move.
std::vector<int32_t> unmoved(Worker& w) {
  std::vector<int32_t> out;
  auto id = w.engine->add_request(greedy(prompt_tokens()));
  EXPECT_TRUE(id.ok()) << id.status().to_string();
  if (id.ok()) run_to_end(*w.engine, *id, &out);
  return out;
}

// Connects the two planes as KvPeersMsg would, then waits (bounded) until the channel from
// `src` to `dst` has joined when the places call for NCCL.
void connect(Worker& a, Worker& b) {
  a.plane->connect_peers({peer_of(*b.plane)}, seconds(10));
  b.plane->connect_peers({peer_of(*a.plane)}, seconds(10));
}

bool wait_for_nccl(Worker& src, Worker& dst, std::chrono::seconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (dst.plane->transport_from(src.plane->name()) == KvTransport::kNccl) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return false;
}

TEST(KvNcclMigration, TwoWorkersOnTwoGpusMoveKvOverNcclWithTheSameGreedyOutput) {
  SKIP_WITHOUT_GPUS(2);
  auto store = std::make_shared<InProcessStore>();
  auto src = make_worker("target_shard/0", 0, 1001, store);
  auto dst = make_worker("target_shard/1", 1, 1002, store);
  ASSERT_TRUE(src && dst);
  const std::vector<int32_t> want = unmoved(*src);
  ASSERT_EQ(want.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_EQ(unmoved(*dst), want) << "the two GPUs disagree without any move";
  connect(*src, *dst);
  ASSERT_TRUE(wait_for_nccl(*src, *dst, seconds(60))) << "the NCCL KV channel cuda:0 -> cuda:1 did not join";
  MoveResult r = move_and_continue(*src, *dst);
  EXPECT_EQ(kv_transport_name(r.chosen), std::string("nccl"));
  EXPECT_EQ(kv_transport_name(r.used), std::string("nccl")) << "nccl error: " << r.nccl_error.to_string();
  EXPECT_EQ(r.tokens, want);
  // And back the other way, on the other direction's channel.
  ASSERT_TRUE(wait_for_nccl(*dst, *src, seconds(60))) << "the NCCL KV channel cuda:1 -> cuda:0 did not join";
  MoveResult back = move_and_continue(*dst, *src);
  EXPECT_EQ(kv_transport_name(back.used), std::string("nccl")) << "nccl error: " << back.nccl_error.to_string();
  EXPECT_EQ(back.tokens, want);
}

TEST(KvNcclMigration, ASourceThatNeverSendsCostsOneRetryOverUcx) {
  SKIP_WITHOUT_GPUS(2);
  auto store = std::make_shared<InProcessStore>();
  auto src = make_worker("target_shard/0", 0, 1001, store);
  auto dst = make_worker("target_shard/1", 1, 1002, store);
  ASSERT_TRUE(src && dst);
  const std::vector<int32_t> want = unmoved(*src);
  connect(*src, *dst);
  ASSERT_TRUE(wait_for_nccl(*src, *dst, seconds(60))) << "the NCCL KV channel cuda:0 -> cuda:1 did not join";
  const auto t0 = std::chrono::steady_clock::now();
  MoveResult r = move_and_continue(*src, *dst, /*serve=*/false);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, seconds(30)) << "a stalled NCCL peer must not hang the fetch";
  EXPECT_EQ(kv_transport_name(r.chosen), std::string("nccl"));
  EXPECT_EQ(kv_transport_name(r.used), std::string("ucx"));
  EXPECT_EQ(r.nccl_error.code(), StatusCode::kDeadlineExceeded) << r.nccl_error.to_string();
  EXPECT_EQ(r.tokens, want);
  // The failed channel is not chosen again: the next move goes over UCX from the start.
  EXPECT_EQ(dst->plane->transport_from(src->plane->name()), KvTransport::kUcx);
  MoveResult again = move_and_continue(*src, *dst);
  EXPECT_EQ(kv_transport_name(again.chosen), std::string("ucx"));
  EXPECT_EQ(again.tokens, want);
}

TEST(KvNcclMigration, TwoWorkersOnOneGpuMoveKvOverUcxWithTheSameGreedyOutput) {
  SKIP_WITHOUT_GPUS(1);
  auto store = std::make_shared<InProcessStore>();
  auto src = make_worker("target_shard/0", 0, 1001, store);
  auto dst = make_worker("target_shard/1", 0, 1002, store);
  ASSERT_TRUE(src && dst);
  EXPECT_TRUE(src->plane->place().nccl) << "a GPU worker in a build with NCCL joins channels with GPU peers";
  const std::vector<int32_t> want = unmoved(*src);
  ASSERT_EQ(want.size(), static_cast<size_t>(kMaxTokens));
  connect(*src, *dst);
  // NOTE: same node, same ordinal: no NCCL group is formed at all (NCCL would refuse it).
  EXPECT_EQ(choose_kv_transport(src->plane->place(), dst->plane->place()), KvTransport::kUcx);
  MoveResult r = move_and_continue(*src, *dst);
  EXPECT_EQ(kv_transport_name(r.used), std::string("ucx"));
  EXPECT_EQ(r.tokens, want);
}

}  // namespace
}  // namespace specserve
