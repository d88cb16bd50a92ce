#include "core/model/forward.h"

#include <cmath>
#include <string>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/quant.h"

namespace duet {

ReferenceForward::ReferenceForward(const LlamaModel& m, int n_ctx)
    : m_(m), n_ctx_(n_ctx > 0 ? n_ctx : m.hp().n_ctx) {
  const LlamaHparams& hp = m.hp();
  const size_t kv = static_cast<size_t>(n_ctx_) * hp.n_head_kv * hp.head_dim;
  k_cache_.assign(hp.n_layer, std::vector<float>(kv));
  v_cache_.assign(hp.n_layer, std::vector<float>(kv));
}

void ReferenceForward::set_kv_type(DType type) {
  if (type != DType::F32 && type != DType::F16 && type != DType::Q8_0)
    throw Error(Errc::invalid_argument, "reference: KV values of type " +
                                            std::string(dtype_name(type)) + " (f32, f16 or q8_0)");
  if (type == DType::Q8_0 && m_.hp().head_dim % kQK != 0)
    throw Error(Errc::invalid_argument, "reference: q8_0 KV needs head_dim a multiple of 32, not " +
                                            std::to_string(m_.hp().head_dim));
  kv_type_ = type;
}

std::vector<float> ReferenceForward::forward(std::span<const int32_t> tokens, bool all_logits) {
  const LlamaHparams& hp = m_.hp();
  const int n = static_cast<int>(tokens.size());
  if (n == 0) throw Error(Errc::invalid_argument, "forward: no tokens");
  if (n > n_ctx_ - pos_) {
    throw Error(Errc::out_of_range, "forward: " + std::to_string(n) + " tokens at position " +
                                        std::to_string(pos_) + " do not fit in a context of " +
                                        std::to_string(n_ctx_));
  }
  const int64_t embd = hp.n_embd, kv_dim = static_cast<int64_t>(hp.n_head_kv) * hp.head_dim;
  x_.resize(n * embd);
  xb_.resize(n * embd);
  q_.resize(n * embd);
  att_.resize(n * embd);
  proj_.resize(n * embd);
  gate_.resize(static_cast<size_t>(n) * hp.n_ff);
  up_.resize(static_cast<size_t>(n) * hp.n_ff);
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = pos_ + t;

  const ops::RopeParams rope = rope_params(m_);
  ops::embed(m_.tok_embd, tokens.data(), n, x_.data());
  if (hp.embd_scale != 1.0f) ops::scale(x_.data(), hp.embd_scale, n * embd);
  for (int l = 0; l < hp.n_layer; ++l) {
    const LlamaLayer& w = m_.layers[l];
    // This step's K/V rows are written straight into the cache (the matmul output stride is
    // the cache row).
    float* k_rows = k_cache_[l].data() + pos_ * kv_dim;
    float* v_rows = v_cache_[l].data() + pos_ * kv_dim;
    ops::rmsnorm(x_.data(), w.attn_norm, n, hp.n_embd, hp.rms_eps, xb_.data());
    ops::matmul(w.wq, xb_.data(), n, q_.data());
    ops::matmul(w.wk, xb_.data(), n, k_rows);
    ops::matmul(w.wv, xb_.data(), n, v_rows);
    if (w.bq) {
      ops::add_bias(q_.data(), w.bq, n, embd);
      ops::add_bias(k_rows, w.bk, n, kv_dim);
      ops::add_bias(v_rows, w.bv, n, kv_dim);
    }
    ops::rope(q_.data(), n, hp.n_head, hp.head_dim, positions.data(), rope);
    ops::rope(k_rows, n, hp.n_head_kv, hp.head_dim, positions.data(), rope);
    if (kv_type_ != DType::F32) {
      std::vector<uint8_t>& stored = kv_stored_;
      stored.resize(dtype_row_bytes(kv_type_, kv_dim));
      for (float* rows : {k_rows, v_rows})
        for (int64_t t = 0; t < n; ++t) {
          quantize_row(kv_type_, rows + t * kv_dim, stored.data(), kv_dim);
          dequantize_row(kv_type_, stored.data(), rows + t * kv_dim, kv_dim);
        }
    }
    ops::attention(q_.data(), k_cache_[l].data(), v_cache_[l].data(), n, positions.data(),
                   hp.n_head, hp.n_head_kv, hp.head_dim, att_.data());
    ops::matmul(w.wo, att_.data(), n, proj_.data());
    ops::add(x_.data(), proj_.data(), n * embd);

    ops::rmsnorm(x_.data(), w.ffn_norm, n, hp.n_embd, hp.rms_eps, xb_.data());
    ops::matmul(w.w_gate, xb_.data(), n, gate_.data());
    ops::matmul(w.w_up, xb_.data(), n, up_.data());
    ops::gated_ffn(hp.ffn_act, gate_.data(), up_.data(), static_cast<int64_t>(n) * hp.n_ff,
                   gate_.data());
    ops::matmul(w.w_down, gate_.data(), n, proj_.data());
    ops::add(x_.data(), proj_.data(), n * embd);
  }
  pos_ += n;

  const int first = all_logits ? 0 : n - 1;
  const int n_out = n - first;
  ops::rmsnorm(x_.data() + first * embd, m_.output_norm, n_out, hp.n_embd, hp.rms_eps, xb_.data());
  std::vector<float> logits(static_cast<size_t>(n_out) * hp.n_vocab);
  ops::matmul(m_.output, xb_.data(), n_out, logits.data());
  return logits;
}

double perplexity(const LlamaModel& m, std::span<const int32_t> ids, int window) {
  if (window < 2)
    throw Error(Errc::invalid_argument, "perplexity: window must be at least 2 tokens");
  ReferenceForward fwd(m, window);
  const int n_vocab = m.hp().n_vocab;
  double nll = 0;
  int64_t scored = 0;
  for (size_t start = 0; start + 1 < ids.size(); start += window) {
    const auto chunk = ids.subspan(start, std::min<size_t>(window, ids.size() - start));
    fwd.reset();
    const std::vector<float> logits = fwd.forward(chunk, true);
    for (size_t t = 0; t + 1 < chunk.size(); ++t) {
      const float* row = logits.data() + t * n_vocab;
      double mx = row[0];
      for (int v = 1; v < n_vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      double sum = 0;
      for (int v = 0; v < n_vocab; ++v) sum += std::exp(row[v] - mx);
      nll += mx + std::log(sum) - row[chunk[t + 1]];
      ++scored;
    }
  }
  if (scored == 0) throw Error(Errc::invalid_argument, "perplexity: fewer than 2 tokens");
  return std::exp(nll / static_cast<double>(scored));
}

}  // namespace duet
