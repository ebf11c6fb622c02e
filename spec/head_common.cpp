#include "spec/head_common.h"

#include "spec/token_tree.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>

#include "model/dequant.h"
#include "model/ggml_type.h"

namespace specserve {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// "a Medusa" / "an EAGLE" (the papers' spelling, with its article) for messages.
std::string a_head(const std::string& arch) {
  if (arch == "eagle") return "an EAGLE";
  if (arch == "medusa") return "a Medusa";
  return "a " + arch;
}

}  // namespace

std::string fingerprint_hex(uint64_t fingerprint) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016" PRIx64, fingerprint);
  return buf;
}

Status HeadFileChecker::check_architecture() const {
  const GgufValue* v = file_.find("general.architecture");
  if (!v) return invalid_argument(where("general.architecture") + " is missing: expected '" + arch_ + "' (" + a_head(arch_) + " head file)");
  const std::string* s = std::get_if<std::string>(&v->v);
  if (!s) return invalid_argument(where("general.architecture") + " is not a string: expected '" + arch_ + "'");
  if (*s != arch_) {
    return invalid_argument(where("general.architecture") + " = '" + *s + "': expected '" + arch_ + "' (is this " + a_head(arch_) +
                            " head file?)");
  }
  return Status();
}

Expected<int64_t> HeadFileChecker::uint_key(const std::string& key, int64_t min, int64_t max) const {
  const GgufValue* v = file_.find(key);
  if (!v) return invalid_argument(where(key) + " is missing (an unsigned integer in " + std::to_string(min) + ".." + std::to_string(max) + ")");
  int64_t x = 0;
  if (auto* i = std::get_if<int64_t>(&v->v)) {
    x = *i;
  } else if (auto* u = std::get_if<uint64_t>(&v->v)) {
    if (*u > static_cast<uint64_t>(max)) return invalid_argument(where(key) + " = " + std::to_string(*u) + ": must be in " + std::to_string(min) + ".." + std::to_string(max));
    x = static_cast<int64_t>(*u);
  } else {
    return invalid_argument(where(key) + " is not an integer (a u32 in " + std::to_string(min) + ".." + std::to_string(max) + ")");
  }
  if (x < min || x > max) {
    return invalid_argument(where(key) + " = " + std::to_string(x) + ": must be in " + std::to_string(min) + ".." + std::to_string(max));
  }
  return x;
}

Expected<double> HeadFileChecker::float_key(const std::string& key, double min, double max) const {
  const GgufValue* v = file_.find(key);
  if (!v) return invalid_argument(where(key) + " is missing (a float)");
  const double* d = std::get_if<double>(&v->v);
  if (!d) return invalid_argument(where(key) + " is not a float");
  if (!std::isfinite(*d) || *d < min || *d > max) {
    return invalid_argument(where(key) + " = " + std::to_string(*d) + ": must be a finite number in [" + std::to_string(min) + ", " +
                            std::to_string(max) + "]");
  }
  return *d;
}

Status HeadFileChecker::equal_key(const std::string& key, int64_t want, const std::string& what) const {
  auto v = uint_key(key, 1, INT32_MAX);
  if (!v.ok()) return v.status();
  if (*v != want) {
    return invalid_argument(where(key) + " = " + std::to_string(*v) + ": the target's " + what + " is " + std::to_string(want) +
                            " (a head for another model?)");
  }
  return Status();
}

Status HeadFileChecker::check_fingerprint(uint64_t target) const {
  const std::string key = arch_ + ".target_fingerprint";
  const GgufValue* v = file_.find(key);
  if (!v) return invalid_argument(where(key) + " is missing (16 hex digits of the target's model fingerprint)");
  const std::string* s = std::get_if<std::string>(&v->v);
  if (!s) return invalid_argument(where(key) + " is not a string (16 hex digits of the target's model fingerprint)");
  std::string got = *s;
  const bool hex = got.size() == 16 && std::all_of(got.begin(), got.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
  if (!hex) return invalid_argument(where(key) + " = '" + got + "': must be 16 hex digits");
  std::transform(got.begin(), got.end(), got.begin(), [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); });
  const std::string want = fingerprint_hex(target);
  if (got != want) {
    return invalid_argument(where(key) + " = '" + *s + "': the head was trained on another model; the target's fingerprint is '" + want +
                            "' (retrain the head on this target, tools/train)");
  }
  return Status();
}

