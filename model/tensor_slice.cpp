#include "model/tensor_slice.h"

#include <cstring>

#include "model/dequant.h"
#include "model/ggml_type.h"

namespace specserve {
namespace {

Status bad_range(const GgufTensorInfo& t, const char* what, int64_t begin, int64_t end, int64_t limit) {
  return invalid_argument("tensor '" + t.name + "': " + what + " [" + std::to_string(begin) + ", " + std::to_string(end) +
                          ") is not a non-empty range within 0.." + std::to_string(limit));
}

Expected<GgmlTypeTraits> traits_of(const GgufTensorInfo& t) {
  auto tr = ggml_type_traits(t.raw_type);
  if (!tr) return unsupported("tensor '" + t.name + "': type " + ggml_type_name(t.raw_type) + " is unknown");
  return *tr;
}

// Rows [0, rows) of a [cols, rows] tensor, columns [begin, end), dequantised to F32.
Expected<TensorSlice> slice_cols_f32(const GgufTensorInfo& t, int64_t rows, int64_t cols, int64_t row_bytes,
                                     int64_t begin, int64_t end) {
  TensorSlice s;
  const int64_t w = end - begin;
  s.bytes.resize(static_cast<size_t>(rows * w) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(cols));
  float* dst = reinterpret_cast<float*>(s.bytes.data());
  for (int64_t r = 0; r < rows; ++r) {
    Status st = dequantize(t.type(), t.data + r * row_bytes, cols, row.data());
    if (!st.ok()) return Status(st.code(), "tensor '" + t.name + "': " + st.message());
    std::memcpy(dst + r * w, row.data() + begin, static_cast<size_t>(w) * sizeof(float));
  }
  s.info = t;
  s.info.raw_type = static_cast<uint32_t>(GgmlType::F32);
  s.info.shape = t.shape.size() == 1 ? std::vector<int64_t>{w} : std::vector<int64_t>{w, rows};
  s.info.num_elements = w * rows;
  s.info.num_bytes = s.bytes.size();
  s.info.data = s.bytes.data();
  return s;
}

}  // namespace

TensorSlice& TensorSlice::operator=(TensorSlice&& o) noexcept {
  if (this == &o) return *this;
  const bool owned = o.info.data != nullptr && !o.bytes.empty() && o.info.data == o.bytes.data();
  info = std::move(o.info);
  bytes = std::move(o.bytes);
  if (owned) info.data = bytes.data();
  return *this;
}

Expected<TensorSlice> slice_rows(const GgufTensorInfo& t, int64_t begin, int64_t end) {
  if (t.shape.empty() || t.shape.size() > 2) {
    return invalid_argument("tensor '" + t.name + "': " + std::to_string(t.shape.size()) + " dims; a slice needs 1 or 2");
  }
  auto tr = traits_of(t);
  if (!tr.ok()) return tr.status();
  if (t.shape.size() == 1) {
    const int64_t n = t.shape[0];
    if (!(0 <= begin && begin < end && end <= n)) return bad_range(t, "elements", begin, end, n);
    if (begin % tr->block_size == 0 && (end % tr->block_size == 0 || end == n)) {
      TensorSlice s;
      s.info = t;
      s.info.shape = {end - begin};
      s.info.num_elements = end - begin;
      s.info.num_bytes = static_cast<uint64_t>((end - begin + tr->block_size - 1) / tr->block_size * tr->type_size);
      s.info.data = t.data + begin / tr->block_size * tr->type_size;
      return s;
    }
    return slice_cols_f32(t, 1, n, static_cast<int64_t>(t.num_bytes), begin, end);
  }
  const int64_t cols = t.shape[0], rows = t.shape[1];
  if (!(0 <= begin && begin < end && end <= rows)) return bad_range(t, "rows", begin, end, rows);
  const int64_t row_bytes = ggml_row_bytes(t.type(), cols);
  if (row_bytes < 0) return corrupt_data("tensor '" + t.name + "': rows of " + std::to_string(cols) + " are not whole blocks");
  TensorSlice s;
  s.info = t;
  s.info.shape = {cols, end - begin};
  s.info.num_elements = cols * (end - begin);
  s.info.num_bytes = static_cast<uint64_t>(row_bytes * (end - begin));
  s.info.data = t.data + begin * row_bytes;
  return s;
}

Expected<TensorSlice> slice_cols(const GgufTensorInfo& t, int64_t begin, int64_t end) {
  if (t.shape.size() != 2) {
    return invalid_argument("tensor '" + t.name + "': " + std::to_string(t.shape.size()) + " dims; a column slice needs 2");
  }
  auto tr = traits_of(t);
  if (!tr.ok()) return tr.status();
  const int64_t cols = t.shape[0], rows = t.shape[1];
  if (!(0 <= begin && begin < end && end <= cols)) return bad_range(t, "columns", begin, end, cols);
  const int64_t row_bytes = ggml_row_bytes(t.type(), cols);
  if (row_bytes < 0) return corrupt_data("tensor '" + t.name + "': rows of " + std::to_string(cols) + " are not whole blocks");
  if (begin % tr->block_size != 0 || end % tr->block_size != 0) {
    return slice_cols_f32(t, rows, cols, row_bytes, begin, end);
  }
  const int64_t off = begin / tr->block_size * tr->type_size;
  const int64_t w = (end - begin) / tr->block_size * tr->type_size;
  TensorSlice s;
  s.bytes.resize(static_cast<size_t>(rows * w));
  for (int64_t r = 0; r < rows; ++r) std::memcpy(s.bytes.data() + r * w, t.data + r * row_bytes + off, static_cast<size_t>(w));
  s.info = t;
  s.info.shape = {end - begin, rows};
  s.info.num_elements = (end - begin) * rows;
  s.info.num_bytes = s.bytes.size();
  s.info.data = s.bytes.data();
  return s;
}

}  // namespace specserve
