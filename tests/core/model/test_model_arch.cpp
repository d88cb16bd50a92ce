// The architectures duet runs (general.architecture llama | qwen2 | internlm2 | gemma) as mkmodel
// writes them and LlamaModel reads them: hyperparameters, biases, rope pairing and scaling,
// Gemma's activation, embedding scale and tied output, and a clear error for every file duet must
// refuse (an unknown architecture, a vocab-only GGUF, a rope_freqs tensor of the wrong length, a
// missing bias, an unknown rope scaling type, a tensor duet would not read, heads wider than
// n_embd / n_head).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/model.h"
#include "core/model/shapes.h"
#include "tests/support/arch_models.h"

namespace duet {
namespace {

using test_support::arch_model_path;
using test_support::arch_models;
using test_support::ArchModel;

const test_support::ArchModelDirCleanup cleanup;

const ArchModel& arch_model(const std::string& name) {
  for (const auto& m : arch_models())
    if (m.name == name) return m;
  throw Error(Errc::not_found, name);
}

std::string temp_path(const std::string& name) {
  return (test_support::arch_model_dir() / name).string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Copies a GGUF: every key (edit may change them) and the tensors `keep` accepts, with
// `replace` giving new F32 data for a tensor by name (empty: keep its bytes).
void rewrite_gguf(const std::string& src, const std::string& dst,
                  const std::function<void(GgufWriter&)>& edit,
                  const std::function<bool(const std::string&)>& keep = nullptr,
                  const std::string& replace_name = "", std::vector<float> replace = {}) {
  const auto f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& key : f->keys())
    if (key != "general.alignment") w.set_value(key, f->value(key));
  edit(w);
  for (const auto& t : f->tensors()) {
    if (keep && !keep(t.name)) continue;
    if (t.name == replace_name) {
      std::vector<uint8_t> bytes(replace.size() * sizeof(float));
      std::memcpy(bytes.data(), replace.data(), bytes.size());
      w.add_tensor(t.name, DType::F32, {static_cast<int64_t>(replace.size())}, std::move(bytes));
    } else {
      w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.bytes));
    }
  }
  w.write(dst);
}

