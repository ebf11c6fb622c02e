#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <limits>

namespace specserve {
namespace {

// NOTE: GGUF stores every count as u64; a hostile file can claim 2^60 elements. Every count is
// checked against the bytes left in the file before anything is reserved, so memory use is
// bounded by a small multiple of the file size.
constexpr uint64_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr uint64_t kMaxArrayDepth = 4;    // nested arrays deeper than this are refused

class Cursor {
 public:
  Cursor(const uint8_t* base, size_t size, const std::string& name) : base_(base), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  Status error(size_t at, const std::string& field, const std::string& what) const {
    return corrupt_data(name_ + ": offset " + std::to_string(at) + ": " + field + ": " + what);
  }

  template <typename T>
  Status read(T* out, const std::string& field) {
    if (left() < sizeof(T)) {
      return error(pos_, field, "truncated (need " + std::to_string(sizeof(T)) + " bytes, " +
                                    std::to_string(left()) + " left)");
    }
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status();
  }

  Status read_string(std::string* out, const std::string& field) {
    size_t at = pos_;
    uint64_t len = 0;
    SPECSERVE_RETURN_IF_ERROR(read(&len, field + " length"));
    if (len > left()) {
      return error(at, field, "string length " + std::to_string(len) + " exceeds the " +
                                  std::to_string(left()) + " bytes left in the file");
    }
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return Status();
  }

  Status skip(uint64_t n, const std::string& field) {
    if (n > left()) return error(pos_, field, "truncated");
    pos_ += n;
    return Status();
  }

