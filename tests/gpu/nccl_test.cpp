// The NCCL communicator (gpu/nccl_communicator.h) and KV channel (gpu/nccl_kv_channel.h).
// Status: compiled and skipped on the machines without a GPU where it was written; it has not
// run on a GPU yet (tools/gpu-check.sh runs it).
//
// Ranks are threads of this process, one per CUDA device, sharing an InProcessStore; their
// buffers are CudaBackend buffers (device memory), and some calls pass host memory (the staged
// path). What is checked:
//   - one rank on one GPU: all_reduce_sum / broadcast / barrier through NCCL leave the bits as
//     they are (a group of one), argument errors leave the communicator usable;
//   - 2 to 4 ranks on as many GPUs: all_reduce_sum gives every rank the same bits, equal to the
//     rank-order fp32 sum ((d_0 + d_1) + d_2) + ... computed here on the host, for sizes that
//     cross NCCL's chunking; the values mix magnitudes (1e8 and 1) so that another summation
//     order gives other bits from 3 ranks on (with 2 ranks every order is the same: a + b = b + a);
//     broadcast from the last rank; barrier;
//   - the KV channel moves blocks between two GPUs (device and host buffers) with every block's
//     XXH3 checksum intact, and a whole KV export between two CudaBackends (export_kv_blocks ->
//     send -> recv -> import_kv_blocks, which checks the checksums) lands bit-identical;
//   - failures end by the deadline: a peer that never joins, a peer that stops calling
//     all_reduce_sum, a recv whose sender never sends — then the object reports failure.
// Without a CUDA device (CI) every test that needs one skips with the reason; the argument and
// no-device checks run everywhere. NCCL refuses two ranks of one group on one GPU, so the
// multi-rank tests skip with "needs 2 CUDA devices, found N" on a single-GPU machine.
#include "gpu/nccl_communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/nccl_kv_channel.h"
#include "kv/transfer.h"
#include "model/backend.h"
#include "model/communicator.h"

namespace specserve {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#define SKIP_WITHOUT_NCCL() \
  do { \
    if (nccl_version() == 0) GTEST_SKIP() << "this build has no NCCL (see gpu/CMakeLists.txt)"; \
  } while (0)

#define SKIP_WITHOUT_CUDA() \
  do { \
    SKIP_WITHOUT_NCCL(); \
    auto info_ = cuda_device_info(0); \
    if (!info_.ok()) GTEST_SKIP() << "no CUDA device: " << info_.status().to_string(); \
  } while (0)

#define SKIP_WITHOUT_CUDA_DEVICES(n) \
  do { \
    SKIP_WITHOUT_CUDA(); \
    const int found_ = cuda_device_count(); \
    if (found_ < (n)) { \
      GTEST_SKIP() << "needs " << (n) << " CUDA devices, found " << found_ \
                   << " (NCCL refuses two ranks of one group on one GPU)"; \
    } \
  } while (0)

// Runs fn(rank) on `p` threads at once and joins them.
void run_ranks(int p, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng) * scale;
  return v;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::unique_ptr<Backend> backend_on(int device) {
  auto b = make_cuda_backend(device);
  SPECSERVE_CHECK(b.ok(), b.status().to_string());
  return std::move(*b);
}

// ---- everywhere (no device needed) ----

TEST(NcclBuild, WithoutNcclTheFactoriesSaySo) {
  if (nccl_version() != 0) GTEST_SKIP() << "this build has NCCL " << nccl_version() << "; this checks the stub";
  auto store = std::make_shared<InProcessStore>();
  auto c = make_nccl_communicator(0, 1, 0, store);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(c.status().message().find("no NCCL"), std::string::npos) << c.status().to_string();
  auto k = make_nccl_kv_channel(0, 2, 0, store);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kUnsupported);
}

