// specserve model: slices of GGUF tensors, for loading one tensor-parallel shard of a model.
//
// A slice is a GgufTensorInfo that Backend::load_weight accepts like any other, so backends
// need nothing new for tensor parallelism. In GGUF order a 2-D tensor is shape [cols, rows]
// with each row a contiguous run of quant blocks (ggml-common.h), hence:
//  - a row slice (output features: column-parallel layers, 1-D biases) is a byte range of the
//    tensor, kept in its storage type;
//  - a column slice (input features: row-parallel layers) copies, per row, the whole blocks
//    covering [begin, end), kept in the storage type when begin and end fall on block boundaries;
//    otherwise the rows are dequantised (model/dequant.h) and the slice is F32. The backends
//    compute with the dequantised values (CPU: fp32, Q4_1 / Q8_0 dequantised inside matmul to
//    the same floats; CUDA: bf16 from fp32), so both ways load the same values.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/gguf.h"

namespace specserve {

/// A tensor slice: `info` describes it; its data points into `bytes` when the slice owns its
/// bytes, else into the source tensor's data (which must outlive it). Movable, not copyable
/// (info.data is re-pointed on move).
struct TensorSlice {
  GgufTensorInfo info;
  std::vector<uint8_t> bytes;

  TensorSlice() = default;
  TensorSlice(const TensorSlice&) = delete;
  TensorSlice& operator=(const TensorSlice&) = delete;
  TensorSlice(TensorSlice&& o) noexcept { *this = std::move(o); }
  TensorSlice& operator=(TensorSlice&& o) noexcept;
  bool owns_bytes() const { return !bytes.empty(); }
};

/// Rows [begin, end) of a 2-D tensor (shape [cols, rows] -> [cols, end - begin]), or elements
/// [begin, end) of a 1-D one. Same storage type; a 2-D slice points into `t`'s data; a 1-D
/// slice whose bounds are not on block boundaries is dequantised to F32.
/// Errors: kInvalidArgument naming the tensor, begin and end when 0 <= begin < end <= rows does
/// not hold or the tensor has more than 2 dims; those of dequantize.
Expected<TensorSlice> slice_rows(const GgufTensorInfo& t, int64_t begin, int64_t end);

/// Columns [begin, end) of a 2-D tensor (shape [cols, rows] -> [end - begin, rows]); see the
/// file comment for the storage type. Errors: kInvalidArgument naming the tensor, begin and end
/// when 0 <= begin < end <= cols does not hold or the tensor is not 2-D; those of dequantize.
Expected<TensorSlice> slice_cols(const GgufTensorInfo& t, int64_t begin, int64_t end);

}  // namespace specserve
