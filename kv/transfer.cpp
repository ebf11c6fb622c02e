#include "kv/transfer.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "model/backend.h"

namespace specserve {
namespace {

constexpr int64_t kFixedBytes = 64;       // header fields up to the checksum array
constexpr int64_t kChecksumOffset = 56;   // the header's own checksum

template <typename T>
void put_le(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);  // little-endian hosts only (x86-64, aarch64): static_assert below
}
template <typename T>
T get_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the KV export encoding assumes a little-endian host");

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

uint64_t header_checksum(const uint8_t* fixed, const uint8_t* sums, int64_t num_blocks) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, fixed, kChecksumOffset);
  XXH3_64bits_update(st, sums, static_cast<size_t>(num_blocks) * 8);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

Status mismatch(const char* field, const std::string& got, const std::string& want, const char* why) {
  return invalid_argument(std::string("kv export: ") + field + " " + got + " != expected " + want + " (" + why + ")");
}

}  // namespace

const char* kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kBF16: return "bf16";
  }
  return "unknown";
}

int64_t kv_dtype_bytes(KvDtype d) {
  switch (d) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16:
    case KvDtype::kBF16: return 2;
  }
  return 0;
}

const char* kv_layout_name(KvLayout l) {
  switch (l) {
    case KvLayout::kBlockLayerKV: return "block-layer-kv";
  }
  return "unknown";
}

int64_t KvExportFormat::block_bytes() const {
  return static_cast<int64_t>(layer_end - layer_begin) * 2 * block_size * kv_dim * kv_dtype_bytes(dtype);
}

KvExportFormat kv_export_format(const KvStorage& kv, uint64_t model_fingerprint, int32_t layer_begin,
                                int32_t layer_end) {
  KvExportFormat f;
  f.model_fingerprint = model_fingerprint;
  f.layer_begin = layer_begin;
  f.layer_end = layer_end < 0 ? static_cast<int32_t>(kv.num_layers()) : layer_end;
  f.block_size = static_cast<int32_t>(kv.block_size());
  f.kv_dim = static_cast<int32_t>(kv.kv_dim());
  f.dtype = KvDtype::kF32;
  f.layout = KvLayout::kBlockLayerKV;
  return f;
}

int64_t kv_header_bytes(int64_t num_blocks) { return (kFixedBytes + 8 * num_blocks + 63) / 64 * 64; }

int64_t kv_export_bytes(const KvExportFormat& format, int64_t num_blocks) {
  return kv_header_bytes(num_blocks) + num_blocks * format.block_bytes();
}

Status encode_kv_header(const KvBlockHeader& h, void* dst, int64_t capacity) {
  const int64_t need = kv_header_bytes(h.num_blocks());
  if (capacity < need) {
    return invalid_argument("kv export: header of " + std::to_string(h.num_blocks()) + " blocks needs " +
                            std::to_string(need) + " bytes, capacity " + std::to_string(capacity));
  }
  auto* p = static_cast<uint8_t*>(dst);
  std::memset(p, 0, static_cast<size_t>(need));
  put_le<uint32_t>(p + 0, kKvHeaderMagic);
  put_le<uint16_t>(p + 4, kKvHeaderVersion);
  put_le<uint64_t>(p + 8, h.format.model_fingerprint);
  put_le<int32_t>(p + 16, h.format.layer_begin);
  put_le<int32_t>(p + 20, h.format.layer_end);
  put_le<int32_t>(p + 24, h.format.block_size);
  put_le<int32_t>(p + 28, h.format.kv_dim);
  put_le<uint32_t>(p + 32, static_cast<uint32_t>(h.format.dtype));
  put_le<uint32_t>(p + 36, static_cast<uint32_t>(h.format.layout));
  put_le<int64_t>(p + 40, h.num_tokens);
  put_le<int64_t>(p + 48, h.num_blocks());
  std::memcpy(p + kFixedBytes, h.checksums.data(), h.checksums.size() * 8);
  put_le<uint64_t>(p + kChecksumOffset, header_checksum(p, p + kFixedBytes, h.num_blocks()));
  return Status();
}

std::vector<uint8_t> encode_kv_header(const KvBlockHeader& h) {
  std::vector<uint8_t> out(static_cast<size_t>(kv_header_bytes(h.num_blocks())));
  Status st = encode_kv_header(h, out.data(), static_cast<int64_t>(out.size()));
  SPECSERVE_CHECK(st.ok(), st.to_string());
  return out;
}