Status check_head_identity(const GgufFile& head, const std::string& arch, uint64_t target_fingerprint) {
  HeadFileChecker c(head, arch);
  SPECSERVE_RETURN_IF_ERROR(c.check_architecture());
  return c.check_fingerprint(target_fingerprint);
}

Expected<const GgufTensorInfo*> HeadFileChecker::tensor(const std::string& name, std::initializer_list<int64_t> shape,
                                                        std::initializer_list<GgmlType> types) {
  seen_.insert(name);
  const GgufTensorInfo* t = file_.find_tensor(name);
  const std::vector<int64_t> want(shape);
  if (!t) return invalid_argument(where("tensor '" + name + "'") + " is missing (GGUF shape " + shape_text(want) + ")");
  if (t->shape != want) {
    return corrupt_data(where("tensor '" + name + "'") + " has GGUF shape " + shape_text(t->shape) + ": expected " + shape_text(want));
  }
  if (std::find(types.begin(), types.end(), t->type()) == types.end()) {
    std::string allowed;
    for (GgmlType ty : types) allowed += (allowed.empty() ? "" : " or ") + ggml_type_name(static_cast<uint32_t>(ty));
    return corrupt_data(where("tensor '" + name + "'") + " has type " + ggml_type_name(t->raw_type) + ": expected " + allowed);
  }
  // A Q8_0 matrix with an infinite or NaN block scale (model/dequant.h check_block_scales).
  if (Status st = check_block_scales(*t); !st.ok()) return Status(st.code(), where(st.message()));
  return t;
}

Status HeadFileChecker::check_no_other_tensors() const {
  for (const GgufTensorInfo& t : file_.tensors()) {
    if (!seen_.count(t.name)) return invalid_argument(where("tensor '" + t.name + "'") + " is not part of " + a_head(arch_) + " head");
  }
  return Status();
}

Expected<std::unique_ptr<Weight>> load_output_head_rows(const GgufFile& target_file, Backend& backend, int64_t rows) {
  const GgufTensorInfo* t = target_file.find_tensor("output.weight");
  if (!t) t = target_file.find_tensor("token_embd.weight");
  if (!t || t->shape.size() != 2) return invalid_argument(target_file.path() + ": no output head (output.weight / token_embd.weight)");
  const int64_t d = t->shape[0], vocab = t->shape[1];
  if (rows < 1 || rows > vocab) {
    return invalid_argument("draft_vocab_size = " + std::to_string(rows) + ": must be in 1.." + std::to_string(vocab) + " (0: the whole vocabulary)");
  }
  GgufTensorInfo part = *t;
  part.shape = {d, rows};
  part.num_elements = d * rows;
  part.num_bytes = static_cast<uint64_t>(ggml_row_bytes(t->type(), d)) * static_cast<uint64_t>(rows);
  auto w = backend.load_weight(part);
  if (!w.ok()) return Status(w.status().code(), target_file.path() + ": " + w.status().message());
  return std::move(*w);
}

bool StaticTree::is_chain() const {
  for (int32_t i = 0; i < num_nodes(); ++i) {
    if (parents[static_cast<size_t>(i)] != i - 1) return false;
  }
  return true;
}

int32_t StaticTree::max_depth() const { return depths.empty() ? 0 : *std::max_element(depths.begin(), depths.end()); }

Expected<StaticTree> static_tree_from_paths(const std::vector<std::vector<int32_t>>& paths, const std::string& what) {
  // Validation and node order are spec/token_tree's; a StaticTree is its parents, depths, ranks.
  auto tree = token_tree_from_paths(paths, what);
  if (!tree.ok()) return tree.status();
  StaticTree t;
  t.parents = tree->parents;
  t.depths = tree->depths;
  for (int32_t i = 0; i < tree->num_nodes(); ++i) t.ranks.push_back(tree->rank(i));
  return t;
}