TEST(NcclCommunicator, BadArgumentsAreRefusedBeforeTouchingADevice) {
  SKIP_WITHOUT_NCCL();
  auto store = std::make_shared<InProcessStore>();
  auto expect_invalid = [](const Status& st, const std::string& needle) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.to_string();
  };
  expect_invalid(make_nccl_communicator(0, 0, 0, store).status(), "size = 0");
  expect_invalid(make_nccl_communicator(2, 2, 0, store).status(), "rank = 2");
  expect_invalid(make_nccl_communicator(-1, 2, 0, store).status(), "rank = -1");
  expect_invalid(make_nccl_communicator(0, 1, 0, nullptr).status(), "store is null");
  NcclOptions zero;
  zero.timeout = milliseconds(0);
  expect_invalid(make_nccl_communicator(0, 1, 0, store, zero).status(), "timeout");
  expect_invalid(make_nccl_kv_channel(3, 2, 0, store).status(), "rank = 3");
}

TEST(NcclCommunicator, WithoutADeviceTheFactoryFailsClearly) {
  SKIP_WITHOUT_NCCL();
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present; this checks the no-device error";
  NcclOptions o;
  o.prefix = "nodev";
  auto c = make_nccl_communicator(0, 1, 0, std::make_shared<InProcessStore>(), o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status().to_string();
  EXPECT_NE(c.status().message().find("no CUDA device"), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().message().find("nccl group 'nodev' rank 0/1 on cuda:0"), std::string::npos)
      << c.status().to_string();
  auto k = make_nccl_kv_channel(0, 2, 0, std::make_shared<InProcessStore>(), o);
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kUnavailable) << k.status().to_string();
}

// ---- one GPU ----

