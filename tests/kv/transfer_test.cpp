// KV export format (kv/transfer.h): header round trip and validation, compatibility errors that
// name the field and both values, checksum damage found per block, and a CPU-backend export ->
// import into other block ids that leaves identical KV and identical attention output; the
// in-process transport (kv/transport.h).
#include "kv/transfer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "cpu/cpu_backend.h"
#include "kv/transport.h"
#include "model/backend.h"

namespace specserve {
namespace {

KvExportFormat small_format() {
  KvExportFormat f;
  f.model_fingerprint = 0x0123456789abcdefull;
  f.layer_begin = 0;
  f.layer_end = 3;
  f.block_size = 4;
  f.kv_dim = 8;
  return f;
}

KvBlockHeader small_header() {
  KvBlockHeader h;
  h.format = small_format();
  h.num_tokens = 10;  // 3 blocks of 4
  h.checksums = {11, 22, 33};
  return h;
}

TEST(KvHeader, RoundTripsAndPadsTo64Bytes) {
  const KvBlockHeader h = small_header();
  const auto bytes = encode_kv_header(h);
  EXPECT_EQ(bytes.size(), 128u);  // 64 fixed + 3 * 8, rounded up
  EXPECT_EQ(kv_header_bytes(0), 64);
  EXPECT_EQ(kv_header_bytes(8), 128);
  EXPECT_EQ(kv_header_bytes(9), 192);
  auto d = decode_kv_header(bytes.data(), static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->format.model_fingerprint, h.format.model_fingerprint);
  EXPECT_EQ(d->format.layer_begin, 0);
  EXPECT_EQ(d->format.layer_end, 3);
  EXPECT_EQ(d->format.block_size, 4);
  EXPECT_EQ(d->format.kv_dim, 8);
  EXPECT_EQ(d->format.dtype, KvDtype::kF32);
  EXPECT_EQ(d->format.layout, KvLayout::kBlockLayerKV);
  EXPECT_EQ(d->num_tokens, 10);
  EXPECT_EQ(d->checksums, h.checksums);
  EXPECT_EQ(d->format.block_bytes(), 3 * 2 * 4 * 8 * 4);
  EXPECT_EQ(kv_export_bytes(h.format, 3), 128 + 3 * d->format.block_bytes());
}

TEST(KvHeader, DecodeRejectsDamageNamingTheField) {
  const auto good = encode_kv_header(small_header());
  auto expect_error = [&](std::vector<uint8_t> bytes, StatusCode code, const std::string& needle) {
    auto d = decode_kv_header(bytes.data(), static_cast<int64_t>(bytes.size()));
    ASSERT_FALSE(d.ok()) << "accepted: " << needle;
    EXPECT_EQ(d.status().code(), code) << d.status().to_string();
    EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status().to_string();
  };
  auto bad_magic = good;
  bad_magic[0] ^= 1;
  expect_error(bad_magic, StatusCode::kCorruptData, "magic");
  auto bad_version = good;
  bad_version[4] = 9;
  expect_error(bad_version, StatusCode::kUnsupported, "version 9");
  auto flipped = good;
  flipped[20] ^= 0x40;  // layer_end, without updating the header checksum
  expect_error(flipped, StatusCode::kCorruptData, "header checksum");
  auto flipped_sum = good;
  flipped_sum[64] ^= 1;  // a block checksum is covered by the header checksum too
  expect_error(flipped_sum, StatusCode::kCorruptData, "header checksum");
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 80), StatusCode::kCorruptData, "num_blocks 3");
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 40), StatusCode::kCorruptData, "at least 64");

  // Well-formed encodings of impossible headers (the encoder writes what it is given).
  KvBlockHeader h = small_header();
  h.num_tokens = 13;  // > 3 blocks of 4
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "num_tokens 13");
  h = small_header();
  h.num_tokens = 8;  // fits in 2 blocks: the third would be empty
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "num_tokens 8");
  h = small_header();
  h.format.layer_end = 0;
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "layer range [0, 0)");
  h = small_header();
  h.format.block_size = 0;
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "block_size 0");
  h = small_header();
  h.format.dtype = static_cast<KvDtype>(77);
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "dtype 77");
  h = small_header();
  h.format.layout = static_cast<KvLayout>(5);
  expect_error(encode_kv_header(h), StatusCode::kCorruptData, "layout 5");
}