Expected<KvBlockHeader> decode_kv_header(const void* data, int64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  auto bad = [](const std::string& m) { return corrupt_data("kv export header: " + m); };
  if (bytes < kFixedBytes) return bad(std::to_string(bytes) + " bytes, a header has at least 64");
  if (get_le<uint32_t>(p) != kKvHeaderMagic) return bad("offset 0: magic " + hex(get_le<uint32_t>(p)) + " is not \"SSKV\"");
  const uint16_t version = get_le<uint16_t>(p + 4);
  if (version != kKvHeaderVersion) {
    return unsupported("kv export header: version " + std::to_string(version) + " (this build reads " +
                       std::to_string(kKvHeaderVersion) + ")");
  }
  KvBlockHeader h;
  const int64_t n = get_le<int64_t>(p + 48);
  if (n < 0 || n > (bytes - kFixedBytes) / 8) {
    return bad("offset 48: num_blocks " + std::to_string(n) + " does not fit in " + std::to_string(bytes) + " bytes");
  }
  const uint64_t want = get_le<uint64_t>(p + kChecksumOffset);
  const uint64_t got = header_checksum(p, p + kFixedBytes, n);
  if (want != got) return bad("offset 56: header checksum " + hex(got) + " != recorded " + hex(want));
  KvExportFormat& f = h.format;
  f.model_fingerprint = get_le<uint64_t>(p + 8);
  f.layer_begin = get_le<int32_t>(p + 16);
  f.layer_end = get_le<int32_t>(p + 20);
  f.block_size = get_le<int32_t>(p + 24);
  f.kv_dim = get_le<int32_t>(p + 28);
  f.dtype = static_cast<KvDtype>(get_le<uint32_t>(p + 32));
  f.layout = static_cast<KvLayout>(get_le<uint32_t>(p + 36));
  h.num_tokens = get_le<int64_t>(p + 40);
  if (f.layer_begin < 0 || f.layer_end <= f.layer_begin) {
    return bad("offset 16: layer range [" + std::to_string(f.layer_begin) + ", " + std::to_string(f.layer_end) + ") is empty");
  }
  if (f.block_size <= 0) return bad("offset 24: block_size " + std::to_string(f.block_size));
  if (f.kv_dim <= 0) return bad("offset 28: kv_dim " + std::to_string(f.kv_dim));
  if (kv_dtype_bytes(f.dtype) == 0) return bad("offset 32: dtype " + std::to_string(static_cast<uint32_t>(f.dtype)) + " unknown");
  if (std::string(kv_layout_name(f.layout)) == "unknown") {
    return bad("offset 36: layout " + std::to_string(static_cast<uint32_t>(f.layout)) + " unknown");
  }
  const bool fits = n == 0 ? h.num_tokens == 0
                           : h.num_tokens > (n - 1) * f.block_size && h.num_tokens <= n * f.block_size;
  if (!fits) {
    return bad("offset 40: num_tokens " + std::to_string(h.num_tokens) + " does not fill " + std::to_string(n) +
               " blocks of " + std::to_string(f.block_size));
  }
  h.checksums.resize(static_cast<size_t>(n));
  std::memcpy(h.checksums.data(), p + kFixedBytes, static_cast<size_t>(n) * 8);
  return h;
}

Status check_compatible(const KvBlockHeader& h, const KvExportFormat& e) {
  const KvExportFormat& f = h.format;
  if (f.model_fingerprint != e.model_fingerprint) {
    return mismatch("model_fingerprint", hex(f.model_fingerprint), hex(e.model_fingerprint), "another model's KV cache");
  }
  if (f.layout != e.layout) return mismatch("layout", kv_layout_name(f.layout), kv_layout_name(e.layout), "value order differs");
  if (f.dtype != e.dtype) return mismatch("dtype", kv_dtype_name(f.dtype), kv_dtype_name(e.dtype), "element type differs");
  if (f.block_size != e.block_size) {
    return mismatch("block_size", std::to_string(f.block_size), std::to_string(e.block_size), "tokens per block differ");
  }
  if (f.kv_dim != e.kv_dim) return mismatch("kv_dim", std::to_string(f.kv_dim), std::to_string(e.kv_dim), "values per token differ");
  if (f.layer_begin != e.layer_begin || f.layer_end != e.layer_end) {
    auto range = [](const KvExportFormat& x) {
      return "[" + std::to_string(x.layer_begin) + ", " + std::to_string(x.layer_end) + ")";
    };
    return mismatch("layer range", range(f), range(e), "another pipeline stage's layers");
  }
  return Status();
}

uint64_t kv_block_checksum(const void* data, int64_t bytes) { return XXH3_64bits(data, static_cast<size_t>(bytes)); }

