#pragma once
// The oracle: a whole Llama model in fp32 (weights dequantised on the fly, fp32 activations and
// KV cache), built only from core/model/ops. Every backend and plan is checked against it.
#include <cstdint>
#include <span>
#include <vector>

#include "core/model/model.h"

namespace duet {

class ReferenceForward {
 public:
  explicit ReferenceForward(const LlamaModel& m, int n_ctx = 0 /* 0 = model's */);
  // Appends tokens at the current position; returns logits [n_tokens][n_vocab] if all_logits,
  // else the last row. Throws out_of_range when the tokens do not fit in the context and
  // invalid_argument for an empty span or a token id outside the vocabulary.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits);
  void reset() { pos_ = 0; }
  // Forgets positions >= n_past (their KV rows are overwritten by the next forward).
  void truncate(int n_past) { pos_ = n_past < pos_ ? (n_past < 0 ? 0 : n_past) : pos_; }
  int position() const { return pos_; }
  // KV rows rounded to f16 or q8_0 as they are stored (what a stack's KV pages hold: the
  // reference plan of a stack follows its --kv-type). F32 by default: the oracle is fp32.
  void set_kv_type(DType type);
  void set_kv_f16(bool on) { set_kv_type(on ? DType::F16 : DType::F32); }
  int n_ctx() const { return n_ctx_; }

 private:
  const LlamaModel& m_;
  int n_ctx_;
  int pos_ = 0;
  DType kv_type_ = DType::F32;
  // KV cache per layer: [n_ctx][n_head_kv * head_dim], sequence outermost.
  std::vector<std::vector<float>> k_cache_, v_cache_;
  // Activations of the current call, reused between calls.
  std::vector<float> x_, xb_, q_, att_, proj_, gate_, up_;
  std::vector<uint8_t> kv_stored_;  // one KV row in kv_type_
};

// Perplexity over ids in consecutive windows of `window` tokens (no overlap, a shorter last
// window included); each window starts from an empty cache and is scored from its 2nd token.
double perplexity(const LlamaModel& m, std::span<const int32_t> ids, int window);

}  // namespace duet