// The message of the Error that loading `path` throws ("" when it loads).
std::string load_error(const std::string& path, Errc* code = nullptr) {
  try {
    LlamaModel::load(path);
  } catch (const Error& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(ModelArch, Qwen2HasBiasesNeoxRopeAndATiedOutput) {
  const auto m = LlamaModel::load(arch_model_path(arch_model("qwen2"), DType::Q8_0));
  EXPECT_EQ(m->hp().arch, Arch::qwen2);
  EXPECT_EQ(m->hp().rope_mode, ops::RopeMode::neox);
  EXPECT_EQ(m->hp().rope_freq_base, 1000000.0f);
  EXPECT_EQ(m->hp().rms_eps, 1e-6f);
  EXPECT_TRUE(m->tied_output());
  EXPECT_EQ(m->rope_freqs, nullptr);
  for (const LlamaLayer& l : m->layers) {
    ASSERT_NE(l.bq, nullptr);
    ASSERT_NE(l.bk, nullptr);
    ASSERT_NE(l.bv, nullptr);
    EXPECT_NE(l.bq[0], 0.0f);  // random, not zero
  }
}

TEST(ModelArch, InternLm2UsesNormalRopeAndItsOwnOutputMatrix) {
  const auto m = LlamaModel::load(arch_model_path(arch_model("internlm2"), DType::Q4_0));
  EXPECT_EQ(m->hp().arch, Arch::internlm2);
  EXPECT_EQ(m->hp().rope_mode, ops::RopeMode::normal);
  EXPECT_FALSE(m->tied_output());
  EXPECT_EQ(m->layers[0].bq, nullptr);
  EXPECT_EQ(m->hp().rope_freq_scale, 1.0f);
}

TEST(ModelArch, GemmaHasGeGluScaledEmbeddingsNeoxRopeAndATiedOutput) {
  const auto m = LlamaModel::load(arch_model_path(arch_model("gemma"), DType::F16));
  EXPECT_EQ(m->hp().arch, Arch::gemma);
  EXPECT_EQ(m->hp().rope_mode, ops::RopeMode::neox);
  EXPECT_EQ(m->hp().head_dim, 256);  // Gemma 2B's, with one KV head
  EXPECT_EQ(m->hp().n_head_kv, 1);
  EXPECT_EQ(m->hp().rms_eps, 1e-6f);
  EXPECT_EQ(m->hp().ffn_act, ops::FfnAct::gelu_tanh);
  EXPECT_EQ(m->hp().embd_scale, std::sqrt(512.0f));
  EXPECT_TRUE(m->tied_output());
  EXPECT_EQ(m->output.data, m->tok_embd.data);
  EXPECT_EQ(m->file().find_tensor("output.weight"), nullptr);
  EXPECT_EQ(m->file().get_uint("gemma.attention.key_length"), 256u);
  EXPECT_EQ(m->layers[0].bq, nullptr);
  // The other architectures keep SwiGLU and unscaled embeddings.
  const auto q = LlamaModel::load(arch_model_path(arch_model("qwen2"), DType::F16));
  EXPECT_EQ(q->hp().ffn_act, ops::FfnAct::silu);
  EXPECT_EQ(q->hp().embd_scale, 1.0f);
}

// The same weights read as llama (unscaled embeddings, SwiGLU) give other logits: the embedding
// scale (which sets the embedding's share of the residual stream) and GeGLU are not no-ops on
// these files. llama.cpp's answers check their exact values (LlamacppLogits).
TEST(ModelArch, GemmasScaleAndGeGluChangeTheLogitsOfTheSameWeights) {
  const std::string src = arch_model_path(arch_model("gemma"), DType::F16);
  const std::string as_llama = temp_path("gemma-as-llama.gguf");
  const auto f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& key : f->keys()) {
    if (key == "general.alignment") continue;
    if (key == "general.architecture")
      w.set_string(key, "llama");
    else if (key.starts_with("gemma."))
      w.set_value("llama." + key.substr(6), f->value(key));
    else
      w.set_value(key, f->value(key));
  }
  for (const auto& t : f->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.bytes));
  w.write(as_llama);
  const auto gemma = LlamaModel::load(src);
  const auto llama = LlamaModel::load(as_llama);
  const std::vector<int32_t> ids = {1, 300, 400, 500};
  ReferenceForward fg(*gemma, 16), fl(*llama, 16);
  const auto a = fg.forward(ids, false), b = fl.forward(ids, false);
  float max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) max_diff = std::max(max_diff, std::fabs(a[i] - b[i]));
  EXPECT_GT(max_diff, 0.3f);  // far beyond llama.cpp's F16 noise on these files (~0.01)
  std::printf("gemma file read as llama: max |logit difference| %.3f\n", max_diff);
}

TEST(ModelArch, GemmaWithAnOutputMatrixOrWiderHeadsIsRefused) {
  const std::string src = arch_model_path(arch_model("gemma"), DType::F16);
  // llama.cpp reads token_embd as Gemma's output: an output.weight is a tensor it would not read.
  const std::string p = temp_path("gemma-output.gguf");
  const auto f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& key : f->keys())
    if (key != "general.alignment") w.set_value(key, f->value(key));
  for (const auto& t : f->tensors()) {
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.bytes));
    if (t.name == "token_embd.weight")
      w.add_tensor("output.weight", t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.bytes));
  }
  w.write(p);
  Errc code{};
  EXPECT_NE(load_error(p, &code).find("tensor \"output.weight\" is not part of a gemma model"),
            std::string::npos);
  EXPECT_EQ(code, Errc::unsupported);
  // Gemma 7B's heads (key_length 256 with n_embd / n_head = 192) need Q wider than n_embd.
  const std::string wide = temp_path("gemma-wide-heads.gguf");
  rewrite_gguf(src, wide, [](GgufWriter& gw) { gw.set_uint32("gemma.attention.key_length", 128); });
  EXPECT_NE(load_error(wide, &code)
                .find("gemma.attention.key_length 128 is not embedding_length "
                      "/ head_count = 256"),
            std::string::npos);
  EXPECT_EQ(code, Errc::unsupported);
}

