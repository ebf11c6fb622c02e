// Tests for model/synthetic_model.h: the file loads as a llama model and tokenizer, is
// deterministic in its seed, quantised storage is close to F32, and a noise-free draft is
// exactly the target's first layers.
#include "model/synthetic_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/cpu_backend.h"
#include "model/dequant.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"
#include "model/transformer.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

std::string temp_path(const std::string& stem) {
  return ::testing::TempDir() + "specserve_synth_" + std::to_string(::getpid()) + "_" + stem + ".gguf";
}

SyntheticModelSpec small_spec() {
  SyntheticModelSpec s;
  s.num_layers = 2;
  s.hidden_size = 64;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.ffn_size = 96;
  s.vocab_size = 300;
  s.context_length = 128;
  s.seed = 5;
  return s;
}

std::vector<float> tensor_f32(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.find_tensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (!t) return {};
  auto v = dequantize_tensor(*t);
  EXPECT_TRUE(v.ok()) << v.status().to_string();
  return v.ok() ? *v : std::vector<float>{};
}

TEST(SyntheticModel, LoadsAsLlamaWithTokenizer) {
  const SyntheticModelSpec s = small_spec();
  const std::string path = temp_path("load");
  ASSERT_TRUE(write_synthetic_llama(s, path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  auto c = ModelConfig::from_gguf(*f);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->num_layers, 2);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->num_heads, 4);
  EXPECT_EQ(c->num_kv_heads, 2);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->ffn_size, 96);
  EXPECT_EQ(c->vocab_size, 300);
  EXPECT_EQ(c->context_length, 128);
  EXPECT_FALSE(c->tied_output);

  auto tok = Tokenizer::from_gguf(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(tok->vocab_size(), 300);
  EXPECT_EQ(tok->eos_id(), kSyntheticEosId);
  EXPECT_TRUE(tok->is_eog(kSyntheticEosId));
  const std::string text = "hello World 42!";
  const std::vector<int32_t> ids = tok->encode(text, false, false);
  EXPECT_EQ(ids.size(), text.size());  // no merges: one byte token per byte
  EXPECT_EQ(tok->decode(ids, false), text);
  EXPECT_EQ(tok->token_to_piece(1, false), "a");
  EXPECT_EQ(tok->token_to_piece(257, false), "aa");   // first word token
  EXPECT_EQ(tok->token_to_piece(258, false), " aa");  // with a leading space

  auto backend = make_cpu_backend(1);
  auto m = Transformer::load(*f, *backend);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  ::unlink(path.c_str());
}

TEST(SyntheticModel, SmallVocabularyIsPrintable) {
  const std::vector<std::string> v = synthetic_vocab(64);
  ASSERT_EQ(v.size(), 64u);
  EXPECT_EQ(v[0], "<|endoftext|>");
  EXPECT_EQ(v[1], "a");
  EXPECT_EQ(v[26], "z");
  EXPECT_EQ(v[27], "\xC4\xA0");  // GPT-2's byte-encoded space
  EXPECT_EQ(v[63], "9");
  EXPECT_EQ(synthetic_vocab(1000).size(), 1000u);
}

TEST(SyntheticModel, DeterministicInTheSeed) {
  SyntheticModelSpec s = small_spec();
  const std::string a = temp_path("seed_a"), b = temp_path("seed_b"), c = temp_path("seed_c");
  ASSERT_TRUE(write_synthetic_llama(s, a).ok());
  ASSERT_TRUE(write_synthetic_llama(s, b).ok());
  s.seed = 6;
  ASSERT_TRUE(write_synthetic_llama(s, c).ok());
  EXPECT_EQ(testing::read_file(a), testing::read_file(b));
  EXPECT_NE(testing::read_file(a), testing::read_file(c));
  for (const auto& p : {a, b, c}) ::unlink(p.c_str());
}

