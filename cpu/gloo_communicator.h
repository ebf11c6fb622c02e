// specserve cpu: the tensor-parallel Communicator (model/communicator.h) over Gloo.
//
// Gloo (github.com/facebookincubator/gloo, Debian's 2022 snapshot) connects every pair of
// ranks with a TCP socket on the address in GlooOptions (loopback unless configured), after
// the ranks exchange addresses through a RendezvousStore: InProcessStore when the ranks are
// threads of one process, FileStore when they are processes on one host, any other
// RendezvousStore (an actor-backed one) later — the store is the only seam.
// NOTE: all_reduce_sum is an allgather followed by a local sum in rank order, not Gloo's ring
// allreduce: the ring sums each chunk starting at a different rank, so the bits would depend on
// the chunking; gathering first gives every rank the same order for every element, which the
// speculative engine's determinism needs. It moves size x n floats per rank instead of
// 2 x n (size - 1) / size — negligible at the batch sizes of a CPU replica.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"
#include "model/communicator.h"

namespace specserve {

/// How a Gloo rank connects.
struct GlooOptions {
  /// Address the rank's TCP device binds and publishes. Loopback by default, as the actor port
  /// (DESIGN.md section 5): a group across hosts must name a reachable address explicitly.
  std::string hostname = "127.0.0.1";
  /// Key namespace in the store ("<prefix>/<key>"), so several groups can share one store.
  std::string prefix = "tp";
  /// Rendezvous and per-collective timeout.
  std::chrono::milliseconds timeout{60000};
};

/// Joins rank `rank` of a `size`-rank group. The communicator's buffers must be host memory
/// (CpuBackend buffers are; a CUDA backend pairs with NCCL instead). Every rank calls this at the same time (from its
/// own thread or process) with a store they share and the same prefix; it returns when all
/// ranks are connected. Errors: kInvalidArgument naming rank or size when size < 1 or rank is
/// outside [0, size); kDeadlineExceeded / kUnavailable when a peer does not show up within
/// options.timeout or cannot be connected (the message names the prefix and rank).
Expected<std::unique_ptr<Communicator>> make_gloo_communicator(int rank, int size,
                                                               std::shared_ptr<RendezvousStore> store,
                                                               const GlooOptions& options = {});

}  // namespace specserve
