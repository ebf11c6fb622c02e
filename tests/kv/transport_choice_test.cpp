// choose_kv_transport (kv/transport.h): which transport moves a sequence's KV between two
// workers, as a table of (source place, destination place) -> transport. Pure: no device, no UCX.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/transport.h"

namespace specserve {
namespace {

KvPlace cpu(const std::string& node, uint64_t process) { return KvPlace{node, process, -1, false}; }
KvPlace gpu(const std::string& node, uint64_t process, int32_t device, bool nccl = true, const std::string& machine = "") {
  return KvPlace{node, process, device, nccl, machine};
}

struct Row {
  const char* what;
  KvPlace src, dst;
  KvTransport want;
};

TEST(ChooseKvTransport, FollowsTheTable) {
  const std::vector<Row> rows = {
      {"two CPU workers in one process", cpu("n0", 7), cpu("n0", 7), KvTransport::kInProcess},
      {"two GPU workers in one process (exports are host memory)", gpu("n0", 7, 0), gpu("n0", 7, 1),
       KvTransport::kInProcess},
      {"two CPU workers in two processes", cpu("n0", 7), cpu("n0", 8), KvTransport::kUcx},
      {"two CPU workers on two hosts", cpu("n0", 7), cpu("n1", 8), KvTransport::kUcx},
      {"GPU to CPU", gpu("n0", 7, 0), cpu("n0", 8), KvTransport::kUcx},
      {"CPU to GPU", cpu("n0", 7), gpu("n0", 8, 0), KvTransport::kUcx},
      {"two GPUs of one host", gpu("n0", 7, 0), gpu("n0", 8, 1), KvTransport::kNccl},
      {"GPUs of two hosts with the same ordinal", gpu("n0", 7, 0), gpu("n1", 8, 0), KvTransport::kNccl},
      {"one GPU shared by two processes (NCCL refuses it)", gpu("n0", 7, 0), gpu("n0", 8, 0), KvTransport::kUcx},
      {"source without NCCL", gpu("n0", 7, 0, false), gpu("n0", 8, 1), KvTransport::kUcx},
      {"destination without NCCL", gpu("n0", 7, 0), gpu("n0", 8, 1, false), KvTransport::kUcx},
      {"unknown processes (0) are never the same", gpu("n0", 0, 0), gpu("n0", 0, 1), KvTransport::kNccl},
      {"two topology nodes on one machine, one GPU", gpu("n0", 7, 0, true, "hostA"), gpu("n1", 8, 0, true, "hostA"),
       KvTransport::kUcx},
      {"two topology nodes on one machine, two GPUs", gpu("n0", 7, 0, true, "hostA"), gpu("n1", 8, 1, true, "hostA"),
       KvTransport::kNccl},
      {"one node name on two machines (hostnames win)", gpu("n0", 7, 0, true, "hostA"), gpu("n0", 8, 0, true, "hostB"),
       KvTransport::kNccl},
      {"one end's machine unknown: node names decide", gpu("n0", 7, 0, true, "hostA"), gpu("n1", 8, 0), KvTransport::kNccl},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(kv_transport_name(choose_kv_transport(r.src, r.dst)), std::string(kv_transport_name(r.want))) << r.what;
  }
}

TEST(ChooseKvTransport, IsSymmetricForEveryRow) {
  // The two ends of one pair must agree (each decides on its own which channels to join).
  const std::vector<KvPlace> places = {cpu("n0", 1), cpu("n1", 2), gpu("n0", 3, 0), gpu("n0", 4, 0), gpu("n0", 5, 1),
                                       gpu("n1", 6, 0), gpu("n1", 7, 1, false), gpu("n0", 3, 1),
                                       gpu("n2", 9, 0, true, "hostA"), gpu("n3", 10, 0, true, "hostA")};
  for (const KvPlace& a : places) {
    for (const KvPlace& b : places) {
      EXPECT_EQ(choose_kv_transport(a, b), choose_kv_transport(b, a))
          << a.node << "/" << a.process << "/cuda:" << a.cuda_device << " <-> " << b.node << "/" << b.process
          << "/cuda:" << b.cuda_device;
    }
  }
}

TEST(ChooseKvTransport, NamesEveryTransport) {
  EXPECT_STREQ(kv_transport_name(KvTransport::kInProcess), "in-process");
  EXPECT_STREQ(kv_transport_name(KvTransport::kUcx), "ucx");
  EXPECT_STREQ(kv_transport_name(KvTransport::kNccl), "nccl");
  EXPECT_STREQ(kv_transport_name(static_cast<KvTransport>(99)), "unknown");
}

}  // namespace
}  // namespace specserve
