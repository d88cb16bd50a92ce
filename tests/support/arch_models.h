#pragma once
// Small random models of every architecture duet runs, for the tests that hold each backend and
// plan to the reference forward pass (tests/program, tests/gpu, tests/integration): mkmodel's
// tiny-* shapes (2 layers, n_embd 128, head_dim 32, GQA; tiny-gemma: n_embd 512, head_dim 256,
// one KV head, as Gemma 2B) with a 2048-piece synthetic vocabulary
// and weights of std 0.08, large enough that a wrong rope pairing, a missing bias or ignored
// rope factors move the logits by ~0.3-3 (measured against llama.cpp on these shapes, whose own
// F16 results differ from the reference by ~0.003). Written once per process into a private temp
// directory. Header-only.
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/model/arch.h"
#include "core/model/dtype.h"
#include "core/model/shapes.h"

namespace duet::test_support {

struct ArchModel {
  std::string name;  // file stem
  Arch arch;
  std::string shape;  // core/model/shapes.h
  float rope_scale_linear = 0.0f;
};

// qwen2 (q/k/v biases, NEOX rope, tied output), internlm2, llama with Llama 3.2's rope_freqs
// (tied), llama with linear rope scaling 4, and gemma (GeGLU, embeddings x sqrt(n_embd), tied,
// NEOX rope, head_dim 256). Tests pick some by index: add new ones at the end.
inline const std::vector<ArchModel>& arch_models() {
  static const std::vector<ArchModel> models = {
      {"qwen2", Arch::qwen2, "tiny-qwen2", 0.0f},
      {"internlm2", Arch::internlm2, "tiny-internlm2", 0.0f},
      {"llama3-rope-freqs", Arch::llama, "tiny-llama3", 0.0f},
      {"llama-rope-linear", Arch::llama, "tiny-internlm2", 4.0f},
      {"gemma", Arch::gemma, "tiny-gemma", 0.0f},
  };
  return models;
}

inline const std::filesystem::path& arch_model_dir() {
  static const std::filesystem::path dir = [] {
    auto d =
        std::filesystem::temp_directory_path() / ("duet-arch-models-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

constexpr int kArchModelVocab = 2048;
constexpr float kArchModelStd = 0.08f;

// The model's file in `type`, written on first use.
inline std::string arch_model_path(const ArchModel& m, DType type) {
  const std::filesystem::path p =
      arch_model_dir() / (m.name + "-" + std::string(dtype_name(type)) + ".gguf");
  if (!std::filesystem::exists(p)) {
    SyntheticModelOptions o;
    o.arch = m.arch;
    o.type = type;
    o.n_vocab = kArchModelVocab;
    o.n_ctx = 512;
    o.weight_std = kArchModelStd;
    o.rope_scale_linear = m.rope_scale_linear;
    write_synthetic_model(model_shape(m.shape), o, p.string());
  }
  return p.string();
}

// tiny-llama3-256 (rows of whole K-quant super-blocks) as llama.cpp's mix `preset` ("q4_k_m",
// "q5_k_m", "q6_k"), vocabulary 2048, context 128, weights of std `weight_std` (none:
// mkmodel's), written to dir/<preset>.gguf: its path.
inline std::string write_kquant_mix_model(const std::filesystem::path& dir,
                                          const std::string& preset,
                                          std::optional<float> weight_std = std::nullopt) {
  SyntheticModelOptions o;
  o.preset = preset;
  o.n_vocab = 2048;
  o.n_ctx = 128;
  if (weight_std) o.weight_std = *weight_std;
  const std::string path = (dir / (preset + ".gguf")).string();
  write_synthetic_model(model_shape("tiny-llama3-256"), o, path);
  return path;
}

// Removes the directory when the process ends: one static instance per test executable.
struct ArchModelDirCleanup {
  ArchModelDirCleanup() : dir(arch_model_dir()) {}
  ~ArchModelDirCleanup() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::filesystem::path dir;
};

}  // namespace duet::test_support
