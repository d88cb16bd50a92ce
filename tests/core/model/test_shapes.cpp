// Named model shapes carry the real models' dimensions; the synthetic vocab is a usable one.
#include <gtest/gtest.h>

#include <set>

#include "core/base/error.h"
#include "core/model/shapes.h"
#include "core/model/tokenizer.h"

namespace duet {
namespace {

TEST(Shapes, NamedShapesHaveThePublishedDimensions) {
  const ModelShape& l32 = model_shape("llama3.2-1b");
  EXPECT_EQ(l32.n_vocab, 128256);
  EXPECT_EQ(l32.n_embd, 2048);
  EXPECT_EQ(l32.n_layer, 16);
  EXPECT_EQ(l32.n_ff, 8192);
  EXPECT_EQ(l32.n_head, 32);
  EXPECT_EQ(l32.n_head_kv, 8);
  EXPECT_EQ(l32.n_ctx, 131072);
  EXPECT_EQ(l32.rope_freq_base, 500000.0f);
  EXPECT_TRUE(l32.tied_embeddings);

  const ModelShape& l3 = model_shape("llama3-8b");
  EXPECT_EQ(l3.n_vocab, 128256);
  EXPECT_EQ(l3.n_embd, 4096);
  EXPECT_EQ(l3.n_layer, 32);
  EXPECT_EQ(l3.n_ff, 14336);
  EXPECT_EQ(l3.n_head_kv, 8);
  EXPECT_EQ(l3.rope_freq_base, 500000.0f);

  const ModelShape& l2 = model_shape("llama2-7b");
  EXPECT_EQ(l2.n_vocab, 32000);
  EXPECT_EQ(l2.n_ff, 11008);
  EXPECT_EQ(l2.n_head, 32);
  EXPECT_EQ(l2.n_head_kv, 32);  // no GQA
  EXPECT_EQ(l2.rope_freq_base, 10000.0f);

  const ModelShape& il = model_shape("internlm-1.8b");
  EXPECT_EQ(il.n_vocab, 92544);
  EXPECT_EQ(il.n_embd, 2048);
  EXPECT_EQ(il.n_layer, 24);
  EXPECT_EQ(il.n_head, 16);
  EXPECT_EQ(il.n_head_kv, 8);
  EXPECT_EQ(il.rope_freq_base, 1000000.0f);

  // Llama 3.2 3B (HeteroInfer's Llama-3B): tied embeddings, Llama 3.2's rope scaling.
  const ModelShape& l323 = model_shape("llama3.2-3b");
  EXPECT_EQ(l323.n_vocab, 128256);
  EXPECT_EQ(l323.n_embd, 3072);
  EXPECT_EQ(l323.n_layer, 28);
  EXPECT_EQ(l323.n_ff, 8192);
  EXPECT_EQ(l323.n_head, 24);
  EXPECT_EQ(l323.n_head_kv, 8);
  EXPECT_TRUE(l323.tied_embeddings);
  EXPECT_EQ(l323.rope_scaling.factor, model_shape("llama3.2-1b").rope_scaling.factor);

  // Gemma 2B (google/gemma-2b config.json): multi-query, head_dim 256 = 2048 / 8, tied.
  const ModelShape& g = model_shape("gemma-2b");
  EXPECT_EQ(g.n_vocab, 256000);
  EXPECT_EQ(g.n_embd, 2048);
  EXPECT_EQ(g.n_layer, 18);
  EXPECT_EQ(g.n_ff, 16384);
  EXPECT_EQ(g.n_head, 8);
  EXPECT_EQ(g.n_head_kv, 1);
  EXPECT_EQ(g.n_embd / g.n_head, 256);
  EXPECT_EQ(g.n_ctx, 8192);
  EXPECT_EQ(g.rms_eps, 1e-6f);
  EXPECT_TRUE(g.tied_embeddings);
  const ModelShape& tg = model_shape("tiny-gemma");
  EXPECT_EQ(tg.n_embd / tg.n_head, 256);
  EXPECT_EQ(tg.n_head_kv, 1);

  const ModelShape& tf = model_shape("tiny-fortune");
  EXPECT_EQ(tf.n_vocab, 2048);
  EXPECT_EQ(tf.n_embd, 256);
  EXPECT_EQ(tf.n_ff, 704);
  EXPECT_EQ(tf.n_ctx, 512);
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
  try {
    model_shape("llama-9000");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("llama-9000"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos);
  }
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
