#pragma once
// A Llama-family model read from GGUF: hyperparameters from the "<arch>.*" keys and the weight
// matrices in place inside the mmapped file (never copied). load() validates every tensor's
// type and dims against the hyperparameters, so code that runs a model can trust the shapes.
//
// Architectures (general.architecture), as llama.cpp runs them:
//   llama      Llama 2, Llama 3.x (rope_freqs.weight: Llama 3.1+'s per-frequency divisors),
//              Mistral, TinyLlama; normal RoPE (adjacent pairs)
//   qwen2      q/k/v projections with biases; NEOX RoPE (pairs half a head apart)
//   internlm2  llama's tensors (the converter splits wqkv); normal RoPE
//   gemma      Gemma (1): GeGLU FFN (GELU's tanh approximation), embeddings scaled by
//              sqrt(n_embd) after the lookup, output always tied to token_embd, NEOX RoPE; the
//              converter already stores RMSNorm's (1 + w) as the weight, so the norm is llama's
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/arch.h"
#include "core/model/gguf.h"
#include "core/model/ops.h"
#include "core/model/tokenizer.h"

namespace duet {

struct LlamaHparams {
  int n_vocab, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim;
  float rope_freq_base, rms_eps;
  Arch arch = Arch::llama;
  ops::RopeMode rope_mode = ops::RopeMode::normal;
  // Linear RoPE scaling: 1 / <arch>.rope.scaling.factor (1 when unscaled), as llama.cpp's
  // freq_scale.
  float rope_freq_scale = 1.0f;
  ops::FfnAct ffn_act = ops::FfnAct::silu;  // the gate's activation (gemma: GELU)
  float embd_scale = 1.0f;                  // token embeddings times this (gemma: sqrt(n_embd))
};

struct LlamaLayer {
  const float* attn_norm;
  ops::Matrix wq, wk, wv, wo;
  const float* bq = nullptr;  // q/k/v biases (qwen2), nullptr when the file has none
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* ffn_norm;
  ops::Matrix w_gate, w_up, w_down;
};

class LlamaModel {
 public:
  static std::unique_ptr<LlamaModel> load(
      const std::string& path);  // validates every dim against hparams

  const GgufFile& file() const { return *file_; }
  const LlamaHparams& hp() const { return hp_; }
  const Vocab& vocab() const { return vocab_; }

  ops::Matrix tok_embd, output;  // output = tok_embd when the file has no output.weight (tied)
  const float* output_norm = nullptr;
  // rope_freqs.weight: head_dim/2 divisors of each pair's frequency (Llama 3.1+'s "llama3" rope
  // scaling, computed by the converter); nullptr when the file has none.
  const float* rope_freqs = nullptr;
  std::vector<LlamaLayer> layers;

  bool tied_output() const { return tied_; }
  uint64_t offset_of(
      const void* p) const;  // byte offset of a pointer into the mapped file (for shm programs)
  uint64_t weight_bytes() const;  // bytes of every matrix and norm a forward pass reads once

 private:
  LlamaModel() = default;
  friend class LlamaLoader;

  std::unique_ptr<GgufFile> file_;
  LlamaHparams hp_{};
  Vocab vocab_;
  bool tied_ = false;
  // Vectors (norms, biases, rope factors) stored as F16 in the file, as fp32.
  std::vector<std::vector<float>> converted_vectors_;
};

// The model's RoPE as the ops take it (base, linear scale, rope_freqs, pairing).
ops::RopeParams rope_params(const LlamaModel& m);

}  // namespace duet