TEST(NcclCommunicator, OneRankOnOneGpu) {
  SKIP_WITHOUT_CUDA();
  std::printf("[ info ] NCCL %d\n", nccl_version());
  auto backend = backend_on(0);
  NcclOptions o;
  o.prefix = "solo";
  o.timeout = milliseconds(20000);
  auto c = make_nccl_communicator(0, 1, 0, std::make_shared<InProcessStore>(), o);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Communicator& comm = **c;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);

  for (int64_t n : {int64_t{1}, int64_t{1000}, (int64_t{1} << 20) + 3}) {
    std::vector<float> x = random_floats(static_cast<size_t>(n), 7u + static_cast<uint32_t>(n), 3.0f);
    x[0] = -0.0f;
    if (n > 1) x[1] = 1e-40f;  // subnormal: a copy and a one-rank sum keep it
    auto buf = backend->alloc(n * 4);
    backend->upload(*buf, x.data(), n * 4);
    backend->synchronize();
    ASSERT_TRUE(comm.all_reduce_sum(buf->f32(), n).ok()) << "n = " << n;
    std::vector<float> got(static_cast<size_t>(n));
    backend->download(got.data(), *buf, n * 4);
    EXPECT_TRUE(same_bits(got, x)) << "device all_reduce_sum of one rank changed bits, n = " << n;

    std::vector<float> host = x;  // host memory: staged through the device
    ASSERT_TRUE(comm.all_reduce_sum(host.data(), n).ok());
    EXPECT_TRUE(same_bits(host, x)) << "host all_reduce_sum, n = " << n;
  }

  std::vector<uint8_t> bytes = random_bytes(4099, 3);
  auto bbuf = backend->alloc(4099);
  backend->upload(*bbuf, bytes.data(), 4099);
  backend->synchronize();
  ASSERT_TRUE(comm.broadcast(bbuf->data(), 4099, 0).ok());
  std::vector<uint8_t> bgot(4099);
  backend->download(bgot.data(), *bbuf, 4099);
  EXPECT_EQ(bgot, bytes);
  std::vector<uint8_t> hbytes = bytes;
  ASSERT_TRUE(comm.broadcast(hbytes.data(), 4099, 0).ok());
  EXPECT_EQ(hbytes, bytes);
  EXPECT_TRUE(comm.barrier().ok());

  // Argument errors are refused without breaking the group.
  EXPECT_EQ(comm.broadcast(bbuf->data(), 16, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(comm.all_reduce_sum(nullptr, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(comm.all_reduce_sum(nullptr, 0).ok());
  EXPECT_TRUE(comm.barrier().ok()) << "an argument error must not break the communicator";
}

TEST(NcclCommunicator, APeerThatNeverJoinsFailsByTheDeadline) {
  SKIP_WITHOUT_CUDA();
  NcclOptions o;
  o.prefix = "lonely";
  o.timeout = milliseconds(2000);
  auto store = std::make_shared<InProcessStore>();
  // Rank 0 publishes the id and waits for rank 1, which never comes.
  auto t0 = Clock::now();
  auto c = make_nccl_communicator(0, 2, 0, store, o);
  auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded) << c.status().to_string();
  EXPECT_NE(c.status().message().find("'lonely' rank 0/2"), std::string::npos) << c.status().to_string();
  EXPECT_LT(waited.count(), 2000 + 15000) << "the join must end near its 2 s timeout";
  std::printf("[ info ] rank 0 without its peer gave up after %lld ms: %s\n", static_cast<long long>(waited.count()),
              c.status().to_string().c_str());

  // Rank 1 of a group whose rank 0 never publishes an id.
  NcclOptions o1 = o;
  o1.prefix = "no_root";
  t0 = Clock::now();
  auto c1 = make_nccl_communicator(1, 2, 0, store, o1);
  waited = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  ASSERT_FALSE(c1.ok());
  EXPECT_EQ(c1.status().code(), StatusCode::kDeadlineExceeded) << c1.status().to_string();
  EXPECT_NE(c1.status().message().find("no_root/nccl_id"), std::string::npos) << c1.status().to_string();
  EXPECT_LT(waited.count(), 2000 + 5000);
}

// ---- several GPUs ----

TEST(NcclCommunicator, RanksOnSeparateGpusAllReduceInRankOrder) {
  SKIP_WITHOUT_CUDA_DEVICES(2);
  const int p = std::min(cuda_device_count(), 4);
  if (p == 2) std::printf("[ info ] 2 ranks: any summation order gives a + b; rank order is checked from 3 GPUs on\n");
  const std::vector<int64_t> sizes = {1, 4097, (int64_t{1} << 20) + 5};
  // data[r][k]: rank r's input of size k; magnitudes alternate so that order changes the bits.
  std::vector<std::vector<std::vector<float>>> data(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      const float scale = (r % 2 == 0) ? 1e8f : 1.0f;
      data[r].push_back(random_floats(static_cast<size_t>(sizes[k]), 100u * static_cast<uint32_t>(r) + k, scale));
    }
  }
  std::vector<std::vector<float>> want(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    want[k] = data[0][k];
    for (int r = 1; r < p; ++r)
      for (size_t i = 0; i < want[k].size(); ++i) want[k][i] += data[r][k][i];
  }
  size_t order_sensitive = 0;  // elements where the reverse order gives other bits
  if (p >= 3) {
    for (size_t i = 0; i < want.back().size(); ++i) {
      float rev = data[p - 1].back()[i];
      for (int r = p - 2; r >= 0; --r) rev += data[r].back()[i];
      if (std::memcmp(&rev, &want.back()[i], 4) != 0) ++order_sensitive;
    }
    std::printf("[ info ] %d ranks: %zu of %zu elements differ when summed in reverse order\n", p, order_sensitive,
                want.back().size());
    EXPECT_GT(order_sensitive, 0u) << "the test data do not distinguish summation orders";
  }

  std::vector<std::string> errors(static_cast<size_t>(p));
  std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(p));
  std::vector<std::vector<uint8_t>> bcast(static_cast<size_t>(p));
  const std::vector<uint8_t> bcast_want = random_bytes((1u << 20) + 7, 11);
  auto store = std::make_shared<InProcessStore>();
  run_ranks(p, [&](int r) {
    auto fail = [&](const std::string& what) { errors[r] = "rank " + std::to_string(r) + ": " + what; };
    auto backend = backend_on(r);
    NcclOptions o;
    o.prefix = "tp_order";
    o.timeout = milliseconds(30000);
    auto c = make_nccl_communicator(r, p, r, store, o);
    if (!c.ok()) return fail(c.status().to_string());
    Communicator& comm = **c;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const int64_t n = sizes[k];
      auto buf = backend->alloc(n * 4);
      backend->upload(*buf, data[r][k].data(), n * 4);
      backend->synchronize();
      if (Status st = comm.all_reduce_sum(buf->f32(), n); !st.ok()) return fail(st.to_string());
      got[r].emplace_back(static_cast<size_t>(n));
      backend->download(got[r].back().data(), *buf, n * 4);
    }
    std::vector<float> host = data[r][1];  // the staged path, once
    if (Status st = comm.all_reduce_sum(host.data(), static_cast<int64_t>(host.size())); !st.ok()) {
      return fail(st.to_string());
    }
    got[r].push_back(std::move(host));
    const int64_t nb = static_cast<int64_t>(bcast_want.size());
    auto bb = backend->alloc(nb);
    if (r == p - 1) backend->upload(*bb, bcast_want.data(), nb);
    backend->synchronize();
    if (Status st = comm.broadcast(bb->data(), nb, p - 1); !st.ok()) return fail(st.to_string());
    bcast[r].resize(bcast_want.size());
    backend->download(bcast[r].data(), *bb, nb);
    if (Status st = comm.barrier(); !st.ok()) return fail(st.to_string());
  });
  for (const auto& e : errors) ASSERT_TRUE(e.empty()) << e;
  for (int r = 0; r < p; ++r) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      EXPECT_TRUE(same_bits(got[r][k], got[0][k])) << "rank " << r << " and rank 0 differ, n = " << sizes[k];
      EXPECT_TRUE(same_bits(got[r][k], want[k])) << "rank " << r << " is not the rank-order sum, n = " << sizes[k];
    }
    EXPECT_TRUE(same_bits(got[r][sizes.size()], want[1])) << "rank " << r << ", host memory";
    EXPECT_EQ(bcast[r], bcast_want) << "rank " << r << ": broadcast from rank " << p - 1;
  }
}