TEST(ModelArch, Llama3CarriesTheConvertersRopeFreqs) {
  const auto m = LlamaModel::load(arch_model_path(arch_model("llama3-rope-freqs"), DType::F16));
  EXPECT_EQ(m->hp().arch, Arch::llama);
  EXPECT_EQ(m->hp().rope_freq_base, 500000.0f);
  ASSERT_NE(m->rope_freqs, nullptr);
  const ModelShape& s = model_shape("tiny-llama3");
  const std::vector<float> want = llama3_rope_freqs(s.rope_scaling, s.rope_freq_base, 32);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(m->rope_freqs[i], want[i]) << i;
  // Llama 3.2's factors: high frequencies kept, the lowest divided by the factor 32, a smooth
  // band between.
  EXPECT_EQ(want.front(), 1.0f);
  EXPECT_EQ(want.back(), 32.0f);
  for (size_t i = 1; i < want.size(); ++i) EXPECT_GE(want[i], want[i - 1]);
  const ops::RopeParams p = rope_params(*m);
  EXPECT_EQ(p.freq_factors, m->rope_freqs);
  EXPECT_EQ(p.mode, ops::RopeMode::normal);
}

TEST(ModelArch, LinearRopeScalingDividesEveryAngleByTheFactor) {
  const auto m = LlamaModel::load(arch_model_path(arch_model("llama-rope-linear"), DType::F16));
  EXPECT_EQ(m->hp().rope_freq_scale, 0.25f);
  // Position p scaled by 1/4 is position p/4 unscaled: a model whose tokens sit at positions
  // 0, 4, 8 sees the angles of 0, 1, 2. Check it on the rope op the forward pass uses.
  std::vector<float> a(32, 0.5f), b(32, 0.5f);
  const int32_t scaled[] = {8}, plain[] = {2};
  ops::rope(a.data(), 1, 1, 32, scaled, rope_params(*m));
  ops::RopeParams unscaled = rope_params(*m);
  unscaled.freq_scale = 1.0f;
  ops::rope(b.data(), 1, 1, 32, plain, unscaled);
  for (int i = 0; i < 32; ++i) EXPECT_NEAR(a[i], b[i], 1e-6f) << i;
}

TEST(ModelArch, EveryArchitectureRunsToFiniteLogitsInEveryType) {
  for (const auto& am : arch_models()) {
    for (DType type : {DType::F16, DType::Q8_0, DType::Q4_0}) {
      SCOPED_TRACE(am.name + " " + std::string(dtype_name(type)));
      const auto m = LlamaModel::load(arch_model_path(am, type));
      ReferenceForward fwd(*m, 64);
      const std::vector<int32_t> ids = {1, 300, 400, 500, 600, 700};
      const auto logits = fwd.forward(ids, true);
      float max_abs = 0;
      for (float x : logits) {
        ASSERT_TRUE(std::isfinite(x));
        max_abs = std::max(max_abs, std::fabs(x));
      }
      EXPECT_GT(max_abs, 0.5f);  // std 0.08: logits of order 1, not a near-zero model
    }
  }
}

