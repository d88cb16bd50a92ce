// llama.cpp's per-tensor mixing rules (core/model/quant_mix.h) on a model's tensor list, and
// mkmodel's K presets written through the real writer, loaded by LlamaModel and run by the
// reference forward pass.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <set>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/gguf.h"
#include "core/model/model.h"
#include "core/model/quant_mix.h"
#include "core/model/shapes.h"

namespace duet {
namespace {

// A Llama-like tensor list of n_layer layers, rows of `width` (n_ff = 2 * width), with or
// without output.weight.
std::vector<TensorDesc> llama_tensors(int n_layer, int64_t width, bool output) {
  std::vector<TensorDesc> ts;
  ts.push_back({"token_embd.weight", {width, 1000}, DType::F16});
  for (int l = 0; l < n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", {width}, DType::F32});
    for (const char* m : {"attn_q", "attn_k", "attn_v", "attn_output"})
      ts.push_back({p + m + ".weight", {width, width}, DType::F16});
    ts.push_back({p + "ffn_gate.weight", {width, 2 * width}, DType::F16});
    ts.push_back({p + "ffn_up.weight", {width, 2 * width}, DType::F16});
    ts.push_back({p + "ffn_down.weight", {2 * width, width}, DType::F16});
  }
  ts.push_back({"output_norm.weight", {width}, DType::F32});
  if (output) ts.push_back({"output.weight", {width, 1000}, DType::F16});
  return ts;
}

std::map<std::string, DType> chosen(const std::string& preset, const std::vector<TensorDesc>& ts) {
  const auto types = choose_tensor_types(quant_preset(preset), ts);
  std::map<std::string, DType> out;
  for (size_t i = 0; i < ts.size(); ++i) out[ts[i].name] = types[i];
  return out;
}

TEST(QuantMix, Q4_K_MGivesQ6_KToOutputAndToAttnVAndFfnDownWhereUseMoreBits) {
  // 16 layers: use_more_bits(i, 16) = i < 2 || i >= 14 || (i - 2) % 3 == 2 -> 0 1 4 7 10 13 14 15
  const auto t = chosen("q4_k_m", llama_tensors(16, 2048, true));
  const std::set<int> more = {0, 1, 4, 7, 10, 13, 14, 15};
  for (int l = 0; l < 16; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const DType want = more.count(l) ? DType::Q6_K : DType::Q4_K;
    EXPECT_EQ(t.at(p + "attn_v.weight"), want) << l;
    EXPECT_EQ(t.at(p + "ffn_down.weight"), want) << l;
    EXPECT_EQ(t.at(p + "attn_q.weight"), DType::Q4_K);
    EXPECT_EQ(t.at(p + "ffn_up.weight"), DType::Q4_K);
    EXPECT_EQ(t.at(p + "attn_norm.weight"), DType::F32);  // never quantised
  }
  EXPECT_EQ(t.at("output.weight"), DType::Q6_K);
  EXPECT_EQ(t.at("token_embd.weight"), DType::Q4_K);
  EXPECT_EQ(quant_preset("Q4_K_M").file_type, 15u);
}

TEST(QuantMix, TiedEmbeddingsGetTheOutputRule) {
  const auto t = chosen("q5_k_m", llama_tensors(2, 256, false));
  EXPECT_EQ(t.at("token_embd.weight"), DType::Q6_K);
  EXPECT_EQ(t.at("blk.0.attn_v.weight"), DType::Q5_K);  // use_more_bits(0, 2) is false
  EXPECT_EQ(t.at("blk.1.attn_v.weight"), DType::Q6_K);  // 1 >= 7 * 2 / 8
  EXPECT_EQ(t.at("blk.1.attn_q.weight"), DType::Q5_K);
}

TEST(QuantMix, RowsThatAreNotWholeSuperBlocksFallBackAsLlamaCpp) {
  // width 128: every 128-wide row falls back; ffn_down (256 wide) keeps the K type.
  const auto t = chosen("q4_k_m", llama_tensors(2, 128, true));
  EXPECT_EQ(t.at("blk.0.attn_q.weight"), DType::Q5_0);    // Q4_K -> Q5_0
  EXPECT_EQ(t.at("blk.1.attn_v.weight"), DType::Q8_0);    // Q6_K -> Q8_0
  EXPECT_EQ(t.at("blk.0.ffn_down.weight"), DType::Q4_K);  // 256 wide
  EXPECT_EQ(t.at("blk.1.ffn_down.weight"), DType::Q6_K);
  EXPECT_EQ(t.at("output.weight"), DType::Q8_0);  // output rule: row not a multiple of Q4_K's
  const auto five = chosen("q5_k_m", llama_tensors(2, 128, true));
  EXPECT_EQ(five.at("blk.0.attn_q.weight"), DType::Q5_1);  // Q5_K -> Q5_1
  const auto odd = chosen("q6_k", llama_tensors(1, 48, true));
  EXPECT_EQ(odd.at("blk.0.attn_q.weight"), DType::F16);  // not even whole 32-blocks
}

TEST(QuantMix, PurePresetsAndLegacyTypes) {
  const auto ts = llama_tensors(4, 256, true);
  for (const auto& [name, type] : chosen("q4_0", ts)) {
    if (name != "output.weight" && name.find("norm") == std::string::npos) {
      EXPECT_EQ(type, DType::Q4_0) << name;
    }
  }
  EXPECT_EQ(chosen("q4_0", ts).at("output.weight"), DType::Q6_K);  // as llama.cpp's Q4_0 files
  EXPECT_EQ(chosen("q8_0", ts).at("output.weight"), DType::Q8_0);
  const auto types = choose_tensor_types(pure(quant_preset("q4_k_m")), ts);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_EQ(types[i], ts[i].dims.size() == 1 ? DType::F32 : DType::Q4_K) << ts[i].name;
  EXPECT_THROW(quant_preset("q3_k_m"), Error);
}

class MkmodelPresets : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_ = std::filesystem::path(::testing::TempDir()) / "duet-kq-mkmodel";
};

TEST_F(MkmodelPresets, KMixesLoadAndRunOnTheReferenceForward) {
  std::filesystem::create_directories(dir_);
  const struct {
    const char* preset;
    bool rules;
    DType base, more;
    uint32_t file_type;
  } cases[] = {{"q4_k_m", true, DType::Q4_K, DType::Q6_K, 15},
               {"q5_k_m", true, DType::Q5_K, DType::Q6_K, 17},
               {"q6_k", true, DType::Q6_K, DType::Q6_K, 18},
               {"q4_k", false, DType::Q4_K, DType::Q4_K, 14},
               {"q5_1", false, DType::Q5_1, DType::Q5_1, 9},
               {"bf16", false, DType::BF16, DType::BF16, 32}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.preset);
    SyntheticModelOptions o;
    o.preset = c.preset;
    o.preset_rules = c.rules;
    o.n_vocab = 1024;
    o.n_ctx = 128;
    const std::string p = (dir_ / (std::string(c.preset) + ".gguf")).string();
    write_synthetic_model(model_shape("tiny-llama3-256"), o, p);
    const auto m = LlamaModel::load(p);
    EXPECT_EQ(m->file().get_uint("general.file_type"), c.file_type);
    EXPECT_TRUE(m->tied_output());
    EXPECT_EQ(m->tok_embd.type, c.more);  // tied: the output rule
    EXPECT_EQ(m->layers[0].wv.type, c.base);
    EXPECT_EQ(m->layers[1].wv.type, c.more);
    EXPECT_EQ(m->layers[1].w_down.type, c.more);
    EXPECT_EQ(m->layers[0].wq.type, c.base);
    ReferenceForward fwd(*m, 32);
    const auto logits = fwd.forward(std::vector<int32_t>{1, 50, 300, 7}, true);
    float max_abs = 0;
    for (float x : logits) {
      ASSERT_TRUE(std::isfinite(x));
      max_abs = std::max(max_abs, std::fabs(x));
    }
    EXPECT_GT(max_abs, 0.0f);
  }
}

}  // namespace
}  // namespace duet
