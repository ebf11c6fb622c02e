#include "cpu/tensor_parallel.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "cpu/cpu_backend.h"
#include "model/model_config.h"

namespace specserve {

// One rank >= 1: a thread running the tasks rank 0 posts, in order, on its own shard.
struct ThreadedTensorParallel::Peer {
  int rank = 0;
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<Status(Peer&)>> tasks;
  int pending = 0;      // posted and not finished
  Status first_error;   // of the tasks since the last wait
  bool stop = false;
  // Owned by the thread (created and destroyed there, so OpenMP settings are its own).
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Transformer> model;
  std::map<int32_t, std::unique_ptr<KvStorage>> kvs;
  ForwardOutput out;

  void post(std::function<Status(Peer&)> task) {
    {
      std::lock_guard<std::mutex> lock(mu);
      tasks.push_back(std::move(task));
      ++pending;
    }
    cv.notify_all();
  }
  // Waits for every posted task; returns the first error among them (naming the rank).
  Status wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
    Status st = std::move(first_error);
    first_error = Status();
    if (st.ok()) return st;
    return Status(st.code(), "tensor parallel rank " + std::to_string(rank) + ": " + st.message());
  }
  void run() {
    for (;;) {
      std::function<Status(Peer&)> task;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !tasks.empty(); });
        if (tasks.empty()) break;  // stop, with nothing left to run
        task = std::move(tasks.front());
        tasks.pop_front();
      }
      Status st = task(*this);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!st.ok() && first_error.ok()) first_error = std::move(st);
        --pending;
      }
      cv.notify_all();
    }
    kvs.clear();
    model.reset();
    comm.reset();
    backend.reset();
  }
};

Expected<std::unique_ptr<ThreadedTensorParallel>> ThreadedTensorParallel::create(const GgufFile& file,
                                                                                  const ThreadedTensorParallelOptions& o) {
  auto cfg = ModelConfig::from_gguf(file);
  if (!cfg.ok()) return cfg.status();
  auto shard = tensor_parallel_shard(*cfg, 0, o.tp_size);
  if (!shard.ok()) return shard.status();
  const int total = o.num_threads > 0 ? o.num_threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int per_rank = std::max(1, total / o.tp_size);
  // A fresh key namespace per group, so groups in one process never meet each other's keys.
  static std::atomic<int> groups{0};
  GlooOptions gloo = o.gloo;
  gloo.prefix += "/threaded-" + std::to_string(groups++);
  auto store = std::make_shared<InProcessStore>();

  std::unique_ptr<ThreadedTensorParallel> g(new ThreadedTensorParallel());
  // Each rank connects and loads in parallel: the rendezvous needs every rank at once.
  for (int r = 1; r < o.tp_size; ++r) {
    auto p = std::make_unique<Peer>();
    p->rank = r;
    p->post([&file, o, gloo, store, per_rank, r](Peer& self) -> Status {
      self.backend = make_cpu_backend(per_rank);
      auto comm = make_gloo_communicator(r, o.tp_size, store, gloo);
      if (!comm.ok()) return comm.status();
      self.comm = std::move(*comm);
      LoadOptions lo;
      lo.max_layers = o.max_layers;
      lo.tp_rank = r;
      lo.tp_size = o.tp_size;
      lo.communicator = self.comm.get();
      auto m = Transformer::load(file, *self.backend, lo);
      if (!m.ok()) return m.status();
      self.model = std::move(*m);
      return Status();
    });
    Peer* raw = p.get();
    p->thread = std::thread([raw] { raw->run(); });
    g->peers_.push_back(std::move(p));
  }
  Status own = [&]() -> Status {
    g->backend_ = make_cpu_backend(per_rank);
    auto comm = make_gloo_communicator(0, o.tp_size, store, gloo);
    if (!comm.ok()) return comm.status();
    g->comm_ = std::move(*comm);
    LoadOptions lo;
    lo.max_layers = o.max_layers;
    lo.tp_rank = 0;
    lo.tp_size = o.tp_size;
    lo.communicator = g->comm_.get();
    auto m = Transformer::load(file, *g->backend_, lo);
    if (!m.ok()) return m.status();
    g->model_ = std::move(*m);
    return Status();
  }();
  Status theirs = g->wait_peers();
  if (!own.ok()) return Status(own.code(), "tensor parallel rank 0: " + own.message());
  if (!theirs.ok()) return theirs;
  g->model_->set_tensor_parallel_peers(g.get());
  return g;
}

ThreadedTensorParallel::~ThreadedTensorParallel() {
  if (model_) model_->set_tensor_parallel_peers(nullptr);  // a taken model keeps a dangling link, unused
  for (auto& p : peers_) {
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->stop = true;
    }
    p->cv.notify_all();
  }
  for (auto& p : peers_) {
    if (p->thread.joinable()) p->thread.join();
  }
  model_.reset();
  comm_.reset();
  backend_.reset();
}

Status ThreadedTensorParallel::wait_peers() {
  Status first;
  for (auto& p : peers_) {
    Status st = p->wait();
    if (first.ok() && !st.ok()) first = std::move(st);
  }
  return first;
}

Status ThreadedTensorParallel::create_kv(int32_t kv_id, int64_t num_blocks, int64_t block_size, int64_t num_layers) {
  for (auto& p : peers_) {
    p->post([=](Peer& self) -> Status {
      auto kv = self.model->create_kv(num_blocks, block_size, num_layers);
      if (!kv.ok()) return kv.status();
      self.kvs[kv_id] = std::move(*kv);
      return Status();
    });
  }
  return wait_peers();
}

void ThreadedTensorParallel::start_forward(int32_t kv_id, const ForwardBatch& batch) {
  auto shared = std::make_shared<const ForwardBatch>(batch);
  for (auto& p : peers_) {
    p->post([kv_id, shared](Peer& self) -> Status {
      auto it = self.kvs.find(kv_id);
      if (it == self.kvs.end()) return invalid_argument("no kv storage " + std::to_string(kv_id));
      return self.model->forward(*shared, *it->second, &self.out);
    });
  }
}

Status ThreadedTensorParallel::finish_forward() { return wait_peers(); }

Status ThreadedTensorParallel::kv_copy_slots(int32_t kv_id, const int32_t* src, const int32_t* dst, int64_t n) {
  auto s = std::make_shared<std::vector<int32_t>>(src, src + n);
  auto d = std::make_shared<std::vector<int32_t>>(dst, dst + n);
  for (auto& p : peers_) {
    p->post([kv_id, s, d](Peer& self) -> Status {
      auto it = self.kvs.find(kv_id);
      if (it == self.kvs.end()) return invalid_argument("no kv storage " + std::to_string(kv_id));
      return self.model->kv_copy_slots(*it->second, s->data(), d->data(), static_cast<int64_t>(s->size()));
    });
  }
  return wait_peers();
}

}  // namespace specserve
