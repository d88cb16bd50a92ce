// `duet quantize` through the built binary: an F16 model rewritten as q4_k_m / q6_k / q8_0 /
// q4_0 with llama.cpp's per-tensor rules, metadata copied, per-tensor RMSE in --json equal to
// the error of the written file, a progress bar only on a terminal, clear errors on bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/model/gguf.h"
#include "core/model/model.h"
#include "core/model/quant.h"
#include "core/model/shapes.h"

namespace duet {
namespace {

const std::string kDuet = std::string(DUET_BINARY_DIR) + "/bin/duet";

struct CmdResult {
  int status;
  std::string out;
};

CmdResult run(const std::string& cmd) {
  FILE* p = ::popen(("timeout 120 " + cmd).c_str(), "r");
  if (!p) return {-1, ""};
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  return {::pclose(p), out};
}

class CliQuantize : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(dir());
    SyntheticModelOptions o;
    o.type = DType::F16;
    o.n_vocab = 1024;
    o.n_ctx = 128;
    o.weight_std = 0.08f;
    write_synthetic_model(model_shape("tiny-llama3-256"), o, f16());
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir()); }
  static std::filesystem::path dir() {
    return std::filesystem::temp_directory_path() /
           ("duet-cli-quantize-" + std::to_string(::getpid()));
  }
  static std::string f16() { return (dir() / "f16.gguf").string(); }
  static std::string path(const std::string& name) { return (dir() / name).string(); }
};