TEST(KvHeader, CheckCompatibleNamesFieldAndBothValues) {
  const KvBlockHeader h = small_header();
  EXPECT_TRUE(check_compatible(h, small_format()).ok());
  struct Case {
    void (*change)(KvExportFormat&);
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](KvExportFormat& f) { f.model_fingerprint = 0xfeedull; },
       {"model_fingerprint", "0x0123456789abcdef", "0x000000000000feed"}},
      {[](KvExportFormat& f) { f.layout = static_cast<KvLayout>(2); }, {"layout", "block-layer-kv", "unknown"}},
      {[](KvExportFormat& f) { f.dtype = KvDtype::kF16; }, {"dtype", "f32", "f16"}},
      {[](KvExportFormat& f) { f.block_size = 16; }, {"block_size", "4 != expected 16"}},
      {[](KvExportFormat& f) { f.kv_dim = 64; }, {"kv_dim", "8 != expected 64"}},
      {[](KvExportFormat& f) { f.layer_begin = 1; }, {"layer range", "[0, 3) != expected [1, 3)"}},
  };
  for (const auto& c : cases) {
    KvExportFormat want = small_format();
    c.change(want);
    const Status st = check_compatible(h, want);
    ASSERT_FALSE(st.ok()) << c.needles[0];
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    for (const auto& n : c.needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message() << " lacks " << n;
  }
}

TEST(KvHeader, VerifyChecksumsNamesTheFirstDamagedBlock) {
  KvBlockHeader h = small_header();
  const int64_t bb = h.format.block_bytes();
  std::vector<uint8_t> payload(static_cast<size_t>(3 * bb));
  std::iota(payload.begin(), payload.end(), 0);
  for (int i = 0; i < 3; ++i) h.checksums[i] = kv_block_checksum(payload.data() + i * bb, bb);
  int64_t bad = 99;
  EXPECT_TRUE(verify_checksums(h, payload.data(), 3 * bb, &bad).ok());
  EXPECT_EQ(bad, -1);
  payload[static_cast<size_t>(bb + 5)] ^= 0x10;      // block 1
  payload[static_cast<size_t>(2 * bb + bb - 1)] ^= 1;  // block 2, last byte
  const Status st = verify_checksums(h, payload.data(), 3 * bb, &bad);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kCorruptData);
  EXPECT_EQ(bad, 1);
  EXPECT_NE(st.message().find("block 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("2 of 3"), std::string::npos) << st.message();
  EXPECT_EQ(verify_checksums(h, payload.data(), 3 * bb - 1).code(), StatusCode::kInvalidArgument);
}

// A CPU KvStorage filled with random K/V, and attention over a sequence's block table.
class KvExportImport : public ::testing::Test {
 protected:
  static constexpr int64_t kLayers = 3, kBlocks = 12, kBs = 4, kHeads = 4, kKvHeads = 2, kHd = 8;
  static constexpr int64_t kKvDim = kKvHeads * kHd;

  void SetUp() override {
    be_ = make_cpu_backend(1);
    auto kv = be_->create_kv_storage(kLayers, kBlocks, kBs, kKvDim);
    ASSERT_TRUE(kv.ok());
    kv_ = std::move(*kv);
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<int32_t> slots(kBlocks * kBs);
    std::iota(slots.begin(), slots.end(), 0);
    for (int64_t l = 0; l < kLayers; ++l) {
      std::vector<float> k(slots.size() * kKvDim), v(k.size());
      for (auto& x : k) x = 2 * dist(rng);
      for (auto& x : v) x = dist(rng);
      auto kb = upload(k), vb = upload(v), sb = upload(slots);
      be_->kv_write(*kv_, l, kb->f32(), vb->f32(), sb->i32(), static_cast<int64_t>(slots.size()));
    }
  }
  template <typename T>
  std::unique_ptr<Buffer> upload(const std::vector<T>& host) {
    auto b = be_->alloc(static_cast<int64_t>(host.size() * sizeof(T)));
    be_->upload(*b, host.data(), static_cast<int64_t>(host.size() * sizeof(T)));
    return b;
  }
  // Output of one decode row attending to `num_tokens` cached tokens through `table`, per layer.
  std::vector<float> attend(const std::vector<int32_t>& table, int32_t num_tokens) {
    std::vector<float> q(kHeads * kHd);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-2, 2);
    for (auto& x : q) x = dist(rng);
    auto qb = upload(q);
    std::vector<float> all;
    for (int64_t l = 0; l < kLayers; ++l) {
      AttentionSeq a;
      a.num_rows = 1;
      a.num_cached = num_tokens - 1;  // the row reads slot num_tokens - 1 as its own
      a.block_table = table.data();
      a.num_blocks = static_cast<int32_t>(table.size());
      auto ob = be_->alloc(kHeads * kHd * 4);
      be_->attention(*kv_, l, qb->f32(), {a}, kHeads, kKvHeads, kHd, ob->f32());
      std::vector<float> o(kHeads * kHd);
      be_->download(o.data(), *ob, static_cast<int64_t>(o.size() * 4));
      all.insert(all.end(), o.begin(), o.end());
    }
    return all;
  }
  std::vector<uint8_t> packed(const std::vector<int32_t>& blocks) {
    std::vector<uint8_t> out(static_cast<size_t>(blocks.size() * kv_block_bytes(*kv_, 0, kLayers)));
    be_->kv_export_blocks(*kv_, 0, kLayers, blocks.data(), static_cast<int64_t>(blocks.size()), out.data());
    return out;
  }

  std::unique_ptr<Backend> be_;
  std::unique_ptr<KvStorage> kv_;
};

