// specserve model: GGML block formats -> fp32.
//
// Source: ggml's block layouts (ggml/src/ggml-common.h `block_q4_0` ... `block_q6_K`) and its
// reference dequantisers (ggml-quants.c `dequantize_row_*`). The oracle in the tests is the
// `gguf` Python package (`gguf.quants.dequantize`), recorded under tests/data/dequant/.
// NOTE: results are bit-exact with that oracle, which evaluates `d * q + m` as two roundings;
// this file is therefore compiled without floating-point contraction (no FMA), even though
// the model library is built with -mfma.
// Thread-safety: pure functions, no shared state.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/ggml_type.h"

namespace specserve {

struct GgufTensorInfo;

/// True when `dequantize` handles `type`: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
/// Q3_K, Q4_K, Q5_K, Q6_K.
bool dequant_supported(GgmlType type);

/// Converts `num_elements` values stored as `type` at `src` to fp32 at `dst`.
/// `src` holds ggml_row_bytes(type, num_elements) bytes (any alignment); `dst` holds
/// `num_elements` floats; they must not overlap. Blocks are decoded in storage order, so a
/// tensor of shape [ne0, ne1, ...] (GGUF order) becomes row-major fp32 with ne0 innermost.
/// Errors (nothing written): kUnsupported naming the type when it is unknown or not handled;
/// kInvalidArgument naming the type, its block size and the count when num_elements is
/// negative or not a multiple of the block size; kInvalidArgument when a pointer is null
/// and num_elements > 0.
Status dequantize(GgmlType type, const uint8_t* src, int64_t num_elements, float* dst);

/// Checks that every fp16 scale of a block-format tensor is finite: d of Q4_0 / Q5_0 / Q8_0, d
/// and m of Q4_1 / Q5_1, d and dmin of Q2_K / Q4_K / Q5_K, d of Q3_K / Q6_K (ggml's block
/// layouts). An infinite or NaN scale is a corrupt file: without this check it gives infinite or
/// NaN products, or under the int8 kernel a finite-looking -inf logit for one token, far from
/// where the file is wrong. F32 / F16 / BF16 tensors pass (their values are checked where they
/// are used: non-finite logits end a request). Reads 2-4 bytes per block.
/// Errors: kCorruptData naming the tensor, the block, which scale and its value; kCorruptData
/// when t.num_bytes is not what t.num_elements of its type need or t.data is null.
Status check_block_scales(const GgufTensorInfo& t);

/// Dequantises a whole tensor of a parsed GGUF file into a new vector of t.num_elements floats,
/// in storage order (shape[0] innermost).
/// Errors: those of `dequantize`, naming the tensor; kCorruptData when t.num_bytes differs
/// from what t.num_elements of its type need or t.data is null.
Expected<std::vector<float>> dequantize_tensor(const GgufTensorInfo& t);

}  // namespace specserve