Status verify_checksums(const KvBlockHeader& h, const void* payload, int64_t bytes, int64_t* first_bad_block) {
  if (bytes != h.payload_bytes()) {
    return invalid_argument("kv export: payload of " + std::to_string(bytes) + " bytes, header describes " +
                            std::to_string(h.payload_bytes()));
  }
  const int64_t bb = h.format.block_bytes();
  const auto* p = static_cast<const uint8_t*>(payload);
  int64_t first = -1, num_bad = 0;
  for (int64_t i = 0; i < h.num_blocks(); ++i) {
    if (kv_block_checksum(p + i * bb, bb) != h.checksums[static_cast<size_t>(i)]) {
      if (first < 0) first = i;
      ++num_bad;
    }
  }
  if (first_bad_block != nullptr) *first_bad_block = first;
  if (first < 0) return Status();
  return corrupt_data("kv export: block " + std::to_string(first) + " checksum mismatch (" + std::to_string(num_bad) +
                      " of " + std::to_string(h.num_blocks()) + " blocks damaged)");
}

Expected<KvBlockHeader> export_kv_blocks(Backend& backend, KvStorage& kv, const KvExportFormat& format,
                                         const int32_t* blocks, int64_t n, int64_t num_tokens, void* dst,
                                         int64_t capacity) {
  const KvExportFormat own = kv_export_format(kv, format.model_fingerprint, format.layer_begin, format.layer_end);
  KvBlockHeader h;
  h.format = format;
  h.num_tokens = num_tokens;
  if (format.layer_begin < 0 || format.layer_end <= format.layer_begin || format.layer_end > kv.num_layers()) {
    return invalid_argument("kv export: layer range [" + std::to_string(format.layer_begin) + ", " +
                            std::to_string(format.layer_end) + ") of a " + std::to_string(kv.num_layers()) +
                            "-layer cache");
  }
  // The format must describe this storage (what the backend writes), whatever the caller says.
  SPECSERVE_RETURN_IF_ERROR(check_compatible(h, own));
  if (n < 0 || (n == 0 ? num_tokens != 0 : num_tokens <= (n - 1) * format.block_size || num_tokens > n * format.block_size)) {
    return invalid_argument("kv export: num_tokens " + std::to_string(num_tokens) + " does not fill " +
                            std::to_string(n) + " blocks of " + std::to_string(format.block_size));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (blocks[i] < 0 || blocks[i] >= kv.num_blocks()) {
      return invalid_argument("kv export: block id " + std::to_string(blocks[i]) + " at " + std::to_string(i) +
                              " outside the cache's " + std::to_string(kv.num_blocks()) + " blocks");
    }
  }
  const int64_t total = kv_export_bytes(format, n);
  if (capacity < total) {
    return invalid_argument("kv export: " + std::to_string(n) + " blocks need " + std::to_string(total) +
                            " bytes, capacity " + std::to_string(capacity));
  }
  auto* out = static_cast<uint8_t*>(dst);
  uint8_t* payload = out + kv_header_bytes(n);
  backend.kv_export_blocks(kv, format.layer_begin, format.layer_end, blocks, n, payload);
  backend.synchronize();
  const int64_t bb = format.block_bytes();
  h.checksums.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) h.checksums[static_cast<size_t>(i)] = kv_block_checksum(payload + i * bb, bb);
  SPECSERVE_RETURN_IF_ERROR(encode_kv_header(h, out, capacity));
  return h;
}

Expected<KvBlockHeader> import_kv_blocks(Backend& backend, KvStorage& kv, const KvExportFormat& expected,
                                         const void* src, int64_t bytes, const int32_t* blocks, int64_t n) {
  auto h = decode_kv_header(src, bytes);
  if (!h.ok()) return h.status();
  SPECSERVE_RETURN_IF_ERROR(check_compatible(*h, expected));
  SPECSERVE_RETURN_IF_ERROR(check_compatible(*h, kv_export_format(kv, expected.model_fingerprint, expected.layer_begin,
                                                                    expected.layer_end)));
  if (n != h->num_blocks()) {
    return invalid_argument("kv import: " + std::to_string(n) + " destination blocks for an export of " +
                            std::to_string(h->num_blocks()));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (blocks[i] < 0 || blocks[i] >= kv.num_blocks()) {
      return invalid_argument("kv import: block id " + std::to_string(blocks[i]) + " at " + std::to_string(i) +
                              " outside the cache's " + std::to_string(kv.num_blocks()) + " blocks");
    }
  }
  const int64_t head = kv_header_bytes(n);
  if (bytes < head + h->payload_bytes()) {
    return corrupt_data("kv export: " + std::to_string(bytes) + " bytes, header describes " +
                        std::to_string(head + h->payload_bytes()) + " (truncated)");
  }
  const uint8_t* payload = static_cast<const uint8_t*>(src) + head;
  SPECSERVE_RETURN_IF_ERROR(verify_checksums(*h, payload, h->payload_bytes()));
  backend.kv_import_blocks(kv, expected.layer_begin, expected.layer_end, blocks, n, payload);
  backend.synchronize();
  return h;
}

}  // namespace specserve
