#pragma once
// A Llama-family model read from GGUF: hyperparameters from the "<arch>.*" keys and the weight
// matrices in place inside the mmapped file (never copied). load() validates every tensor's
// type and dims against the hyperparameters, so code that runs a model can trust the shapes.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/gguf.h"
#include "core/ops.h"
#include "core/tokenizer.h"

namespace duet {

struct LlamaHparams {
  int n_vocab, n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, head_dim;
  float rope_freq_base, rms_eps;
};

struct LlamaLayer {
  const float* attn_norm;
  ops::Matrix wq, wk, wv, wo;
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
  std::vector<std::vector<float>> converted_norms_;  // norms stored as F16 in the file, as fp32
};

}  // namespace duet
