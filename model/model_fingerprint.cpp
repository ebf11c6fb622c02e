#include "model/model_fingerprint.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

namespace specserve {
namespace {

// Feeds values into one XXH3 stream; strings carry their length so "ab"+"c" != "a"+"bc".
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~Hasher() { XXH3_freeState(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void bytes(const void* p, size_t n) { XXH3_64bits_update(state_, p, n); }
  void u64(uint64_t v) { bytes(&v, sizeof v); }  // little-endian hosts only (x86-64, aarch64)
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
  uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
};

void hash_value(Hasher& h, const GgufValue& v) {
  h.u64(static_cast<uint64_t>(v.type));
  h.u64(static_cast<uint64_t>(v.array_type));
  h.u64(v.array_size);
  h.u64(v.v.index());
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::monostate>) {
        } else if constexpr (std::is_same_v<T, std::string>) {
          h.str(x);
        } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t> || std::is_same_v<T, double>) {
          h.bytes(&x, sizeof x);
        } else if constexpr (std::is_same_v<T, bool>) {
          h.u64(x ? 1 : 0);
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          h.u64(x.size());
          for (const auto& s : x) h.str(s);
        } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
          h.u64(x.size());
          for (bool b : x) h.u64(b ? 1 : 0);
        } else {  // vector<int64_t>, vector<double>
          h.u64(x.size());
          h.bytes(x.data(), x.size() * sizeof(x[0]));
        }
      },
      v.v);
}

}  // namespace

uint64_t model_fingerprint(const GgufFile& file) {
  Hasher h;
  h.str("specserve.model_fingerprint.v1");
  std::string arch;
  if (const GgufValue* a = file.find("general.architecture"); a != nullptr && std::holds_alternative<std::string>(a->v)) {
    arch = std::get<std::string>(a->v);
  }
  h.str(arch);
  const std::string prefix = arch + ".";
  // metadata() is a std::map: keys come in sorted order, the same in every process.
  for (const auto& [key, value] : file.metadata()) {
    if (arch.empty() || key.compare(0, prefix.size(), prefix) != 0) continue;
    h.str(key);
    hash_value(h, value);
  }
  constexpr uint64_t kSample = 4096;
  h.u64(file.tensors().size());
  for (const GgufTensorInfo& t : file.tensors()) {
    h.str(t.name);
    h.u64(t.raw_type);
    h.u64(t.shape.size());
    for (int64_t d : t.shape) h.u64(static_cast<uint64_t>(d));
    h.u64(t.num_bytes);
    if (t.data == nullptr) continue;
    const uint64_t head = std::min(kSample, t.num_bytes);
    h.bytes(t.data, head);
    const uint64_t tail = std::min(kSample, t.num_bytes - head);
    h.bytes(t.data + t.num_bytes - tail, tail);
  }
  return h.digest();
}

}  // namespace specserve