TEST(NcclCommunicator, APeerThatStopsCallingFailsByTheDeadline) {
  SKIP_WITHOUT_CUDA_DEVICES(2);
  auto store = std::make_shared<InProcessStore>();
  Status rank0_reduce, rank0_after, rank1_join;
  long long waited_ms = 0;
  std::promise<void> rank0_done;
  auto rank0_done_f = rank0_done.get_future().share();
  run_ranks(2, [&](int r) {
    auto backend = backend_on(r);
    NcclOptions o;
    o.prefix = "stall";
    o.timeout = milliseconds(3000);
    auto c = make_nccl_communicator(r, 2, r, store, o);
    if (r == 1) {
      rank1_join = c.status();
      rank0_done_f.wait();  // joined, then never calls a collective; destroyed after rank 0 gave up
      return;
    }
    if (!c.ok()) {
      rank0_reduce = c.status();
      rank0_done.set_value();
      return;
    }
    auto buf = backend->alloc(4096 * 4);
    backend->synchronize();
    const auto t0 = Clock::now();
    rank0_reduce = (*c)->all_reduce_sum(buf->f32(), 4096);
    waited_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
    rank0_after = (*c)->barrier();
    rank0_done.set_value();
  });
  ASSERT_TRUE(rank1_join.ok()) << rank1_join.to_string();
  EXPECT_EQ(rank0_reduce.code(), StatusCode::kDeadlineExceeded) << rank0_reduce.to_string();
  EXPECT_NE(rank0_reduce.message().find("'stall' rank 0/2"), std::string::npos) << rank0_reduce.to_string();
  EXPECT_LT(waited_ms, 3000 + 10000);
  EXPECT_EQ(rank0_after.code(), StatusCode::kUnavailable) << rank0_after.to_string();
  EXPECT_NE(rank0_after.message().find("failed earlier"), std::string::npos) << rank0_after.to_string();
  std::printf("[ info ] all_reduce_sum without its peer ended after %lld ms: %s\n", waited_ms,
              rank0_reduce.to_string().c_str());
}

