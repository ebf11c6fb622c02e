#include "model/ggml_type.h"

namespace specserve {

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t raw_type) {
  switch (static_cast<GgmlType>(raw_type)) {
    case GgmlType::F32: return GgmlTypeTraits{"F32", 1, 4};
    case GgmlType::F16: return GgmlTypeTraits{"F16", 1, 2};
    case GgmlType::BF16: return GgmlTypeTraits{"BF16", 1, 2};
    case GgmlType::Q4_0: return GgmlTypeTraits{"Q4_0", 32, 18};
    case GgmlType::Q4_1: return GgmlTypeTraits{"Q4_1", 32, 20};
    case GgmlType::Q5_0: return GgmlTypeTraits{"Q5_0", 32, 22};
    case GgmlType::Q5_1: return GgmlTypeTraits{"Q5_1", 32, 24};
    case GgmlType::Q8_0: return GgmlTypeTraits{"Q8_0", 32, 34};
    case GgmlType::Q8_1: return GgmlTypeTraits{"Q8_1", 32, 36};
    case GgmlType::Q2_K: return GgmlTypeTraits{"Q2_K", 256, 84};
    case GgmlType::Q3_K: return GgmlTypeTraits{"Q3_K", 256, 110};
    case GgmlType::Q4_K: return GgmlTypeTraits{"Q4_K", 256, 144};
    case GgmlType::Q5_K: return GgmlTypeTraits{"Q5_K", 256, 176};
    case GgmlType::Q6_K: return GgmlTypeTraits{"Q6_K", 256, 210};
    case GgmlType::Q8_K: return GgmlTypeTraits{"Q8_K", 256, 292};
  }
  return std::nullopt;
}

std::string ggml_type_name(uint32_t raw_type) {
  auto t = ggml_type_traits(raw_type);
  return t ? std::string(t->name) : "type#" + std::to_string(raw_type);
}

int64_t ggml_row_bytes(GgmlType type, int64_t num_elements) {
  auto t = ggml_type_traits(static_cast<uint32_t>(type));
  if (!t || num_elements < 0 || num_elements % t->block_size != 0) return -1;
  return num_elements / t->block_size * t->type_size;
}

}  // namespace specserve
