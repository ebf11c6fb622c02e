#include "core/dtype.h"

namespace specserve {

Expected<ComputeDtype> parse_compute_dtype(const std::string& text, const std::string& field) {
  if (text == "auto") return ComputeDtype::kAuto;
  if (text == "float32" || text == "float") return ComputeDtype::kFloat32;
  if (text == "bfloat16") return ComputeDtype::kBFloat16;
  if (text == "float16" || text == "half") return ComputeDtype::kFloat16;
  return invalid_argument(field + " = '" + text + "': not one of auto, float32, float, bfloat16, float16, half");
}

const char* compute_dtype_name(ComputeDtype dtype) {
  switch (dtype) {
    case ComputeDtype::kAuto: return "auto";
    case ComputeDtype::kFloat32: return "float32";
    case ComputeDtype::kBFloat16: return "bfloat16";
    case ComputeDtype::kFloat16: return "float16";
  }
  return "?";
}

}  // namespace specserve
