#include "model/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <type_traits>

namespace specserve {
namespace {

constexpr uint32_t kGgufVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxDims = 4;  // GGML_MAX_DIMS

// Appends the little-endian bytes of a trivially copyable scalar.
template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

template <typename T>
std::vector<uint8_t> scalar_payload(T v) {
  std::vector<uint8_t> out;
  put(out, v);
  return out;
}

template <typename T>
std::vector<uint8_t> array_payload(GgufValueType elem, const std::vector<T>& v) {
  std::vector<uint8_t> out;
  out.reserve(12 + v.size() * sizeof(T));
  put<uint32_t>(out, static_cast<uint32_t>(elem));
  put<uint64_t>(out, v.size());
  for (const T& x : v) put(out, x);
  return out;
}

// Sink over a growing byte vector.
struct VectorSink {
  std::vector<uint8_t>* out;
  bool write(const uint8_t* p, size_t n) {
    out->insert(out->end(), p, p + n);
    return true;
  }
};

// Sink over a stdio FILE; remembers the first failure.
struct FileSink {
  std::FILE* f;
  bool write(const uint8_t* p, size_t n) { return n == 0 || std::fwrite(p, 1, n, f) == n; }
};

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

void GgufWriter::set(const std::string& key, GgufValueType type, std::vector<uint8_t> payload) {
  for (Kv& kv : kvs_) {
    if (kv.key == key) {
      kv.type = type;
      kv.payload = std::move(payload);
      return;
    }
  }
  kvs_.push_back(Kv{key, type, std::move(payload)});
}

void GgufWriter::add_u8(const std::string& k, uint8_t v) { set(k, GgufValueType::UINT8, scalar_payload(v)); }
void GgufWriter::add_i8(const std::string& k, int8_t v) { set(k, GgufValueType::INT8, scalar_payload(v)); }
void GgufWriter::add_u16(const std::string& k, uint16_t v) { set(k, GgufValueType::UINT16, scalar_payload(v)); }
void GgufWriter::add_i16(const std::string& k, int16_t v) { set(k, GgufValueType::INT16, scalar_payload(v)); }
void GgufWriter::add_u32(const std::string& k, uint32_t v) { set(k, GgufValueType::UINT32, scalar_payload(v)); }
void GgufWriter::add_i32(const std::string& k, int32_t v) { set(k, GgufValueType::INT32, scalar_payload(v)); }
void GgufWriter::add_u64(const std::string& k, uint64_t v) { set(k, GgufValueType::UINT64, scalar_payload(v)); }
void GgufWriter::add_i64(const std::string& k, int64_t v) { set(k, GgufValueType::INT64, scalar_payload(v)); }
void GgufWriter::add_f32(const std::string& k, float v) { set(k, GgufValueType::FLOAT32, scalar_payload(v)); }
void GgufWriter::add_f64(const std::string& k, double v) { set(k, GgufValueType::FLOAT64, scalar_payload(v)); }
void GgufWriter::add_bool(const std::string& k, bool v) {
  set(k, GgufValueType::BOOL, scalar_payload<uint8_t>(v ? 1 : 0));
}
void GgufWriter::add_string(const std::string& k, const std::string& v) {
  std::vector<uint8_t> p;
  put_string(p, v);
  set(k, GgufValueType::STRING, std::move(p));
}

void GgufWriter::add_u8_array(const std::string& k, const std::vector<uint8_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::UINT8, v));
}
void GgufWriter::add_i8_array(const std::string& k, const std::vector<int8_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::INT8, v));
}
void GgufWriter::add_u16_array(const std::string& k, const std::vector<uint16_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::UINT16, v));
}
void GgufWriter::add_i16_array(const std::string& k, const std::vector<int16_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::INT16, v));
}
void GgufWriter::add_u32_array(const std::string& k, const std::vector<uint32_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::UINT32, v));
}
void GgufWriter::add_i32_array(const std::string& k, const std::vector<int32_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::INT32, v));
}
void GgufWriter::add_u64_array(const std::string& k, const std::vector<uint64_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::UINT64, v));
}
void GgufWriter::add_i64_array(const std::string& k, const std::vector<int64_t>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::INT64, v));
}
void GgufWriter::add_f32_array(const std::string& k, const std::vector<float>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::FLOAT32, v));
}
void GgufWriter::add_f64_array(const std::string& k, const std::vector<double>& v) {
  set(k, GgufValueType::ARRAY, array_payload(GgufValueType::FLOAT64, v));
}
void GgufWriter::add_bool_array(const std::string& k, const std::vector<bool>& v) {
  std::vector<uint8_t> p;
  put<uint32_t>(p, static_cast<uint32_t>(GgufValueType::BOOL));
  put<uint64_t>(p, v.size());
  for (bool b : v) p.push_back(b ? 1 : 0);
  set(k, GgufValueType::ARRAY, std::move(p));
}
void GgufWriter::add_string_array(const std::string& k, const std::vector<std::string>& v) {
  std::vector<uint8_t> p;
  put<uint32_t>(p, static_cast<uint32_t>(GgufValueType::STRING));
  put<uint64_t>(p, v.size());
  for (const std::string& s : v) put_string(p, s);
  set(k, GgufValueType::ARRAY, std::move(p));
}

void GgufWriter::add_raw(const std::string& key, GgufValueType type, std::vector<uint8_t> payload) {
  set(key, type, std::move(payload));
}

