#pragma once
// Named Llama-family model shapes (the real models' dimensions) for mkmodel, the solver and the
// benchmarks, and the synthetic-model writer behind `duet mkmodel`: a valid GGUF with those shapes,
// random weights and a small synthetic vocabulary.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/arch.h"
#include "core/model/dtype.h"

namespace duet {

// Llama 3.1+'s "llama3" RoPE scaling (HF rope_scaling): frequencies whose wavelength exceeds
// original_ctx / low_freq_factor are divided by factor, those shorter than original_ctx /
// high_freq_factor are kept, and the band between is interpolated. factor 0: none.
struct Llama3RopeScaling {
  float factor = 0.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_ctx = 8192;
};

struct ModelShape {
  std::string name;
  int n_vocab, n_embd, n_layer, n_ff, n_head, n_head_kv,
      n_ctx;  // n_ctx: the model's trained context
  float rope_freq_base;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;  // no output.weight: the output projection is token_embd.weight
  Llama3RopeScaling rope_scaling{};
};

// The rope_freqs.weight a converter writes for llama3 scaling: head_dim/2 divisors of each
// pair's frequency (llama.cpp's convert_hf_to_gguf and HF's _compute_llama3_parameters).
std::vector<float> llama3_rope_freqs(const Llama3RopeScaling& s, float freq_base, int head_dim);

// llama3.2-1b, llama3-8b (Llama 3.0: no rope scaling), llama3.1-8b, llama2-7b, internlm-1.8b,
// gemma-2b, tiny-fortune, and tiny-llama3 / tiny-qwen2 / tiny-internlm2 / tiny-gemma (two small
// layers with the family's real vocabulary size and rope settings, for tests; tiny-gemma keeps
// Gemma 2B's head_dim 256 and single KV head) and tiny-llama3-256 (n_embd 256, n_ff 512:
// rows fit K-quant super-blocks). Throws Errc::not_found naming the known
// shapes.
const ModelShape& model_shape(std::string_view name);
std::vector<std::string> model_shape_names();

struct SyntheticModelOptions {
  Arch arch = Arch::llama;   // general.architecture and the key prefix; qwen2 adds q/k/v biases,
                             // gemma never writes output.weight (tied) and writes key_length
  DType type = DType::Q4_0;  // every matrix; norm weights, biases and rope factors are F32
  // A core/model/quant_mix.h preset name ("q4_k_m"): overrides type, each matrix gets the preset's
  // type for it (llama.cpp's mixing rules, fallbacks) and general.file_type is the preset's.
  std::string preset;
  bool preset_rules = true;  // false: the preset without its mixing rules (pure)
  int n_vocab = 0;           // 0: min(kDefaultSyntheticVocab, the shape's vocab)
  // > 0: linear RoPE scaling (<arch>.rope.scaling.type "linear" and .factor): every angle / it.
  float rope_scale_linear = 0.0f;
  // A GGUF whose tokenizer.* keys (vocabulary, merges, special ids, chat template) are copied;
  // n_vocab is then its token count. Empty: the synthetic SentencePiece vocabulary.
  std::string vocab_gguf;
  int n_layer = 0;  // 0: the shape's
  int n_ctx = 0;    // 0: min(kMaxSyntheticCtx, the shape's)
  uint64_t seed = 1;
  int n_threads = 2;
  float weight_std = 0.02f;  // matrices; norms are 1.0, which keeps activations finite at any depth
};
constexpr int kDefaultSyntheticVocab = 4096;
constexpr int kMaxSyntheticCtx = 8192;
constexpr int kMinSyntheticVocab = 3 + 256 + 1;  // <unk> <s> </s>, 256 byte pieces, "▁"
constexpr int kMaxSyntheticVocab = 1 << 20;

// The vocabulary of a synthetic model: <unk>, <s>, </s>, the 256 byte-fallback pieces, then "▁",
// printable ASCII and lowercase letter strings (with and without "▁") by decreasing score.
// Returns tokens, scores and GGUF token types.
struct SyntheticVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
};
SyntheticVocab make_synthetic_vocab(int n_vocab);

// Writes a GGUF of options.arch (<arch>.* hyperparameters, tokenizer.* vocabulary, blk.N.* tensors,
// rope_freqs.weight for llama3 scaling) with weights drawn from a seeded PRNG and quantised per
// row; tensors stream to the file. The same shape, options, vocab file and seed give the same
// bytes whatever n_threads is. Throws duet::Error.
void write_synthetic_model(const ModelShape& shape, const SyntheticModelOptions& options,
                           const std::string& path);

}  // namespace duet
