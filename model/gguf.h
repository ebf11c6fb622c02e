// specserve model: GGUF v2/v3 reader over mmap.
//
// Source: the GGUF specification (github.com/ggml-org/ggml, docs/gguf.md). The reader
// validates every count, length and offset against the file size before it allocates or
// reads, so a corrupt or hostile file yields a Status naming the file, the byte offset and the
// field — never a crash and never an allocation larger than the file.
// Thread-safety: a GgufFile is immutable after open(); concurrent reads are safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "model/ggml_type.h"

namespace specserve {

/// Metadata value types as numbered by GGUF.
enum class GgufValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

/// One metadata value. Integer scalars widen to int64 (UINT64 stays uint64), floats to double;
/// arrays hold one vector of the widened element kind (UINT64 elements are stored bit-cast in
/// the int64 vector). Nested arrays are validated and skipped: v is monostate, array_size set.
struct GgufValue {
  GgufValueType type = GgufValueType::UINT8;
  GgufValueType array_type = GgufValueType::UINT8;  ///< element type when type == ARRAY
  std::variant<std::monostate, int64_t, uint64_t, double, bool, std::string,
               std::vector<int64_t>, std::vector<double>, std::vector<std::string>,
               std::vector<bool>>
      v;
  uint64_t array_size = 0;  ///< element count when type == ARRAY
};

/// One tensor's description; `data` points into the mapped file.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;   ///< GGUF order: shape[0] is the contiguous (innermost) dim
  uint32_t raw_type = 0;        ///< GGML type number
  uint64_t offset = 0;          ///< offset of the data relative to the data section
  uint64_t num_bytes = 0;
  int64_t num_elements = 0;
  const uint8_t* data = nullptr;
  GgmlType type() const { return static_cast<GgmlType>(raw_type); }
};

/// A parsed GGUF file. Movable, not copyable; tensor data stays valid while it lives.
class GgufFile {
 public:
  /// Maps and parses `path`. Errors: kNotFound (cannot open), kCorruptData (names
  /// "<path>: offset <n>: <field>: <problem>"), kUnsupported (version, tensor type).
  static Expected<GgufFile> open(const std::string& path);
  /// Parses an in-memory image (not copied: `data` must outlive the result). `name` is used
  /// in error messages. Used by tests and the fuzzer.
  static Expected<GgufFile> from_memory(const uint8_t* data, size_t size, std::string name);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  size_t file_size() const { return size_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr.
  const GgufValue* find(const std::string& key) const;
  bool has(const std::string& key) const { return find(key) != nullptr; }
  /// Typed access; any integer type converts to int64 when it fits. Errors: kNotFound when the
  /// key is missing, kInvalidArgument naming the key when its type does not fit.
  Expected<int64_t> get_int(const std::string& key) const;
  Expected<double> get_float(const std::string& key) const;  ///< also accepts integers
  Expected<bool> get_bool(const std::string& key) const;
  Expected<std::string> get_string(const std::string& key) const;
  Expected<std::vector<std::string>> get_string_array(const std::string& key) const;
  Expected<std::vector<double>> get_float_array(const std::string& key) const;
  Expected<std::vector<int64_t>> get_int_array(const std::string& key) const;
  /// Convenience: the int at key, or `fallback` when missing (errors still reported).
  Expected<int64_t> get_int_or(const std::string& key, int64_t fallback) const;
  Expected<double> get_float_or(const std::string& key, double fallback) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor named `name`, or nullptr.
  const GgufTensorInfo* find_tensor(const std::string& name) const;

 private:
  GgufFile() = default;
  Status parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;  ///< non-null when we own an mmap
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace specserve