TEST_F(KvExportImport, RoundTripIntoOtherBlocksGivesIdenticalKvAndAttention) {
  const std::vector<int32_t> src = {7, 2, 9}, dst = {0, 11, 4};
  const int32_t num_tokens = 10;
  const KvExportFormat fmt = kv_export_format(*kv_, 0xabcdull);
  EXPECT_EQ(fmt.layer_end, kLayers);
  std::vector<uint8_t> wire(static_cast<size_t>(kv_export_bytes(fmt, 3)));
  auto h = export_kv_blocks(*be_, *kv_, fmt, src.data(), 3, num_tokens, wire.data(), static_cast<int64_t>(wire.size()));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->num_blocks(), 3);
  const auto before_attn = attend(src, num_tokens);
  // The destination blocks hold other values before the import (else the check proves nothing).
  ASSERT_NE(packed(src), packed(dst));
  ASSERT_NE(attend(dst, num_tokens), before_attn);

  // Through the in-process transport, as two workers of one process would.
  auto ep = make_in_process_endpoint();
  std::vector<uint8_t> received(wire.size());
  ASSERT_TRUE(ep->get(received.data(), static_cast<int64_t>(wire.size()), in_process_region(wire.data(), static_cast<int64_t>(wire.size())), 0,
                      kv_deadline_after(std::chrono::seconds(1)))
                  .ok());
  auto imported = import_kv_blocks(*be_, *kv_, fmt, received.data(), static_cast<int64_t>(received.size()), dst.data(), 3);
  ASSERT_TRUE(imported.ok()) << imported.status().to_string();
  EXPECT_EQ(imported->num_tokens, num_tokens);
  EXPECT_EQ(packed(dst), packed(src));
  const auto after_attn = attend(dst, num_tokens);
  ASSERT_EQ(after_attn.size(), before_attn.size());
  EXPECT_EQ(std::memcmp(after_attn.data(), before_attn.data(), after_attn.size() * 4), 0);
}