TEST(ModelArch, AnUnknownArchitectureIsRefusedByNameListingTheKnownOnes) {
  const std::string p = temp_path("neox.gguf");
  rewrite_gguf(arch_model_path(arch_model("internlm2"), DType::Q8_0), p,
               [](GgufWriter& w) { w.set_string("general.architecture", "gptneox"); });
  Errc code{};
  const std::string e = load_error(p, &code);
  EXPECT_EQ(code, Errc::unsupported);
  EXPECT_NE(e.find("\"gptneox\""), std::string::npos) << e;
  EXPECT_NE(e.find("known: llama, qwen2, internlm2, gemma"), std::string::npos) << e;
  EXPECT_NE(e.find(p), std::string::npos) << e;
}

TEST(ModelArch, AVocabOnlyGgufIsRefusedForWhatNeedsWeights) {
  const std::string p = temp_path("vocab-only.gguf");
  rewrite_gguf(
      arch_model_path(arch_model("qwen2"), DType::Q8_0), p, [](GgufWriter&) {},
      [](const std::string&) { return false; });
  EXPECT_EQ(load_error(p),
            p + " has no weights (a vocab-only GGUF): only `duet tokenize` reads it");
  // Through the CLI: generate names the file and the reason.
  const std::string bin = std::string(DUET_BINARY_DIR) + "/bin/duet";
  const std::string out = temp_path("vocab-only.out");
  const std::string cmd = "timeout 60 " + bin + " generate --model " + p +
                          " --local hello --max-tokens 1 > " + out + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(file_bytes(out).find("has no weights (a vocab-only GGUF)"), std::string::npos)
      << file_bytes(out);
}

TEST(ModelArch, ARopeFreqsTensorOfTheWrongLengthIsAClearError) {
  const std::string p = temp_path("short-freqs.gguf");
  rewrite_gguf(
      arch_model_path(arch_model("llama3-rope-freqs"), DType::Q8_0), p, [](GgufWriter&) {}, nullptr,
      "rope_freqs.weight", std::vector<float>(8, 1.0f));
  const std::string e = load_error(p);
  EXPECT_NE(e.find("\"rope_freqs.weight\" has dims [8] but the hyperparameters need [16]"),
            std::string::npos)
      << e;
  const std::string q = temp_path("zero-freqs.gguf");
  rewrite_gguf(
      arch_model_path(arch_model("llama3-rope-freqs"), DType::Q8_0), q, [](GgufWriter&) {}, nullptr,
      "rope_freqs.weight", std::vector<float>(16, 0.0f));
  EXPECT_NE(load_error(q).find("is not a positive frequency divisor"), std::string::npos);
}

TEST(ModelArch, Qwen2WithoutItsBiasesIsAClearError) {
  const std::string p = temp_path("no-bias.gguf");
  rewrite_gguf(
      arch_model_path(arch_model("qwen2"), DType::Q8_0), p, [](GgufWriter&) {},
      [](const std::string& name) { return name != "blk.1.attn_k.bias"; });
  const std::string e = load_error(p);
  EXPECT_NE(e.find("tensor \"blk.1.attn_k.bias\" is missing"), std::string::npos) << e;
}

TEST(ModelArch, RopeScalingDuetDoesNotRunIsRefusedByName) {
  const std::string src = arch_model_path(arch_model("internlm2"), DType::Q8_0);
  const std::string p = temp_path("yarn.gguf");
  rewrite_gguf(src, p, [](GgufWriter& w) { w.set_string("internlm2.rope.scaling.type", "yarn"); });
  Errc code{};
  EXPECT_NE(load_error(p, &code).find("rope scaling type \"yarn\" is not supported"),
            std::string::npos);
  EXPECT_EQ(code, Errc::unsupported);
  rewrite_gguf(src, p,
               [](GgufWriter& w) { w.set_string("internlm2.rope.scaling.type", "wobbly"); });
  EXPECT_NE(load_error(p).find("unknown rope scaling type \"wobbly\""), std::string::npos);
}

