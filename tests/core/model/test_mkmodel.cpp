// Synthetic models (duet mkmodel): valid GGUF files that LlamaModel loads and the reference
// forward pass runs to finite logits, deterministic per seed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/shapes.h"
#include "core/model/tokenizer.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

class MkmodelTest : public test_support::TempDirTest {
 protected:
  MkmodelTest() : TempDirTest("duet-mkmodel") {}
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void expect_runs_to_finite_logits(const std::string& path) {
  const auto model = LlamaModel::load(path);
  const Tokenizer tokenizer(Vocab::from_gguf(model->file()));
  const auto ids = tokenizer.encode("the quick brown fox", true);
  ReferenceForward fwd(*model, 64);
  const auto logits = fwd.forward(ids, true);
  ASSERT_EQ(logits.size(), ids.size() * static_cast<size_t>(model->hp().n_vocab));
  float max_abs = 0;
  for (float x : logits) {
    ASSERT_TRUE(std::isfinite(x));
    max_abs = std::max(max_abs, std::fabs(x));
  }
  EXPECT_GT(max_abs, 0.0f);  // random weights: not all-zero logits
  const auto next =
      fwd.forward(std::vector<int32_t>{ids.back()}, false);  // a decode step on the cache
  for (float x : next) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(MkmodelTest, TinyShapeInEveryTypeLoadsAndRuns) {
  for (DType type : {DType::F16, DType::Q8_0, DType::Q4_0}) {
    SCOPED_TRACE(std::string(dtype_name(type)));
    SyntheticModelOptions o;
    o.type = type;
    o.n_layer = 2;
    const std::string p = path("tiny.gguf");
    write_synthetic_model(model_shape("tiny-fortune"), o, p);
    const auto model = LlamaModel::load(p);
    const LlamaHparams& hp = model->hp();
    EXPECT_EQ(hp.n_vocab, 2048);
    EXPECT_EQ(hp.n_embd, 256);
    EXPECT_EQ(hp.n_layer, 2);
    EXPECT_EQ(hp.n_ff, 704);
    EXPECT_EQ(hp.n_head, 8);
    EXPECT_EQ(hp.n_head_kv, 4);
    EXPECT_EQ(hp.n_ctx, 512);
    EXPECT_EQ(model->tok_embd.type, type);
    EXPECT_FALSE(model->tied_output());
    expect_runs_to_finite_logits(p);
  }
}

// A model of one Q4_0 layer: quick to write and to run.
SyntheticModelOptions one_q4_0_layer() {
  SyntheticModelOptions o;
  o.type = DType::Q4_0;
  o.n_layer = 1;
  return o;
}

TEST_F(MkmodelTest, Llama32OneLayerHasTiedOutputAndGqa) {
  SyntheticModelOptions o = one_q4_0_layer();
  o.n_vocab = 512;
  const std::string p = path("l32.gguf");
  write_synthetic_model(model_shape("llama3.2-1b"), o, p);
  const auto model = LlamaModel::load(p);
  EXPECT_TRUE(model->tied_output());
  EXPECT_EQ(model->hp().n_vocab, 512);
  EXPECT_EQ(model->hp().n_ctx, kMaxSyntheticCtx);  // 131072 capped
  EXPECT_EQ(model->hp().head_dim, 64);
  EXPECT_EQ(model->hp().rope_freq_base, 500000.0f);
  expect_runs_to_finite_logits(p);
}

TEST_F(MkmodelTest, SameSeedSameBytesWhateverTheThreadCount) {
  SyntheticModelOptions o = one_q4_0_layer();
  o.seed = 7;
  o.n_threads = 1;
  write_synthetic_model(model_shape("tiny-fortune"), o, path("a.gguf"));
  o.n_threads = 2;
  write_synthetic_model(model_shape("tiny-fortune"), o, path("b.gguf"));
  o.seed = 8;
  write_synthetic_model(model_shape("tiny-fortune"), o, path("c.gguf"));
  const std::string a = file_bytes(path("a.gguf"));
  EXPECT_GT(a.size(), 100000u);
  EXPECT_EQ(a, file_bytes(path("b.gguf")));
  EXPECT_NE(a, file_bytes(path("c.gguf")));
}

TEST_F(MkmodelTest, BadOptionsAreRejectedBeforeWriting) {
  SyntheticModelOptions o;
  o.n_vocab = 10;
  EXPECT_THROW(write_synthetic_model(model_shape("tiny-fortune"), o, path("x.gguf")), Error);
  o.n_vocab = 0;
  o.n_layer = -1;
  EXPECT_THROW(write_synthetic_model(model_shape("tiny-fortune"), o, path("x.gguf")), Error);
  ModelShape odd = model_shape("tiny-fortune");
  odd.n_ff = 700;  // not whole Q4_0 blocks
  EXPECT_THROW(write_synthetic_model(odd, SyntheticModelOptions{}, path("x.gguf")), Error);
  EXPECT_FALSE(std::filesystem::exists(path("x.gguf")));
}

// `duet mkmodel` writes what `duet tokenize` can read: run the real binary.
TEST_F(MkmodelTest, CliWritesALoadableModel) {
  const std::string bin = std::string(DUET_BINARY_DIR) + "/bin/duet";
  ASSERT_TRUE(std::filesystem::exists(bin)) << bin << " is missing: build the duet target";
  const std::string out = path("cli.gguf");
  const std::string cmd =
      "timeout 60 " + bin +
      " mkmodel --shape internlm-1.8b --type q8_0 --layers 1 --vocab 1024 --out " + out +
      " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto model = LlamaModel::load(out);
  EXPECT_EQ(model->hp().n_embd, 2048);
  EXPECT_EQ(model->hp().n_head, 16);
  EXPECT_EQ(model->hp().n_head_kv, 8);
  EXPECT_EQ(model->hp().n_vocab, 1024);
  EXPECT_EQ(model->hp().n_layer, 1);
  const std::string bad =
      "timeout 30 " + bin + " mkmodel --shape nope --type q8_0 --out " + out + " > /dev/null 2>&1";
  EXPECT_NE(std::system(bad.c_str()), 0);
}

}  // namespace
}  // namespace duet