StaticTree chain_tree(int32_t k) {
  StaticTree t;
  for (int32_t i = 0; i < k; ++i) {
    t.parents.push_back(i - 1);
    t.depths.push_back(i + 1);
    t.ranks.push_back(0);
  }
  return t;
}

StaticTree trim_static_tree(const StaticTree& tree, int32_t max_nodes, int32_t max_depth) {
  StaticTree t;
  std::vector<int32_t> new_index(tree.parents.size(), -1);
  for (int32_t i = 0; i < tree.num_nodes() && t.num_nodes() < max_nodes; ++i) {
    const size_t u = static_cast<size_t>(i);
    if (tree.depths[u] > max_depth) continue;
    const int32_t p = tree.parents[u];
    if (p >= 0 && new_index[static_cast<size_t>(p)] < 0) continue;  // its parent was cut
    new_index[u] = t.num_nodes();
    t.parents.push_back(p < 0 ? -1 : new_index[static_cast<size_t>(p)]);
    t.depths.push_back(tree.depths[u]);
    t.ranks.push_back(tree.ranks[u]);
  }
  return t;
}

StaticTreeFit fit_static_tree(const StaticTree& tree, int32_t max_depth, int64_t max_rank) {
  StaticTreeFit fit;
  // why[i]: 0 kept, 1 too deep, 2 rank too high (a descendant inherits its ancestor's reason).
  std::vector<int32_t> new_index(tree.parents.size(), -1), why(tree.parents.size(), 0);
  for (int32_t i = 0; i < tree.num_nodes(); ++i) {
    const size_t u = static_cast<size_t>(i);
    const int32_t p = tree.parents[u];
    if (p >= 0 && why[static_cast<size_t>(p)] != 0) {
      why[u] = why[static_cast<size_t>(p)];
    } else if (tree.depths[u] > max_depth) {
      why[u] = 1;
    } else if (tree.ranks[u] >= max_rank) {
      why[u] = 2;
    }
    if (why[u] == 1) ++fit.dropped_too_deep;
    if (why[u] == 2) ++fit.dropped_rank;
    if (why[u] != 0) continue;
    new_index[u] = fit.tree.num_nodes();
    fit.tree.parents.push_back(p < 0 ? -1 : new_index[static_cast<size_t>(p)]);
    fit.tree.depths.push_back(tree.depths[u]);
    fit.tree.ranks.push_back(tree.ranks[u]);
  }
  return fit;
}

std::string StaticTreeFit::describe(int32_t num_nodes, const std::string& what, const std::string& depth_limit,
                                    const std::string& rank_limit) const {
  if (dropped() == 0) return std::string();
  std::string s = std::to_string(dropped()) + " of " + std::to_string(num_nodes) + " nodes of " + what + " dropped:";
  if (dropped_too_deep > 0) s += " " + std::to_string(dropped_too_deep) + " deeper than " + depth_limit;
  if (dropped_rank > 0) s += std::string(dropped_too_deep > 0 ? "," : "") + " " + std::to_string(dropped_rank) + " with a rank >= " + rank_limit;
  return s + " (a node below a dropped one goes with it)";
}

void top_k(const float* row, int32_t n, int32_t k, std::vector<int32_t>* out) {
  out->clear();
  if (k <= 0) return;
  k = std::min(k, n);
  // A min-heap of the best k (by value, then lower index) seen so far; one pass over the row.
  auto better = [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); };
  std::vector<int32_t>& h = *out;
  h.reserve(static_cast<size_t>(k));
  for (int32_t i = 0; i < n; ++i) {
    if (static_cast<int32_t>(h.size()) < k) {
      h.push_back(i);
      std::push_heap(h.begin(), h.end(), better);
    } else if (better(i, h.front())) {
      std::pop_heap(h.begin(), h.end(), better);
      h.back() = i;
      std::push_heap(h.begin(), h.end(), better);
    }
  }
  std::sort(h.begin(), h.end(), better);
}

}  // namespace specserve