bool GgufWriter::remove(const std::string& key) {
  for (auto it = kvs_.begin(); it != kvs_.end(); ++it) {
    if (it->key == key) {
      kvs_.erase(it);
      return true;
    }
  }
  return false;
}

Status GgufWriter::add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                              const void* data, size_t num_bytes) {
  const std::string what = "gguf writer: tensor '" + name + "'";
  if (name.empty()) return invalid_argument("gguf writer: tensor name is empty");
  for (const Tensor& t : tensors_) {
    if (t.name == name) return invalid_argument(what + ": duplicate name");
  }
  const uint32_t raw = static_cast<uint32_t>(type);
  const auto traits = ggml_type_traits(raw);
  if (!traits) return unsupported(what + ": unknown type " + ggml_type_name(raw));
  if (shape.empty() || shape.size() > kMaxDims) {
    return invalid_argument(what + ": " + std::to_string(shape.size()) + " dims, must be 1..4");
  }
  int64_t num_elements = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    // NOTE: the bound keeps every byte count below 2^63, well past any real tensor.
    if (shape[d] <= 0 || num_elements > (int64_t(1) << 50) / shape[d]) {
      return invalid_argument(what + ": dim " + std::to_string(d) + " = " + std::to_string(shape[d]) +
                              " is not positive or makes the tensor absurdly large");
    }
    num_elements *= shape[d];
  }
  if (shape[0] % traits->block_size != 0) {
    return invalid_argument(what + ": shape[0] = " + std::to_string(shape[0]) + " is not a multiple of the " +
                            traits->name + " block size " + std::to_string(traits->block_size));
  }
  const int64_t need = ggml_row_bytes(type, num_elements);
  if (need < 0 || static_cast<uint64_t>(need) != num_bytes) {
    return invalid_argument(what + ": " + std::to_string(num_elements) + " " + traits->name + " elements need " +
                            std::to_string(need) + " bytes, got " + std::to_string(num_bytes));
  }
  if (data == nullptr && num_bytes > 0) return invalid_argument(what + ": null data");
  Tensor t{name, shape, raw, {}};
  const auto* p = static_cast<const uint8_t*>(data);
  t.data.assign(p, p + num_bytes);
  tensors_.push_back(std::move(t));
  return Status();
}

Status GgufWriter::add_tensor_f32(const std::string& name, const std::vector<int64_t>& shape,
                                  const std::vector<float>& values) {
  return add_tensor(name, shape, GgmlType::F32, values.data(), values.size() * sizeof(float));
}

Expected<uint64_t> GgufWriter::alignment() const {
  for (const Kv& kv : kvs_) {
    if (kv.key != "general.alignment") continue;
    uint32_t a = 0;
    if (kv.type != GgufValueType::UINT32 || kv.payload.size() != sizeof a) {
      return invalid_argument("gguf writer: general.alignment must be a u32");
    }
    std::memcpy(&a, kv.payload.data(), sizeof a);
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30)) {
      return invalid_argument("gguf writer: general.alignment " + std::to_string(a) + " is not a power of two");
    }
    return static_cast<uint64_t>(a);
  }
  return kDefaultAlignment;
}

template <typename Sink>
Status GgufWriter::serialize(Sink& sink) const {
  auto al = alignment();
  if (!al.ok()) return al.status();
  const uint64_t align = *al;

  // Header, metadata and tensor infos are small: build them in memory, then stream the data.
  std::vector<uint8_t> head;
  head.insert(head.end(), {'G', 'G', 'U', 'F'});
  put<uint32_t>(head, kGgufVersion);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kvs_.size());
  for (const Kv& kv : kvs_) {
    put_string(head, kv.key);
    put<uint32_t>(head, static_cast<uint32_t>(kv.type));
    head.insert(head.end(), kv.payload.begin(), kv.payload.end());
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, t.raw_type);
    put<uint64_t>(head, offset);
    offset += align_up(t.data.size(), align);
  }
  head.resize(align_up(head.size(), align), 0);
  if (!sink.write(head.data(), head.size())) return invalid_argument("write failed");

  const std::vector<uint8_t> zeros(align, 0);
  for (const Tensor& t : tensors_) {
    if (!sink.write(t.data.data(), t.data.size())) return invalid_argument("write failed");
    const uint64_t pad = align_up(t.data.size(), align) - t.data.size();
    if (!sink.write(zeros.data(), pad)) return invalid_argument("write failed");
  }
  return Status();
}

Expected<std::vector<uint8_t>> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink{&out};
  Status st = serialize(sink);
  if (!st.ok()) return st;
  return out;
}

Status GgufWriter::write_file(const std::string& path) const {
  // Check the alignment before touching the file system.
  auto al = alignment();
  if (!al.ok()) return al.status();
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return invalid_argument("gguf writer: cannot write " + tmp + ": " + std::strerror(errno));
  FileSink sink{f};
  Status st = serialize(sink);
  const bool closed = std::fclose(f) == 0;
  if (st.ok() && !closed) st = invalid_argument("close failed");
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = invalid_argument("rename failed");
  if (!st.ok()) {
    const int err = errno;
    std::remove(tmp.c_str());
    return invalid_argument("gguf writer: cannot write " + path + ": " + st.message() + ": " + std::strerror(err));
  }
  return Status();
}

}  // namespace specserve
