// specserve model: GGUF v3 writer, for synthetic models, test files and fuzz seeds.
//
// Source: the GGUF specification (github.com/ggml-org/ggml, docs/gguf.md). Layout written:
//   "GGUF" u32 version=3, u64 tensor_count, u64 metadata_kv_count,
//   metadata kv pairs (string key, u32 value type, value) in insertion order,
//   tensor infos (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset),
//   zero padding to `alignment`, then each tensor's bytes, each padded to `alignment`.
// Strings are u64 length + bytes, no terminator; everything is little-endian.
// The alignment is general.alignment when that key is set (u32, a power of two), else 32.
// Thread-safety: none; build a writer on one thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/ggml_type.h"
#include "model/gguf.h"

namespace specserve {

class GgufWriter {
 public:
  GgufWriter() = default;

  // ---- metadata ------------------------------------------------------------------------
  // Each add_* sets `key`; setting a key again replaces its value and keeps its position.
  // NOTE: the setters return nothing: a key or value cannot be malformed here; a bad
  // general.alignment is reported by to_bytes()/write_file().

  void add_u8(const std::string& key, uint8_t v);
  void add_i8(const std::string& key, int8_t v);
  void add_u16(const std::string& key, uint16_t v);
  void add_i16(const std::string& key, int16_t v);
  void add_u32(const std::string& key, uint32_t v);
  void add_i32(const std::string& key, int32_t v);
  void add_u64(const std::string& key, uint64_t v);
  void add_i64(const std::string& key, int64_t v);
  void add_f32(const std::string& key, float v);
  void add_f64(const std::string& key, double v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);

  /// Arrays: a GGUF ARRAY value whose element type is named by the function.
  void add_u8_array(const std::string& key, const std::vector<uint8_t>& v);
  void add_i8_array(const std::string& key, const std::vector<int8_t>& v);
  void add_u16_array(const std::string& key, const std::vector<uint16_t>& v);
  void add_i16_array(const std::string& key, const std::vector<int16_t>& v);
  void add_u32_array(const std::string& key, const std::vector<uint32_t>& v);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_u64_array(const std::string& key, const std::vector<uint64_t>& v);
  void add_i64_array(const std::string& key, const std::vector<int64_t>& v);
  void add_f32_array(const std::string& key, const std::vector<float>& v);
  void add_f64_array(const std::string& key, const std::vector<double>& v);
  void add_bool_array(const std::string& key, const std::vector<bool>& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);

  /// Low level: sets `key` to a value of `type` whose encoding (everything after the u32
  /// value type, e.g. for an ARRAY: u32 element type, u64 count, elements) is `payload`,
  /// written verbatim. For nested arrays and for tests that need malformed values.
  void add_raw(const std::string& key, GgufValueType type, std::vector<uint8_t> payload);

  /// Removes `key`; true when it was present.
  bool remove(const std::string& key);
  size_t num_metadata() const { return kvs_.size(); }

  // ---- tensors -------------------------------------------------------------------------

  /// Adds a tensor; `shape` is in GGUF order (shape[0] innermost, 1..4 dims, each > 0),
  /// `data` holds exactly ggml_row_bytes(type, product of shape) bytes and is copied.
  /// Tensors are laid out in the order added.
  /// Errors (tensor not added): kInvalidArgument naming the tensor for an empty or duplicate
  /// name, a bad shape, shape[0] not a multiple of the block size, or a byte count mismatch;
  /// kUnsupported for an unknown type.
  Status add_tensor(const std::string& name, const std::vector<int64_t>& shape, GgmlType type,
                    const void* data, size_t num_bytes);
  /// Same for fp32 values, stored as F32.
  Status add_tensor_f32(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& values);
  size_t num_tensors() const { return tensors_.size(); }

  // ---- output --------------------------------------------------------------------------

  /// The alignment that will be used: general.alignment when set, else 32.
  /// Errors: kInvalidArgument when general.alignment is not a u32 power of two (1 .. 2^30).
  Expected<uint64_t> alignment() const;
  /// The whole file as bytes. Errors: those of alignment().
  Expected<std::vector<uint8_t>> to_bytes() const;
  /// Writes the file to `path` (through `path`.tmp, renamed when complete, so a reader never
  /// sees half a file). Errors: those of alignment(); kInvalidArgument naming the path and the
  /// OS error when it cannot be written.
  Status write_file(const std::string& path) const;

 private:
  struct Kv {
    std::string key;
    GgufValueType type;
    std::vector<uint8_t> payload;
  };
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    uint32_t raw_type;
    std::vector<uint8_t> data;
  };
  template <typename Sink>
  Status serialize(Sink& sink) const;
  void set(const std::string& key, GgufValueType type, std::vector<uint8_t> payload);

  std::vector<Kv> kvs_;
  std::vector<Tensor> tensors_;
};

}  // namespace specserve
