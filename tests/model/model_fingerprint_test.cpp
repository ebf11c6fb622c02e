// model_fingerprint (model/model_fingerprint.h): the same model fingerprints the same in every
// open; another architecture shape, other weights or other hyper-parameters do not; names
// outside <arch>.* (general.name) do not matter.
#include "model/model_fingerprint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "model/gguf.h"
#include "model/synthetic_model.h"
#include "tests/test_util.h"

namespace specserve {
namespace {

uint64_t fingerprint_of(const SyntheticModelSpec& spec, const std::string& tag) {
  const std::string path = ::testing::TempDir() + "fingerprint_" + tag + ".gguf";
  Status st = write_synthetic_llama(spec, path);
  EXPECT_TRUE(st.ok()) << st.to_string();
  auto f = GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << f.status().to_string();
  const uint64_t fp = model_fingerprint(*f);
  std::remove(path.c_str());
  return fp;
}

TEST(ModelFingerprint, StableForOneModelAndDistinctForOthers) {
  const GgufFile& real = specserve::testing::default_gguf();
  auto again = GgufFile::open(real.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(model_fingerprint(real), model_fingerprint(*again));

  SyntheticModelSpec base;
  const uint64_t fp = fingerprint_of(base, "base");
  EXPECT_EQ(fp, fingerprint_of(base, "base_again"));
  EXPECT_NE(fp, model_fingerprint(real));

  SyntheticModelSpec renamed = base;
  renamed.name = "another-name";
  EXPECT_EQ(fp, fingerprint_of(renamed, "renamed")) << "general.name does not change the KV cache";

  SyntheticModelSpec reseeded = base;  // same names, types and shapes; other weights (a fine-tune)
  reseeded.seed = 2;
  EXPECT_NE(fp, fingerprint_of(reseeded, "reseeded"));

  SyntheticModelSpec theta = base;  // a hyper-parameter only (llama.rope.freq_base)
  theta.rope_theta = 500000.0f;
  EXPECT_NE(fp, fingerprint_of(theta, "theta"));

  SyntheticModelSpec deeper = base;
  deeper.num_layers = 3;
  EXPECT_NE(fp, fingerprint_of(deeper, "deeper"));
}

}  // namespace
}  // namespace specserve
