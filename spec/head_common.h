// specserve spec: what the draft-head proposers (Medusa, spec/medusa_proposer.h; EAGLE,
// spec/eagle_proposer.h) share — validating a head GGUF against its target, the shape of a
// static draft tree, and picking the best tokens of a logit row.
//
// Head files (issue 6 contract, section D): GGUF with general.architecture "medusa" or "eagle",
// `<arch>.*` hyper-parameters as u32 / f32, `<arch>.target_fingerprint` = 16 lowercase hex
// digits of model_fingerprint() of the target GGUF the head was trained on (a head trained on
// one model is worthless on another with the same shape).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/backend.h"
#include "model/gguf.h"

namespace specserve {

/// 16 lowercase hex digits of a model_fingerprint() (as `<arch>.target_fingerprint` holds it).
std::string fingerprint_hex(uint64_t fingerprint);

/// Checks the keys and tensors of a head GGUF one at a time. Every error is
/// kInvalidArgument "<path>: <field> = <value>: <what was expected>" (kCorruptData for a tensor
/// whose shape or type is wrong), so a user sees which file, which field and which value.
class HeadFileChecker {
 public:
  /// `arch`: the expected general.architecture ("medusa", "eagle").
  HeadFileChecker(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  /// general.architecture is a string equal to the expected one.
  Status check_architecture() const;
  /// An unsigned integer key in [min, max].
  Expected<int64_t> uint_key(const std::string& key, int64_t min, int64_t max) const;
  /// A float key, finite and in [min, max].
  Expected<double> float_key(const std::string& key, double min, double max) const;
  /// An integer key that must equal the target's value `want` (named `what` in the error).
  Status equal_key(const std::string& key, int64_t want, const std::string& what) const;
  /// `<arch>.target_fingerprint` is 16 hex digits equal to fingerprint_hex(target).
  Status check_fingerprint(uint64_t target) const;
  /// The tensor `name` with GGUF shape `shape` and a type in `types`; records it as expected.
  Expected<const GgufTensorInfo*> tensor(const std::string& name, std::initializer_list<int64_t> shape,
                                         std::initializer_list<GgmlType> types);
  /// No tensor other than those asked for through tensor().
  Status check_no_other_tensors() const;

 private:
  std::string where(const std::string& field) const { return file_.path() + ": " + field; }
  const GgufFile& file_;
  std::string arch_;
  std::set<std::string> seen_;
};

/// Whether the head file `head` is a head of kind `arch` ("medusa", "eagle") trained on the target
/// whose model_fingerprint() is `target_fingerprint`: general.architecture, then
/// `<arch>.target_fingerprint` — HeadFileChecker's check_architecture and check_fingerprint, the
/// checks MedusaProposer::load and EagleProposer::load make, here without loading any weight (for
/// `up --dry-run` and `serve` before it listens). Errors: theirs (kInvalidArgument naming the
/// file, the key and the value).
Status check_head_identity(const GgufFile& head, const std::string& arch, uint64_t target_fingerprint);

/// The first `rows` rows (token ids 0 .. rows-1) of the target's output head (output.weight, or
/// token_embd.weight when tied), loaded onto `backend` as a [rows, d] weight: a draft head that
/// scores only these ids (the draft vocabulary; see MedusaOptions::draft_vocab_size). The rows
/// are a prefix of the GGUF tensor's storage, so no copy is made before load_weight.
/// NOTE: BPE vocabularies are numbered in merge order, so low ids are roughly the frequent ones
/// (the idea of FR-Spec, Zhao et al. 2025, "FR-Spec: Accelerating Large-Vocabulary Language
/// Models via Frequency-Ranked Speculative Sampling", with id order standing in for counts).
/// Drafting never proposes a higher id; verification by the target keeps the output exact.
/// Errors: kInvalidArgument for rows outside 1..vocab; the backend's load_weight errors.
Expected<std::unique_ptr<Weight>> load_output_head_rows(const GgufFile& target_file, Backend& backend, int64_t rows);

/// A static draft tree, as the proposers use it: node i hangs below parents[i] (-1: the last
/// known token; otherwise an earlier node), at depth depths[i] (1-based), and takes the
/// ranks[i]-th best token (0 = the best) of the draft distribution at its parent.
struct StaticTree {
  std::vector<int32_t> parents, depths, ranks;
  int32_t num_nodes() const { return static_cast<int32_t>(parents.size()); }
  /// True when every node's parent is the node before it (a chain: ranks all 0 or not).
  bool is_chain() const;
  int32_t max_depth() const;
};

/// Builds a StaticTree from paths (Medusa choices): spec/token_tree.h's token_tree_from_paths
/// (its validation, errors and node order) as parents, depths and ranks.
Expected<StaticTree> static_tree_from_paths(const std::vector<std::vector<int32_t>>& paths, const std::string& what);

/// The chain (0,), (0, 0), ... of `k` nodes.
StaticTree chain_tree(int32_t k);

/// The first nodes of `tree`, in its order, that sit at depth <= max_depth, at most max_nodes
/// of them. Still a valid tree: a node's ancestors come before it and are no deeper.
StaticTree trim_static_tree(const StaticTree& tree, int32_t max_nodes, int32_t max_depth);

/// fit_static_tree()'s result: the nodes a proposer can draft, and how many it dropped and why.
struct StaticTreeFit {
  StaticTree tree;
  int32_t dropped_too_deep = 0;   ///< deeper than max_depth (with their descendants)
  int32_t dropped_rank = 0;       ///< rank >= max_rank (with their descendants)
  int32_t dropped() const { return dropped_too_deep + dropped_rank; }
  /// "" when nothing was dropped, else e.g. "3 of 10 nodes of speculative_token_tree dropped:
  /// 2 deeper than the 4 Medusa heads, 1 with a rank >= the draft vocabulary's 8 ids".
  /// `what`: the tree's name; `depth_limit` / `rank_limit`: what bounds depth and rank.
  std::string describe(int32_t num_nodes, const std::string& what, const std::string& depth_limit,
                       const std::string& rank_limit) const;
};

/// The nodes of `tree` (in its order) at depth <= max_depth (Medusa: its number of heads) whose
/// rank is < max_rank (the draft vocabulary's size: a top-k over it has no more candidates),
/// with every descendant of a dropped node dropped too (it counts under its ancestor's reason),
/// so the result is still a valid tree. An empty result: nothing of the tree can be drafted.
StaticTreeFit fit_static_tree(const StaticTree& tree, int32_t max_depth, int64_t max_rank);

/// The `k` largest entries of `row` [n], best first; ties go to the lower index. k <= n.
void top_k(const float* row, int32_t n, int32_t k, std::vector<int32_t>* out);

}  // namespace specserve