TEST_F(KvExportImport, ImportRefusesIncompatibleOrDamagedExportsWithoutWriting) {
  const std::vector<int32_t> src = {1, 3}, dst = {5, 6};
  const KvExportFormat fmt = kv_export_format(*kv_, 42);
  std::vector<uint8_t> wire(static_cast<size_t>(kv_export_bytes(fmt, 2)));
  ASSERT_TRUE(export_kv_blocks(*be_, *kv_, fmt, src.data(), 2, 5, wire.data(), static_cast<int64_t>(wire.size())).ok());
  const auto dst_before = packed(dst);
  const auto n = static_cast<int64_t>(wire.size());

  KvExportFormat other_model = fmt;
  other_model.model_fingerprint = 43;
  auto r = import_kv_blocks(*be_, *kv_, other_model, wire.data(), n, dst.data(), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model_fingerprint"), std::string::npos) << r.status().to_string();

  r = import_kv_blocks(*be_, *kv_, fmt, wire.data(), n, dst.data(), 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  auto damaged = wire;
  damaged[damaged.size() - 3] ^= 0x01;  // last block's payload
  r = import_kv_blocks(*be_, *kv_, fmt, damaged.data(), n, dst.data(), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData) << "a damaged block means: recompute";
  EXPECT_NE(r.status().message().find("block 1"), std::string::npos) << r.status().to_string();

  r = import_kv_blocks(*be_, *kv_, fmt, wire.data(), n - 8, dst.data(), 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruptData);
  EXPECT_NE(r.status().message().find("truncated"), std::string::npos);

  EXPECT_EQ(packed(dst), dst_before) << "a refused import wrote into the cache";
}

TEST_F(KvExportImport, ExportChecksItsArguments) {
  const std::vector<int32_t> blocks = {0, 1};
  const KvExportFormat fmt = kv_export_format(*kv_, 1);
  std::vector<uint8_t> wire(static_cast<size_t>(kv_export_bytes(fmt, 2)));
  const auto n = static_cast<int64_t>(wire.size());
  EXPECT_EQ(export_kv_blocks(*be_, *kv_, fmt, blocks.data(), 2, 9, wire.data(), n).status().code(),
            StatusCode::kInvalidArgument);  // 9 tokens > 2 blocks of 4
  EXPECT_EQ(export_kv_blocks(*be_, *kv_, fmt, blocks.data(), 2, 8, wire.data(), n - 1).status().code(),
            StatusCode::kInvalidArgument);  // capacity
  KvExportFormat wrong = fmt;
  wrong.block_size = 8;
  auto r = export_kv_blocks(*be_, *kv_, wrong, blocks.data(), 2, 8, wire.data(), n);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("block_size"), std::string::npos) << r.status().to_string();
  const std::vector<int32_t> out_of_range = {0, static_cast<int32_t>(kBlocks)};
  EXPECT_EQ(export_kv_blocks(*be_, *kv_, fmt, out_of_range.data(), 2, 8, wire.data(), n).status().code(),
            StatusCode::kInvalidArgument);
  // A later pipeline stage's layers only.
  const KvExportFormat tail = kv_export_format(*kv_, 1, 1, 3);
  std::vector<uint8_t> part(static_cast<size_t>(kv_export_bytes(tail, 2)));
  auto h = export_kv_blocks(*be_, *kv_, tail, blocks.data(), 2, 8, part.data(), static_cast<int64_t>(part.size()));
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->payload_bytes(), 2 * 2 * 2 * kBs * kKvDim * 4);
}

TEST(InProcessTransport, CopiesBothWaysAndChecksTheRange) {
  std::vector<uint8_t> remote(256), local(64, 0xaa);
  std::iota(remote.begin(), remote.end(), 0);
  auto ep = make_in_process_endpoint();
  const KvRemoteRegion region = in_process_region(remote.data(), 256);
  const auto deadline = kv_deadline_after(std::chrono::seconds(1));
  ASSERT_TRUE(ep->get(local.data(), 64, region, 100, deadline).ok());
  EXPECT_EQ(local[0], 100);
  EXPECT_EQ(local[63], 163);
  ASSERT_TRUE(ep->put(local.data(), 64, region, 0, deadline).ok());
  EXPECT_EQ(remote[0], 100);
  const Status st = ep->get(local.data(), 64, region, 200, deadline);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("[200, +64)"), std::string::npos) << st.message();
  EXPECT_EQ(ep->get(local.data(), 1, region, -1, deadline).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(ep->failed());
}

}  // namespace
}  // namespace specserve