TEST(NcclKvChannel, BlocksMoveBetweenGpusWithChecksums) {
  SKIP_WITHOUT_CUDA_DEVICES(2);
  constexpr int64_t kBlockBytes = 16 * 1024, kBlocks = 37, kBytes = kBlockBytes * kBlocks;
  const std::vector<uint8_t> forward = random_bytes(kBytes, 21), backward = random_bytes(kBytes, 22);
  std::vector<uint64_t> forward_sums, backward_sums;
  for (int64_t b = 0; b < kBlocks; ++b) {
    forward_sums.push_back(kv_block_checksum(forward.data() + b * kBlockBytes, kBlockBytes));
    backward_sums.push_back(kv_block_checksum(backward.data() + b * kBlockBytes, kBlockBytes));
  }
  std::vector<uint8_t> got_forward(kBytes), got_backward(kBytes);
  std::vector<std::string> errors(2);
  Status self_send;
  bool failed_after_bad_args = true;
  auto store = std::make_shared<InProcessStore>();
  run_ranks(2, [&](int r) {
    auto fail = [&](const std::string& what) { errors[r] = "rank " + std::to_string(r) + ": " + what; };
    auto backend = backend_on(r);
    NcclOptions o;
    o.prefix = "kv";
    o.timeout = milliseconds(30000);
    auto ch = make_nccl_kv_channel(r, 2, r, store, o);
    if (!ch.ok()) return fail(ch.status().to_string());
    NcclKvChannel& c = **ch;
    const auto deadline = Clock::now() + milliseconds(30000);
    auto dev = backend->alloc(kBytes);
    if (r == 0) {
      self_send = c.send(dev->data(), 16, 0, deadline);
      failed_after_bad_args = c.failed();
      // rank 0 -> rank 1, device to device (zero copy)
      backend->upload(*dev, forward.data(), kBytes);
      backend->synchronize();
      if (Status st = c.send(dev->data(), kBytes, 1, deadline); !st.ok()) return fail(st.to_string());
      // rank 1 -> rank 0, host to host (staged on both sides)
      if (Status st = c.recv(got_backward.data(), kBytes, 1, deadline); !st.ok()) return fail(st.to_string());
    } else {
      if (Status st = c.recv(dev->data(), kBytes, 0, deadline); !st.ok()) return fail(st.to_string());
      backend->download(got_forward.data(), *dev, kBytes);
      if (Status st = c.send(backward.data(), kBytes, 0, deadline); !st.ok()) return fail(st.to_string());
    }
    if (Status st = c.send(nullptr, 0, 1 - r, deadline); !st.ok()) return fail("zero bytes: " + st.to_string());
    if (c.failed()) fail("failed() after good transfers");
  });
  for (const auto& e : errors) ASSERT_TRUE(e.empty()) << e;
  EXPECT_EQ(self_send.code(), StatusCode::kInvalidArgument) << self_send.to_string();
  EXPECT_FALSE(failed_after_bad_args) << "an argument error must not fail the channel";
  for (int64_t b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(kv_block_checksum(got_forward.data() + b * kBlockBytes, kBlockBytes), forward_sums[b])
        << "block " << b << " damaged, device to device";
    EXPECT_EQ(kv_block_checksum(got_backward.data() + b * kBlockBytes, kBlockBytes), backward_sums[b])
        << "block " << b << " damaged, host to host";
  }
}

