// specserve kv: moving a sequence's KV blocks between workers — the export format.
//
// A "KV export" is a checked header followed by the packed bytes of the blocks:
//
//   [KvBlockHeader, encoded; padded to a multiple of 64 bytes][block 0][block 1]...[block n-1]
//
// Each block is Backend::kv_export_blocks's packed layout (model/backend.h, KvLayout::
// kBlockLayerKV): for each layer of [layer_begin, layer_end), K [block_size, kv_dim] then V.
// The header names the model (a fingerprint, model/model_fingerprint.h), the layer range, the
// block size, kv_dim, dtype and layout, the number of tokens the blocks hold, and an XXH3-64
// checksum per block. An importer refuses an export whose model or layout differs from its own
// (kInvalidArgument naming the field and both values) and detects a damaged block (kCorruptData
// naming the block): the caller then recomputes the sequence's KV by prefill instead.
//
// The bytes travel on a transport (kv/transport.h: in-process copies, kv/ucx_transport.h: UCX).
// Encoding (little-endian; all offsets in bytes):
//    0 u32 magic "SSKV"   4 u16 version (1)   6 u16 reserved (0)   8 u64 model fingerprint
//   16 i32 layer_begin   20 i32 layer_end   24 i32 block_size   28 i32 kv_dim
//   32 u32 dtype   36 u32 layout   40 i64 num_tokens   48 i64 num_blocks
//   56 u64 XXH3-64 of bytes [0, 56) and of the checksum array   64 u64 checksum[num_blocks]
// Thread-safety: free functions over caller-owned data; safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace specserve {

class Backend;
class KvStorage;

/// Element type of exported K/V values. Only kF32 is produced today (the CPU backend's cache).
enum class KvDtype : uint32_t { kF32 = 1, kF16 = 2, kBF16 = 3 };
/// Order of the values inside an export. kBlockLayerKV: per block, per layer, K then V, each
/// [block_size, kv_dim] row-major (model/backend.h, Backend::kv_export_blocks).
enum class KvLayout : uint32_t { kBlockLayerKV = 1 };

const char* kv_dtype_name(KvDtype dtype);    ///< "f32", ..., "unknown"
int64_t kv_dtype_bytes(KvDtype dtype);       ///< 4, 2, 2; 0 when unknown
const char* kv_layout_name(KvLayout layout); ///< "block-layer-kv", "unknown"

/// The shape of an export, without the per-sequence parts: what an exporter produces and what an
/// importer expects (built from its own model and KvStorage with kv_export_format()).
struct KvExportFormat {
  uint64_t model_fingerprint = 0;
  int32_t layer_begin = 0;  ///< first layer exported
  int32_t layer_end = 0;    ///< one past the last layer exported
  int32_t block_size = 0;   ///< tokens per block
  int32_t kv_dim = 0;       ///< K (and V) values per token per layer
  KvDtype dtype = KvDtype::kF32;
  KvLayout layout = KvLayout::kBlockLayerKV;

  /// Bytes of one packed block.
  int64_t block_bytes() const;
};

/// The format of `kv` (fp32, kBlockLayerKV) for the layers [layer_begin, layer_end); layer_end
/// < 0 means all layers. A pipeline stage exports only the layers it holds.
KvExportFormat kv_export_format(const KvStorage& kv, uint64_t model_fingerprint, int32_t layer_begin = 0,
                                int32_t layer_end = -1);

/// The header of one sequence's export.
struct KvBlockHeader {
  KvExportFormat format;
  int64_t num_tokens = 0;            ///< tokens held: (num_blocks - 1) * block_size < num_tokens <= num_blocks * block_size
  std::vector<uint64_t> checksums;   ///< XXH3-64 of each packed block, in block order

  int64_t num_blocks() const { return static_cast<int64_t>(checksums.size()); }
  int64_t payload_bytes() const { return num_blocks() * format.block_bytes(); }
};

inline constexpr uint32_t kKvHeaderMagic = 0x564b5353u;  // "SSKV" read as little-endian u32
inline constexpr uint16_t kKvHeaderVersion = 1;

/// Encoded size of a header of `num_blocks` blocks: 64 + 8 * num_blocks rounded up to 64, so the
/// payload after it is 64-byte aligned.
int64_t kv_header_bytes(int64_t num_blocks);
/// Header plus payload: the bytes of a whole export.
int64_t kv_export_bytes(const KvExportFormat& format, int64_t num_blocks);

/// Writes `header` at `dst` (kv_header_bytes(header.num_blocks()) bytes, padding zeroed).
/// Errors: kInvalidArgument when `capacity` is smaller.
Status encode_kv_header(const KvBlockHeader& header, void* dst, int64_t capacity);
std::vector<uint8_t> encode_kv_header(const KvBlockHeader& header);

/// Parses and validates a header at the start of `data` (`bytes` available). Errors:
/// kCorruptData naming the field (magic, header checksum, num_blocks past the buffer, an empty
/// layer range, block_size, kv_dim, num_tokens outside the blocks, an unknown dtype or layout);
/// kUnsupported for another version.
Expected<KvBlockHeader> decode_kv_header(const void* data, int64_t bytes);

/// Whether an export of `header` can be imported where `expected` holds. Errors:
/// kInvalidArgument naming the first differing field and both values, e.g.
/// "kv export: model_fingerprint 0x1234 != expected 0x5678 (another model's KV cache)".
/// Checked: model_fingerprint, layout, dtype, block_size, kv_dim, layer range.
Status check_compatible(const KvBlockHeader& header, const KvExportFormat& expected);

/// XXH3-64 of `bytes` bytes at `data` (the per-block checksum).
uint64_t kv_block_checksum(const void* data, int64_t bytes);

/// Checks every block of `payload` (`bytes` long, header.payload_bytes() expected) against the
/// header's checksums. Errors: kCorruptData naming the first damaged block and how many are
/// damaged, and setting *first_bad_block to its index when given; kInvalidArgument when `bytes`
/// differs from header.payload_bytes().
Status verify_checksums(const KvBlockHeader& header, const void* payload, int64_t bytes,
                        int64_t* first_bad_block = nullptr);

/// Exports `n` blocks `blocks` (host ids, in sequence order) holding `num_tokens` tokens of one
/// sequence from `kv` into `dst` as a whole export (header + payload, kv_export_bytes(format, n)
/// bytes); `dst` is host memory, e.g. a UCX staging region a peer will `get` from. Returns the
/// header written. Errors: kInvalidArgument when the format does not match `kv` (block_size,
/// kv_dim, layers, dtype), num_tokens does not fit n blocks, a block id is out of range, or
/// `capacity` is too small.
Expected<KvBlockHeader> export_kv_blocks(Backend& backend, KvStorage& kv, const KvExportFormat& format,
                                         const int32_t* blocks, int64_t n, int64_t num_tokens, void* dst,
                                         int64_t capacity);

/// Imports a whole export at `src` (`bytes` long) into `n` blocks `blocks` of `kv` (any free ids:
/// the export carries none). Checks, in order: the header decodes; it is compatible with
/// `expected` (check_compatible); n equals its block count and `bytes` covers the payload; every
/// block's checksum — all before writing anything into `kv`. Returns the header (num_tokens
/// tells the caller the sequence length). Errors: kCorruptData (damaged header or block: the
/// caller recomputes), kInvalidArgument (incompatible export or wrong n: refuse), kUnsupported.
Expected<KvBlockHeader> import_kv_blocks(Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                                         const void* src, int64_t bytes, const int32_t* blocks, int64_t n);

}  // namespace specserve