TEST(ModelArch, ATensorDuetWouldNotReadIsRefusedRatherThanIgnored) {
  const std::string p = temp_path("extra.gguf");
  const auto src = GgufFile::open(arch_model_path(arch_model("internlm2"), DType::F16));
  GgufWriter w;
  for (const auto& key : src->keys())
    if (key != "general.alignment") w.set_value(key, src->value(key));
  for (const auto& t : src->tensors())
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.bytes));
  w.add_tensor("blk.0.attn_output.bias", DType::F32, {128}, std::vector<uint8_t>(512, 0));
  w.write(p);
  Errc code{};
  EXPECT_NE(load_error(p, &code).find("tensor \"blk.0.attn_output.bias\" is not part of a "
                                      "internlm2 model duet runs"),
            std::string::npos);
  EXPECT_EQ(code, Errc::unsupported);
}

TEST(ModelArch, MkmodelCopiesEveryTokenizerKeyFromAVocabFile) {
  const std::string vocab =
      std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-f16.gguf";
  SyntheticModelOptions o;
  o.arch = Arch::qwen2;
  o.type = DType::Q8_0;
  o.vocab_gguf = vocab;
  o.weight_std = 0.08f;
  const std::string a = temp_path("copied-a.gguf"), b = temp_path("copied-b.gguf");
  write_synthetic_model(model_shape("tiny-qwen2"), o, a);
  o.n_threads = 1;
  write_synthetic_model(model_shape("tiny-qwen2"), o, b);
  EXPECT_EQ(file_bytes(a), file_bytes(b));  // same arguments, same bytes

  const auto src = GgufFile::open(vocab);
  const auto dst = GgufFile::open(a);
  int copied = 0;
  for (const auto& key : src->keys()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    ++copied;
    const GgufValue& x = src->value(key);
    const GgufValue& y = dst->value(key);
    EXPECT_EQ(x.type, y.type) << key;
    EXPECT_EQ(x.elem_type, y.elem_type) << key;
    EXPECT_EQ(x.u, y.u) << key;
    EXPECT_EQ(x.i, y.i) << key;
    EXPECT_EQ(x.f, y.f) << key;
    EXPECT_EQ(x.s, y.s) << key;
    EXPECT_EQ(x.strings, y.strings) << key;
    EXPECT_EQ(x.ints, y.ints) << key;
    EXPECT_EQ(x.floats, y.floats) << key;
  }
  EXPECT_GE(copied, 5);
  const auto m = LlamaModel::load(a);
  EXPECT_EQ(m->hp().n_vocab, static_cast<int>(src->value("tokenizer.ggml.tokens").count));
  EXPECT_EQ(m->hp().arch, Arch::qwen2);

  o.n_vocab = 4096;  // a size and a file: which one is meant?
  EXPECT_THROW(write_synthetic_model(model_shape("tiny-qwen2"), o, a), Error);
}

TEST(ModelArch, MkmodelCliTakesArchAndAVocabFileOrSize) {
  const std::string bin = std::string(DUET_BINARY_DIR) + "/bin/duet";
  const std::string vocab =
      std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-f16.gguf";
  const std::string out = temp_path("cli-internlm2.gguf");
  std::string cmd = "timeout 60 " + bin +
                    " mkmodel --arch internlm2 --shape tiny-internlm2 --type q4_0 --vocab " +
                    vocab + " --out " + out + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto m = LlamaModel::load(out);
  EXPECT_EQ(m->hp().arch, Arch::internlm2);
  EXPECT_EQ(m->hp().n_vocab, 2048);

  const std::string msg = temp_path("cli.out");
  cmd = "timeout 60 " + bin + " mkmodel --arch gpt2 --shape tiny-internlm2 --vocab 512 --out " +
        out + " > " + msg + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(
      file_bytes(msg).find("\"gpt2\" is not one duet runs (known: llama, qwen2, internlm2, gemma)"),
      std::string::npos)
      << file_bytes(msg);
}

}  // namespace
}  // namespace duet
