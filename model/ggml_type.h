// specserve model: GGML tensor storage types as GGUF numbers them.
//
// Source: the GGUF specification (ggml/docs/gguf.md) and ggml.h's `enum ggml_type`; block
// layouts follow ggml-common.h. A "block" packs `block_size` elements into `type_size` bytes.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace specserve {

/// GGML storage types, numbered as in GGUF files. Only the ones specserve knows are named.
enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15, BF16 = 30,
};

/// Elements per block and bytes per block of a type.
struct GgmlTypeTraits {
  const char* name;
  int64_t block_size;  ///< elements per block
  int64_t type_size;   ///< bytes per block
};

/// Traits of a raw GGUF type number; nullopt when specserve does not know the type.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type);

/// Name of a type ("Q4_1"), or "type#<n>" for an unknown number.
std::string ggml_type_name(uint32_t raw_type);

/// Bytes needed to store `num_elements` of `type`; -1 when num_elements is not a multiple of
/// the block size or the type is unknown.
int64_t ggml_row_bytes(GgmlType type, int64_t num_elements);

}  // namespace specserve