// The data-plane use: a sequence's KV exported from one CudaBackend, moved over the channel and
// imported into another GPU's CudaBackend (import_kv_blocks verifies every block's checksum).
TEST(NcclKvChannel, AKvExportMovesBetweenTwoCudaBackends) {
  SKIP_WITHOUT_CUDA_DEVICES(2);
  constexpr int64_t kLayers = 3, kBlocks = 12, kBlockSize = 16, kKvDim = 64;
  const std::vector<int32_t> src_blocks = {7, 2, 9, 4, 0}, dst_blocks = {1, 3, 5, 8, 11};
  const int64_t n = static_cast<int64_t>(src_blocks.size()), num_tokens = 4 * kBlockSize + 5;
  const uint64_t fingerprint = 0x5eedf00dull;
  std::vector<float> content, landed;
  std::vector<std::string> errors(2);
  std::promise<int64_t> export_bytes;  // rank 0 -> rank 1: the export's size (an actor message's job)
  auto export_bytes_f = export_bytes.get_future().share();
  bool announced = false;  // rank 0's thread only
  auto store = std::make_shared<InProcessStore>();
  run_ranks(2, [&](int r) {
    auto fail = [&](const std::string& what) {
      errors[r] = "rank " + std::to_string(r) + ": " + what;
      if (r == 0 && !announced) {  // rank 1 waits for the size: tell it rank 0 failed
        export_bytes.set_value(-1);
        announced = true;
      }
    };
    auto backend = backend_on(r);
    auto kv = backend->create_kv_storage(kLayers, kBlocks, kBlockSize, kKvDim);
    if (!kv.ok()) return fail(kv.status().to_string());
    const KvExportFormat format = kv_export_format(**kv, fingerprint);
    const int64_t block_bytes = kv_block_bytes(**kv, 0, kLayers);
    NcclOptions o;
    o.prefix = "kv_export";
    o.timeout = milliseconds(30000);
    auto ch = make_nccl_kv_channel(r, 2, r, store, o);
    if (!ch.ok()) return fail(ch.status().to_string());
    const auto deadline = Clock::now() + milliseconds(30000);
    if (r == 0) {
      content = random_floats(static_cast<size_t>(n * block_bytes / 4), 31, 1.0f);
      backend->kv_import_blocks(**kv, 0, kLayers, src_blocks.data(), n, content.data());  // fill the blocks
      backend->synchronize();
      std::vector<uint8_t> wire(static_cast<size_t>(kv_export_bytes(format, n)));
      auto h = export_kv_blocks(*backend, **kv, format, src_blocks.data(), n, num_tokens, wire.data(),
                                static_cast<int64_t>(wire.size()));
      if (!h.ok()) return fail(h.status().to_string());
      export_bytes.set_value(static_cast<int64_t>(wire.size()));
      announced = true;
      if (Status st = (*ch)->send(wire.data(), static_cast<int64_t>(wire.size()), 1, deadline); !st.ok()) {
        return fail(st.to_string());
      }
    } else {
      const int64_t bytes = export_bytes_f.get();
      if (bytes < 0) return fail("rank 0 failed");
      std::vector<uint8_t> wire(static_cast<size_t>(bytes));
      if (Status st = (*ch)->recv(wire.data(), bytes, 0, deadline); !st.ok()) return fail(st.to_string());
      auto h = import_kv_blocks(*backend, **kv, format, wire.data(), bytes, dst_blocks.data(), n);
      if (!h.ok()) return fail("import: " + h.status().to_string());
      if (h->num_tokens != num_tokens) return fail("num_tokens " + std::to_string(h->num_tokens));
      landed.resize(static_cast<size_t>(n * block_bytes / 4));
      backend->kv_export_blocks(**kv, 0, kLayers, dst_blocks.data(), n, landed.data());
    }
  });
  for (const auto& e : errors) ASSERT_TRUE(e.empty()) << e;
  EXPECT_TRUE(same_bits(landed, content)) << "the imported blocks differ from the exported ones";
}

TEST(NcclKvChannel, ARecvWhoseSenderNeverSendsFailsByItsDeadline) {
  SKIP_WITHOUT_CUDA_DEVICES(2);
  auto store = std::make_shared<InProcessStore>();
  Status join[2], first, second;
  bool failed = false;
  long long waited_ms = 0;
  std::promise<void> receiver_done;
  auto receiver_done_f = receiver_done.get_future().share();
  run_ranks(2, [&](int r) {
    auto backend = backend_on(r);
    NcclOptions o;
    o.prefix = "kv_silent";
    o.timeout = milliseconds(5000);  // also bounds the sender's teardown after the receiver aborted
    auto ch = make_nccl_kv_channel(r, 2, r, store, o);
    join[r] = ch.status();
    if (r == 0) {
      receiver_done_f.wait();  // joined; never sends
      return;
    }
    if (ch.ok()) {
      auto dev = backend->alloc(1 << 20);
      const auto t0 = Clock::now();
      first = (*ch)->recv(dev->data(), 1 << 20, 0, Clock::now() + milliseconds(2000));
      waited_ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
      failed = (*ch)->failed();
      second = (*ch)->recv(dev->data(), 16, 0, Clock::now() + milliseconds(2000));
    }
    receiver_done.set_value();
  });
  ASSERT_TRUE(join[0].ok()) << join[0].to_string();
  ASSERT_TRUE(join[1].ok()) << join[1].to_string();
  EXPECT_EQ(first.code(), StatusCode::kDeadlineExceeded) << first.to_string();
  EXPECT_LT(waited_ms, 2000 + 10000);
  EXPECT_TRUE(failed);
  EXPECT_EQ(second.code(), StatusCode::kUnavailable) << second.to_string();
  std::printf("[ info ] recv without a sender ended after %lld ms: %s\n", waited_ms, first.to_string().c_str());
}

}  // namespace
}  // namespace specserve