 private:
  const uint8_t* base_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: case GgufValueType::INT8: case GgufValueType::BOOL: return 1;
    case GgufValueType::UINT16: case GgufValueType::INT16: return 2;
    case GgufValueType::UINT32: case GgufValueType::INT32: case GgufValueType::FLOAT32: return 4;
    case GgufValueType::UINT64: case GgufValueType::INT64: case GgufValueType::FLOAT64: return 8;
    default: return 0;
  }
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

// Reads one scalar of type t as int64 / uint64 / double / bool into a variant-friendly form.
Status read_scalar(Cursor& c, GgufValueType t, const std::string& field, GgufValue* out) {
  switch (t) {
    case GgufValueType::UINT8: { uint8_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::INT8: { int8_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::UINT16: { uint16_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::INT16: { int16_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::UINT32: { uint32_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::INT32: { int32_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = int64_t(v); break; }
    case GgufValueType::UINT64: { uint64_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = v; break; }
    case GgufValueType::INT64: { int64_t v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = v; break; }
    case GgufValueType::FLOAT32: { float v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = double(v); break; }
    case GgufValueType::FLOAT64: { double v; SPECSERVE_RETURN_IF_ERROR(c.read(&v, field)); out->v = v; break; }
    case GgufValueType::BOOL: {
      uint8_t v; size_t at = c.pos();
      SPECSERVE_RETURN_IF_ERROR(c.read(&v, field));
      if (v > 1) return c.error(at, field, "bool value " + std::to_string(v) + " is not 0 or 1");
      out->v = v != 0;
      break;
    }
    case GgufValueType::STRING: {
      std::string s; SPECSERVE_RETURN_IF_ERROR(c.read_string(&s, field)); out->v = std::move(s); break;
    }
    default: return c.error(c.pos(), field, "not a scalar type");
  }
  return Status();
}

Status read_value(Cursor& c, GgufValueType t, const std::string& field, GgufValue* out, uint64_t depth);

Status read_array(Cursor& c, const std::string& field, GgufValue* out, uint64_t depth) {
  size_t at = c.pos();
  uint32_t raw_elem = 0;
  uint64_t n = 0;
  SPECSERVE_RETURN_IF_ERROR(c.read(&raw_elem, field + " array type"));
  if (!valid_value_type(raw_elem)) return c.error(at, field, "unknown array element type " + std::to_string(raw_elem));
  SPECSERVE_RETURN_IF_ERROR(c.read(&n, field + " array length"));
  auto elem = static_cast<GgufValueType>(raw_elem);
  out->type = GgufValueType::ARRAY;
  out->array_type = elem;
  out->array_size = n;
  // Every element takes at least one byte (a string at least 8): bound n by the bytes left.
  size_t min_elem = elem == GgufValueType::STRING ? 8 : elem == GgufValueType::ARRAY ? 12 : scalar_size(elem);
  if (n > c.left() / min_elem) {
    return c.error(at, field, "array length " + std::to_string(n) + " does not fit in the " +
                                  std::to_string(c.left()) + " bytes left in the file");
  }
  if (elem == GgufValueType::ARRAY) {
    if (depth >= kMaxArrayDepth) return c.error(at, field, "arrays nested deeper than " + std::to_string(kMaxArrayDepth));
    for (uint64_t i = 0; i < n; ++i) {
      GgufValue inner;
      SPECSERVE_RETURN_IF_ERROR(read_array(c, field + "[" + std::to_string(i) + "]", &inner, depth + 1));
    }
    out->v = std::monostate{};
    return Status();
  }
  if (elem == GgufValueType::STRING) {
    std::vector<std::string> vs;
    vs.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      std::string s;
      SPECSERVE_RETURN_IF_ERROR(c.read_string(&s, field + "[" + std::to_string(i) + "]"));
      vs.push_back(std::move(s));
    }
    out->v = std::move(vs);
  } else if (elem == GgufValueType::FLOAT32 || elem == GgufValueType::FLOAT64) {
    std::vector<double> vs;
    vs.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      GgufValue e;
      SPECSERVE_RETURN_IF_ERROR(read_scalar(c, elem, field, &e));
      vs.push_back(std::get<double>(e.v));
    }
    out->v = std::move(vs);
  } else if (elem == GgufValueType::BOOL) {
    std::vector<bool> vs;
    vs.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      GgufValue e;
      SPECSERVE_RETURN_IF_ERROR(read_scalar(c, elem, field, &e));
      vs.push_back(std::get<bool>(e.v));
    }
    out->v = std::move(vs);
  } else {
    std::vector<int64_t> vs;
    vs.reserve(n);
    for (uint64_t i = 0; i < n; ++i) {
      GgufValue e;
      SPECSERVE_RETURN_IF_ERROR(read_scalar(c, elem, field, &e));
      if (auto* u = std::get_if<uint64_t>(&e.v)) vs.push_back(static_cast<int64_t>(*u));
      else vs.push_back(std::get<int64_t>(e.v));
    }
    out->v = std::move(vs);
  }
  return Status();
}

Status read_value(Cursor& c, GgufValueType t, const std::string& field, GgufValue* out, uint64_t depth) {
  out->type = t;
  if (t == GgufValueType::ARRAY) return read_array(c, field, out, depth);
  return read_scalar(c, t, field, out);
}

}  // namespace

Expected<GgufFile> GgufFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  GgufFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return internal_error(path + ": mmap failed: " + std::strerror(errno));
    }
    f.mapping_ = m;
    f.base_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  SPECSERVE_RETURN_IF_ERROR(f.parse());
  return f;
}

Expected<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  f.base_ = data;
  f.size_ = size;
  SPECSERVE_RETURN_IF_ERROR(f.parse());
  return f;
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    if (mapping_) munmap(mapping_, size_);
    path_ = std::move(o.path_);
    base_ = o.base_;
    size_ = o.size_;
    mapping_ = o.mapping_;
    version_ = o.version_;
    alignment_ = o.alignment_;
    metadata_ = std::move(o.metadata_);
    tensors_ = std::move(o.tensors_);
    tensor_index_ = std::move(o.tensor_index_);
    o.mapping_ = nullptr;
    o.base_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

GgufFile::~GgufFile() {
  if (mapping_) munmap(mapping_, size_);
}

Status GgufFile::parse() {
  Cursor c(base_, size_, path_);
  uint32_t magic = 0;
  SPECSERVE_RETURN_IF_ERROR(c.read(&magic, "magic"));
  if (std::memcmp(&magic, "GGUF", 4) != 0) return c.error(0, "magic", "not a GGUF file (magic is not 'GGUF')");
  SPECSERVE_RETURN_IF_ERROR(c.read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    return unsupported(path_ + ": offset 4: version: GGUF version " + std::to_string(version_) +
                       " is not supported (2 and 3 are)");
  }
  uint64_t n_tensors = 0, n_kv = 0;
  size_t at = c.pos();
  SPECSERVE_RETURN_IF_ERROR(c.read(&n_tensors, "tensor_count"));
  // A tensor info takes at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
  if (n_tensors > c.left() / 24) return c.error(at, "tensor_count", "count " + std::to_string(n_tensors) + " cannot fit in the file");
  at = c.pos();
  SPECSERVE_RETURN_IF_ERROR(c.read(&n_kv, "metadata_kv_count"));
  if (n_kv > c.left() / 13) return c.error(at, "metadata_kv_count", "count " + std::to_string(n_kv) + " cannot fit in the file");

  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    SPECSERVE_RETURN_IF_ERROR(c.read_string(&key, "metadata key #" + std::to_string(i)));
    at = c.pos();
    uint32_t raw_type = 0;
    SPECSERVE_RETURN_IF_ERROR(c.read(&raw_type, key + " type"));
    if (!valid_value_type(raw_type)) return c.error(at, key, "unknown value type " + std::to_string(raw_type));
    GgufValue value;
    SPECSERVE_RETURN_IF_ERROR(read_value(c, static_cast<GgufValueType>(raw_type), key, &value, 0));
    if (metadata_.count(key)) return c.error(at, key, "duplicate metadata key");
    metadata_[key] = std::move(value);
  }

