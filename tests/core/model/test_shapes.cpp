// Named model shapes carry the real models' dimensions; the synthetic vocab is a usable one.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "core/base/error.h"
#include "core/model/shapes.h"
#include "core/model/tokenizer.h"
#include "tests/support/error_code.h"

namespace duet {
namespace {

// A model's published dimensions (its config.json); 0 where a row does not check one.
struct Published {
  const char* name;
  int n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx;
  float rope_freq_base;
  bool tied_embeddings;
};

TEST(Shapes, NamedShapesHaveThePublishedDimensions) {
  const Published published[] = {
      // name, n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv, n_ctx, rope_freq_base, tied
      {"llama3.2-1b", 128256, 2048, 16, 8192, 32, 8, 131072, 500000.0f, true},
      {"llama3-8b", 128256, 4096, 32, 14336, 0, 8, 0, 500000.0f, false},
      {"llama2-7b", 32000, 0, 0, 11008, 32, 32, 0, 10000.0f, false},  // no GQA
      {"internlm-1.8b", 92544, 2048, 24, 0, 16, 8, 0, 1000000.0f, false},
      // Llama 3.2 3B (HeteroInfer's Llama-3B): tied embeddings.
      {"llama3.2-3b", 128256, 3072, 28, 8192, 24, 8, 0, 0, true},
      // Gemma 2B (google/gemma-2b config.json): multi-query, tied.
      {"gemma-2b", 256000, 2048, 18, 16384, 8, 1, 8192, 0, true},
      {"tiny-gemma", 0, 0, 0, 0, 0, 1, 0, 0, false},
      {"tiny-fortune", 2048, 256, 0, 704, 0, 0, 512, 0, false},
  };
  for (const Published& p : published) {
    SCOPED_TRACE(p.name);
    const ModelShape& s = model_shape(p.name);
    const std::tuple<const char*, int, int> dims[] = {
        {"n_vocab", s.n_vocab, p.n_vocab}, {"n_embd", s.n_embd, p.n_embd},
        {"n_layer", s.n_layer, p.n_layer}, {"n_ff", s.n_ff, p.n_ff},
        {"n_head", s.n_head, p.n_head},    {"n_head_kv", s.n_head_kv, p.n_head_kv},
        {"n_ctx", s.n_ctx, p.n_ctx}};
    for (const auto& [dim, got, want] : dims) {
      if (want != 0) {
        EXPECT_EQ(got, want) << dim;
      }
    }
    if (p.rope_freq_base != 0) {
      EXPECT_EQ(s.rope_freq_base, p.rope_freq_base);
    }
    if (p.tied_embeddings) {
      EXPECT_TRUE(s.tied_embeddings);
    }
  }
  // Llama 3.2's rope scaling on the 3B as on the 1B; Gemma's head_dim 256 = 2048 / 8 (kept by
  // tiny-gemma) and its rms eps.
  EXPECT_EQ(model_shape("llama3.2-3b").rope_scaling.factor,
            model_shape("llama3.2-1b").rope_scaling.factor);
  for (const char* gemma : {"gemma-2b", "tiny-gemma"})
    EXPECT_EQ(model_shape(gemma).n_embd / model_shape(gemma).n_head, 256) << gemma;
  EXPECT_EQ(model_shape("gemma-2b").rms_eps, 1e-6f);
}

TEST(Shapes, EveryShapeSplitsIntoWholeHeadsAndQuantBlocks) {
  const auto names = model_shape_names();
  EXPECT_EQ(names.size(), 13u);
  for (const auto& name : names) {
    const ModelShape& s = model_shape(name);
    EXPECT_EQ(s.name, name);
    EXPECT_EQ(s.n_embd % s.n_head, 0) << name;
    EXPECT_EQ(s.n_head % s.n_head_kv, 0) << name;
    EXPECT_EQ(s.n_embd % 32, 0) << name;
    EXPECT_EQ(s.n_ff % 32, 0) << name;
  }
  // Every matrix row of tiny-llama3-256 is whole K-quant super-blocks (no fallback types).
  const ModelShape& k = model_shape("tiny-llama3-256");
  EXPECT_EQ(k.n_embd % 256, 0);
  EXPECT_EQ(k.n_ff % 256, 0);
}

TEST(Shapes, UnknownShapeIsNotFoundAndListsTheKnownOnes) {
  std::string message;
  EXPECT_EQ(test_support::error_code_of([] { model_shape("llama-9000"); }, &message),
            Errc::not_found);
  EXPECT_NE(message.find("llama-9000"), std::string::npos) << message;
  EXPECT_NE(message.find("llama3-8b"), std::string::npos) << message;
}

TEST(Shapes, SyntheticVocabIsUniqueAndTokenizesText) {
  const SyntheticVocab sv = make_synthetic_vocab(4096);
  ASSERT_EQ(sv.tokens.size(), 4096u);
  ASSERT_EQ(sv.scores.size(), 4096u);
  ASSERT_EQ(sv.types.size(), 4096u);
  EXPECT_EQ(std::set<std::string>(sv.tokens.begin(), sv.tokens.end()).size(), 4096u);
  EXPECT_EQ(sv.tokens[1], "<s>");
  EXPECT_EQ(sv.tokens[3 + 0x41], "<0x41>");

  Vocab v;
  v.pieces = sv.tokens;
  v.scores = sv.scores;
  v.types = sv.types;
  const Tokenizer t(v);
  const std::string text = "the quick brown fox, 42!\n\xc3\xa9t\xc3\xa9";
  const auto ids = t.encode(text, true);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_LT(ids.size(), text.size());  // merges happened
  // Real vocab sizes are reachable too.
  EXPECT_EQ(make_synthetic_vocab(128256).tokens.size(), 128256u);
  EXPECT_THROW(make_synthetic_vocab(100), Error);
}

}  // namespace
}  // namespace duet