TEST_F(CliQuantize, Q4_K_MFollowsLlamaCppsRulesAndReportsEachTensorsRmse) {
  const std::string out = path("q4_k_m.gguf");
  const CmdResult r = run(kDuet + " quantize " + f16() + " " + out + " --type q4_k_m --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("file_type"), 15);
  const auto src = GgufFile::open(f16());
  const auto dst = GgufFile::open(out);
  for (const std::string& key : src->keys()) {
    if (key != "general.file_type") {
      EXPECT_TRUE(dst->has(key)) << key;
    }
  }
  EXPECT_EQ(dst->get_string_array("tokenizer.ggml.tokens"),
            src->get_string_array("tokenizer.ggml.tokens"));
  EXPECT_EQ(dst->get_uint("general.file_type"), 15u);
  ASSERT_EQ(j.at("tensors").size(), src->tensors().size());
  for (const nlohmann::json& t : j.at("tensors")) {
    const std::string name = t.at("name");
    const std::string to = t.at("to");
    std::string want = "Q4_K";
    if (name == "token_embd.weight" || name == "blk.1.attn_v.weight" ||
        name == "blk.1.ffn_down.weight")
      want = "Q6_K";  // tied output; use_more_bits(1, 2)
    if (name.find("norm") != std::string::npos || name == "rope_freqs.weight") want = "F32";
    EXPECT_EQ(to, want) << name;
    EXPECT_EQ(dtype_name(dst->tensor(name).type), want) << name;
    // The reported RMSE is the written tensor's error against the source.
    const GgufTensorInfo& a = src->tensor(name);
    const GgufTensorInfo& b = dst->tensor(name);
    const int64_t cols = a.dims[0];
    const int64_t rows = static_cast<int64_t>(a.bytes / dtype_row_bytes(a.type, cols));
    std::vector<float> x(static_cast<size_t>(cols)), y(x.size());
    double sse = 0;
    for (int64_t row = 0; row < rows; ++row) {
      dequantize_row(a.type, a.data + row * dtype_row_bytes(a.type, cols), x.data(), cols);
      dequantize_row(b.type, b.data + row * dtype_row_bytes(b.type, cols), y.data(), cols);
      for (int64_t k = 0; k < cols; ++k) sse += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
    }
    const double rmse = std::sqrt(sse / static_cast<double>(rows * cols));
    const double reported = t.at("rmse");
    EXPECT_NEAR(reported, rmse, 1e-9 + 1e-6 * rmse) << name;
    if (want == "Q4_K") {
      EXPECT_LT(rmse, 0.08 * 0.1) << name;  // a few % of the weights' std
    }
    if (want != "F32") {
      EXPECT_GT(rmse, 0.0) << name;
    }
  }
  const auto m = LlamaModel::load(out);  // loads, scales finite, mixed types
  EXPECT_EQ(m->layers[0].wv.type, DType::Q4_K);
  EXPECT_EQ(m->layers[1].wv.type, DType::Q6_K);
}

TEST_F(CliQuantize, LegacyAndSixBitPresets) {
  struct Case {
    const char* type;
    const char* embd;  // tied token_embd: the output rule
    const char* other;
  };
  for (const Case& c :
       {Case{"q6_k", "Q6_K", "Q6_K"}, Case{"q8_0", "Q8_0", "Q8_0"}, Case{"q4_0", "Q6_K", "Q4_0"}}) {
    const std::string out = path(std::string(c.type) + ".gguf");
    const CmdResult r =
        run(kDuet + " quantize " + f16() + " " + out + " --type " + c.type + " --threads 1");
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
    const auto m = LlamaModel::load(out);
    EXPECT_EQ(dtype_name(m->tok_embd.type), c.embd) << c.type;
    EXPECT_EQ(dtype_name(m->layers[0].wq.type), c.other) << c.type;
  }
  const std::string out = path("pure.gguf");
  ASSERT_EQ(run(kDuet + " quantize " + f16() + " " + out + " --type q4_0 --pure").status, 0);
  EXPECT_EQ(LlamaModel::load(out)->tok_embd.type, DType::Q4_0);
}

TEST_F(CliQuantize, ProgressBarOnlyOnATerminal) {
  const std::string out = path("tty.gguf");
  // script(1) gives the command a pseudo-terminal.
  const CmdResult tty =
      run("script -qec '" + kDuet + " quantize " + f16() + " " + out + " --type q6_k' /dev/null");
  ASSERT_EQ(tty.status, 0) << tty.out;
  EXPECT_NE(tty.out.find("100%"), std::string::npos) << tty.out;
  const CmdResult pipe = run(kDuet + " quantize " + f16() + " " + out + " --type q6_k 2>&1");
  ASSERT_EQ(pipe.status, 0) << pipe.out;
  EXPECT_EQ(pipe.out.find('%'), std::string::npos) << pipe.out;
}

TEST_F(CliQuantize, BadInputIsAClearError) {
  const std::string q8 = path("q8.gguf");
  ASSERT_EQ(run(kDuet + " quantize " + f16() + " " + q8 + " --type q8_0").status, 0);
  const CmdResult again =
      run(kDuet + " quantize " + q8 + " " + path("x.gguf") + " --type q4_k_m 2>&1");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.out.find("is Q8_0; duet quantize reads F32, F16 and BF16 matrices"),
            std::string::npos)
      << again.out;
  // A float preset expands any type: the F32 file holds exactly the quantised weights.
  const std::string f32 = path("q8-f32.gguf");
  ASSERT_EQ(run(kDuet + " quantize " + q8 + " " + f32 + " --type f32").status, 0);
  const auto q8m = LlamaModel::load(q8), f32m = LlamaModel::load(f32);
  ASSERT_EQ(f32m->layers[0].wq.type, DType::F32);
  std::vector<float> want(256);
  dequantize_row(DType::Q8_0, q8m->layers[0].wq.row(5), want.data(), 256);
  const auto* got = reinterpret_cast<const float*>(f32m->layers[0].wq.row(5));
  EXPECT_EQ(std::vector<float>(got, got + 256), want);
  const CmdResult type =
      run(kDuet + " quantize " + f16() + " " + path("x.gguf") + " --type q3_k 2>&1");
  EXPECT_NE(type.status, 0);
  EXPECT_NE(type.out.find("unknown quantisation type 'q3_k'"), std::string::npos) << type.out;
  const CmdResult missing =
      run(kDuet + " quantize /nonexistent.gguf " + path("x.gguf") + " --type q6_k 2>&1");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("/nonexistent.gguf"), std::string::npos) << missing.out;
  EXPECT_FALSE(std::filesystem::exists(path("x.gguf")));
}

}  // namespace
}  // namespace duet