  if (auto* a = find("general.alignment")) {
    auto al = get_int("general.alignment");
    if (a->type != GgufValueType::UINT32 || !al.ok() || *al <= 0 || (*al & (*al - 1)) != 0 || *al > (1 << 20)) {
      return corrupt_data(path_ + ": general.alignment: must be a UINT32 power of two up to 1 MiB");
    }
    alignment_ = static_cast<uint64_t>(*al);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    std::string field = "tensor #" + std::to_string(i);
    SPECSERVE_RETURN_IF_ERROR(c.read_string(&t.name, field + " name"));
    field = "tensor '" + t.name + "'";
    uint32_t n_dims = 0;
    at = c.pos();
    SPECSERVE_RETURN_IF_ERROR(c.read(&n_dims, field + " n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims) return c.error(at, field + " n_dims", std::to_string(n_dims) + " is not in 1..4");
    int64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      at = c.pos();
      SPECSERVE_RETURN_IF_ERROR(c.read(&dim, field + " dim"));
      if (dim == 0 || dim > (uint64_t(1) << 40) ||
          elems > std::numeric_limits<int64_t>::max() / static_cast<int64_t>(dim)) {
        return c.error(at, field + " dim " + std::to_string(d), "absurd size " + std::to_string(dim));
      }
      elems *= static_cast<int64_t>(dim);
      t.shape.push_back(static_cast<int64_t>(dim));
    }
    t.num_elements = elems;
    at = c.pos();
    SPECSERVE_RETURN_IF_ERROR(c.read(&t.raw_type, field + " type"));
    auto traits = ggml_type_traits(t.raw_type);
    if (!traits) {
      return unsupported(path_ + ": offset " + std::to_string(at) + ": " + field + " type: tensor type " +
                         ggml_type_name(t.raw_type) + " is not supported");
    }
    if (t.shape[0] % traits->block_size != 0) {
      return c.error(at, field + " shape", "first dim " + std::to_string(t.shape[0]) + " is not a multiple of the " +
                                               traits->name + " block size " + std::to_string(traits->block_size));
    }
    // The byte count must fit in the file; checked before multiplying, which could wrap.
    const uint64_t num_blocks = static_cast<uint64_t>(elems / traits->block_size);
    if (num_blocks > size_ / static_cast<uint64_t>(traits->type_size)) {
      return c.error(at, field + " shape", std::to_string(elems) + " " + traits->name +
                                               " elements need more bytes than the file holds");
    }
    t.num_bytes = num_blocks * static_cast<uint64_t>(traits->type_size);
    at = c.pos();
    SPECSERVE_RETURN_IF_ERROR(c.read(&t.offset, field + " offset"));
    if (t.offset % alignment_ != 0) return c.error(at, field + " offset", std::to_string(t.offset) + " is not aligned to " + std::to_string(alignment_));
    if (tensor_index_.count(t.name)) return c.error(at, field, "duplicate tensor name");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }

  uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > size_) return c.error(c.pos(), "tensor data", "data section starts past the end of the file");
  for (auto& t : tensors_) {
    uint64_t begin = data_start + t.offset;
    if (t.offset > size_ || begin > size_ || t.num_bytes > size_ - begin) {
      return corrupt_data(path_ + ": offset " + std::to_string(begin) + ": tensor '" + t.name + "' data: " +
                          std::to_string(t.num_bytes) + " bytes run past the end of the file (size " +
                          std::to_string(size_) + ")");
    }
    t.data = base_ + begin;
  }
  return Status();
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {
Status missing(const std::string& path, const std::string& key) { return not_found(path + ": metadata key '" + key + "' is missing"); }
Status wrong_type(const std::string& path, const std::string& key, const char* want) {
  return invalid_argument(path + ": metadata key '" + key + "' is not " + want);
}
}  // namespace

Expected<int64_t> GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* i = std::get_if<int64_t>(&v->v)) return *i;
  if (auto* u = std::get_if<uint64_t>(&v->v)) {
    if (*u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(*u);
  }
  return wrong_type(path_, key, "an integer");
}

Expected<double> GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* d = std::get_if<double>(&v->v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v->v)) return static_cast<double>(*i);
  if (auto* u = std::get_if<uint64_t>(&v->v)) return static_cast<double>(*u);
  return wrong_type(path_, key, "a number");
}

Expected<bool> GgufFile::get_bool(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* b = std::get_if<bool>(&v->v)) return *b;
  return wrong_type(path_, key, "a bool");
}

Expected<std::string> GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* s = std::get_if<std::string>(&v->v)) return *s;
  return wrong_type(path_, key, "a string");
}

Expected<std::vector<std::string>> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* s = std::get_if<std::vector<std::string>>(&v->v)) return *s;
  return wrong_type(path_, key, "an array of strings");
}

Expected<std::vector<double>> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* s = std::get_if<std::vector<double>>(&v->v)) return *s;
  if (auto* s = std::get_if<std::vector<int64_t>>(&v->v)) return std::vector<double>(s->begin(), s->end());
  return wrong_type(path_, key, "an array of numbers");
}

Expected<std::vector<int64_t>> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) return missing(path_, key);
  if (auto* s = std::get_if<std::vector<int64_t>>(&v->v)) return *s;
  return wrong_type(path_, key, "an array of integers");
}

Expected<int64_t> GgufFile::get_int_or(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  return get_int(key);
}

Expected<double> GgufFile::get_float_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  return get_float(key);
}

}  // namespace specserve
