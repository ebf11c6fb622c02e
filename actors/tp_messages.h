// specserve actors: the messages of a tensor-parallel group whose ranks are actors
// (actors/tp_group.h): joining a replica's group through the scheduler, the rendezvous store the
// scheduler keeps, and rank 0's commands to the other ranks. Part of actors/messages.h (which
// includes this file and gives these types their CAF type IDs); include that one.
//
// Only token ids, block tables and small index arrays travel here (DESIGN.md section 2): a
// forward batch's activations and KV never leave their rank.
#pragma once

#include <caf/all.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "model/transformer.h"

namespace specserve {

/// A tensor-parallel rank of a replica's target model asks the scheduler for its group (sent as a
/// request; answered once all `tp_size` ranks of `replica` joined, or with an error string).
struct TpJoinMsg {
  std::string token;   ///< the cluster token
  int32_t replica = 0;
  int32_t rank = 0;
  int32_t tp_size = 1;
  caf::actor self;     ///< the rank's actor: rank 0 sends it TpCommand, the others watch rank 0
};

/// The scheduler's answer to TpJoinMsg: the group is complete.
struct TpGroupMsg {
  std::string error;               ///< non-empty: the join was refused (wrong token, size mismatch)
  std::string prefix;              ///< rendezvous key namespace of this group incarnation
  std::vector<caf::actor> ranks;   ///< ranks[r] is rank r's actor, size tp_size
};

/// Rank 0 -> rank r > 0: do on your shard what rank 0 does on its own (model/transformer.h,
/// TensorParallelPeers). Answered with (tp_done_atom, serial, rank, error) sent to `reply_to`.
struct TpCommand {
  enum Op : int32_t { kCreateKv = 0, kForward = 1, kCopySlots = 2 };
  int64_t serial = 0;
  int32_t op = kForward;
  int32_t kv_id = 0;
  int64_t num_blocks = 0, block_size = 0, num_layers = 0;  ///< kCreateKv
  std::vector<int32_t> src, dst;                           ///< kCopySlots
  ForwardBatch batch;                                      ///< kForward
  caf::actor reply_to;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TpJoinMsg& x) {
  return f(caf::meta::type_name("TpJoinMsg"), x.token, x.replica, x.rank, x.tp_size, x.self);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TpGroupMsg& x) {
  return f(caf::meta::type_name("TpGroupMsg"), x.error, x.prefix, x.ranks);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, SequenceInput& x) {
  return f(caf::meta::type_name("SequenceInput"), x.tokens, x.num_cached, x.block_table, x.parents, x.logit_rows,
           x.hidden_rows, x.argmax_only, x.sample_temperature,
           x.sample_uniform);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ForwardBatch& x) {
  return f(caf::meta::type_name("ForwardBatch"), x.seqs, x.return_hidden, x.num_layers);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, TpCommand& x) {
  return f(caf::meta::type_name("TpCommand"), x.serial, x.op, x.kv_id, x.num_blocks, x.block_size, x.num_layers, x.src,
           x.dst, x.batch, x.reply_to);
}
/// Tensor-parallel rendezvous store on the scheduler (actors/tp_group.h): (rdv_set_atom, key,
/// value) stores; (rdv_get_atom, key) answers the value once it is set.
using rdv_set_atom = caf::atom_constant<caf::atom("rdv_set")>;
using rdv_get_atom = caf::atom_constant<caf::atom("rdv_get")>;
/// Rank r > 0 -> rank 0's waiter: (tp_done_atom, int64 serial, int32 rank, std::string error).
using tp_done_atom = caf::atom_constant<caf::atom("tp_done")>;
/// Rank 0 -> the scheduler, once its peers exist: (tp_waiter_atom, std::string token, int32
/// replica, caf::actor waiter). The scheduler -> that waiter when a follower goes down:
/// (tp_abort_atom, std::string why). A follower's death reaches rank 0 only through the head
/// (its actor handle routes there), so without this rank 0 waited out the command timeout.
using tp_waiter_atom = caf::atom_constant<caf::atom("tp_waiter")>;
using tp_abort_atom = caf::atom_constant<caf::atom("tp_abort")>;

}  // namespace specserve