TEST(SyntheticModel, QuantisedStorageIsCloseToF32) {
  SyntheticModelSpec s = small_spec();
  const std::string f32 = temp_path("f32");
  ASSERT_TRUE(write_synthetic_llama(s, f32).ok());
  auto ref = GgufFile::open(f32);
  ASSERT_TRUE(ref.ok());
  // Bound on |q - x| relative to the tensor's largest magnitude: half a step of 2*amax/255
  // (Q8_0) or of range/15 (Q4_1), plus fp16 rounding of the scales.
  for (auto [type, bound] : {std::pair{GgmlType::Q8_0, 0.01}, std::pair{GgmlType::Q4_1, 0.08}}) {
    s.storage = type;
    const std::string path = temp_path(std::string("q_") + ggml_type_name(static_cast<uint32_t>(type)));
    ASSERT_TRUE(write_synthetic_llama(s, path).ok());
    auto q = GgufFile::open(path);
    ASSERT_TRUE(q.ok());
    for (const char* name : {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight", "output.weight"}) {
      EXPECT_EQ(q->find_tensor(name)->type(), type) << name;
      const auto x = tensor_f32(*ref, name), y = tensor_f32(*q, name);
      ASSERT_EQ(x.size(), y.size());
      double amax = 0, err = 0;
      for (size_t i = 0; i < x.size(); ++i) amax = std::max(amax, std::fabs(double(x[i]))), err = std::max(err, std::fabs(double(x[i]) - y[i]));
      EXPECT_LT(err, bound * amax) << ggml_type_name(static_cast<uint32_t>(type)) << " " << name;
      EXPECT_GT(err, 0.0) << name << " was not quantised";
    }
    EXPECT_EQ(q->find_tensor("blk.0.attn_norm.weight")->type(), GgmlType::F32);
    auto backend = make_cpu_backend(1);
    EXPECT_TRUE(Transformer::load(*q, *backend).ok());
    ::unlink(path.c_str());
  }
  ::unlink(f32.c_str());
}

TEST(SyntheticModel, NoiseFreeDraftIsTheTargetsFirstLayers) {
  SyntheticModelSpec s = small_spec();
  s.num_layers = 3;
  const std::string tp = temp_path("t"), dp = temp_path("d"), np = temp_path("n");
  ASSERT_TRUE(write_synthetic_llama(s, tp).ok());
  SyntheticDraftSpec d;
  d.num_layers = 1;
  d.context_length = 64;
  ASSERT_TRUE(write_synthetic_draft(s, d, dp).ok());
  d.noise = 0.1f;
  ASSERT_TRUE(write_synthetic_draft(s, d, np).ok());
  auto tf = GgufFile::open(tp);
  auto df = GgufFile::open(dp);
  auto nf = GgufFile::open(np);
  ASSERT_TRUE(tf.ok() && df.ok() && nf.ok());
  auto dc = ModelConfig::from_gguf(*df);
  ASSERT_TRUE(dc.ok());
  EXPECT_EQ(dc->num_layers, 1);
  EXPECT_EQ(dc->context_length, 64);
  EXPECT_EQ(tensor_f32(*tf, "token_embd.weight"), tensor_f32(*df, "token_embd.weight"));
  EXPECT_EQ(tensor_f32(*tf, "blk.0.attn_q.weight"), tensor_f32(*df, "blk.0.attn_q.weight"));
  EXPECT_NE(tensor_f32(*tf, "blk.0.attn_q.weight"), tensor_f32(*nf, "blk.0.attn_q.weight"));
  EXPECT_EQ(df->find_tensor("blk.1.attn_q.weight"), nullptr);

  // The draft's logits equal the target's first layer + head (the layer_skip path).
  auto backend = make_cpu_backend(1);
  auto tm = Transformer::load(*tf, *backend);
  auto dm = Transformer::load(*df, *backend);
  ASSERT_TRUE(tm.ok() && dm.ok());
  auto tkv = (*tm)->create_kv(4, 16);
  auto dkv = (*dm)->create_kv(4, 16);
  ASSERT_TRUE(tkv.ok() && dkv.ok());
  ForwardBatch b;
  b.seqs.push_back(SequenceInput{{3, 1, 4, 1, 5, 9, 2, 6}, 0, {0}, {}, {}});
  ForwardOutput o1, o2;
  ASSERT_TRUE((*dm)->forward(b, **dkv, &o1).ok());
  b.num_layers = 1;
  ASSERT_TRUE((*tm)->forward(b, **tkv, &o2).ok());
  EXPECT_EQ(o1.logits, o2.logits);

  EXPECT_FALSE(write_synthetic_draft(s, SyntheticDraftSpec{4, 0.0f, 1, 0}, dp).ok());  // more layers than the target
  for (const auto& p : {tp, dp, np}) ::unlink(p.c_str());
}

TEST(SyntheticModel, ValidatesTheSpec) {
  SyntheticModelSpec s = small_spec();
  EXPECT_TRUE(validate_synthetic_spec(s).ok());
  s.hidden_size = 60;
  EXPECT_EQ(validate_synthetic_spec(s).code(), StatusCode::kInvalidArgument);
  s = small_spec();
  s.num_kv_heads = 3;
  EXPECT_NE(validate_synthetic_spec(s).message().find("num_kv_heads"), std::string::npos);
  s = small_spec();
  s.ffn_size = 72;  // a multiple of 8, not of 32
  EXPECT_TRUE(validate_synthetic_spec(s).ok());
  s.storage = GgmlType::Q8_0;
  EXPECT_NE(validate_synthetic_spec(s).message().find("ffn_size"), std::string::npos);
  s = small_spec();
  s.storage = GgmlType::Q6_K;
  EXPECT_EQ(validate_synthetic_spec(s).code(), StatusCode::kUnsupported);
  EXPECT_FALSE(write_synthetic_llama(s, temp_path("never")).ok());
}

}  // namespace
}  // namespace specserve
