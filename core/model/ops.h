#pragma once
// The reference ops: the numerical oracle every backend (gpu_svc's OpenCL kernels, npu_svc's
// emulator) is tested against. One op = one function, fp32 math, written for clarity first.
// They parallelise internally over independent rows (see set_num_threads), never change results
// with the thread count, and allocate nothing in the hot path except where noted.
//
// Layouts (row-major, the innermost dimension contiguous, as GGUF/ggml store them):
//   activations  x[n_tokens][dim]
//   weight W     [rows = output features][cols = input features]; each row is dtype_row_bytes()
//   KV cache     per layer: k[n_ctx][n_kv_heads * head_dim], v likewise (sequence outermost,
//                Transformer-Lite's sub-tensor layout: a step writes its rows in place)
#include <cstdint>
#include <functional>

#include "core/model/dtype.h"

namespace duet::ops {

// A weight matrix in place (typically inside the mmapped GGUF file): never copied.
struct Matrix {
  DType type = DType::F32;
  int64_t rows = 0;  // output features (GGUF ne1)
  int64_t cols = 0;  // input features (GGUF ne0)
  const void* data = nullptr;
  size_t row_bytes() const { return dtype_row_bytes(type, cols); }
  const uint8_t* row(int64_t r) const {
    return static_cast<const uint8_t*>(data) + r * row_bytes();
  }
};

// Threads used by the ops (default: hardware concurrency). Results do not depend on it.
void set_num_threads(int n);
int num_threads();

// out[t][:] = dequantised table row tokens[t]. Token ids must be in [0, table.rows).
void embed(const Matrix& table, const int32_t* tokens, int n_tokens, float* out);

// out[t][i] = x[t][i] / sqrt(mean_i(x[t]^2) + eps) * weight[i]. out may alias x.
void rmsnorm(const float* x, const float* weight, int n_tokens, int dim, float eps, float* out);

// y[t][r] = sum_k W[r][k] * x[t][k] for r in [row_begin, row_end). y has row stride W.rows
// (the full output), so two devices splitting the rows write disjoint parts of one tensor.
// row_end < 0 means W.rows.
void matmul(const Matrix& w, const float* x, int n_tokens, float* y, int64_t row_begin = 0,
            int64_t row_end = -1);

// How RoPE pairs a head's values (ggml's mode numbers): normal rotates (2i, 2i+1), GGUF's
// permuted Q/K of llama and internlm2; neox rotates (i, i + head_dim/2), qwen2's.
enum class RopeMode : uint8_t { normal = 0, neox = 2 };

// The rotation of a head's pair i at position p, as ggml's rope with no YaRN extrapolation:
//   theta = p * freq_scale * freq_base^(-2i / head_dim) / freq_factors[i]
// (freq_scale: 1 / linear scaling factor; freq_factors: Llama 3's rope_freqs, nullptr = all 1).
struct RopeParams {
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  const float* freq_factors = nullptr;  // [head_dim / 2]
  RopeMode mode = RopeMode::normal;
};

// Rotates every head of x[t] by positions[t]. In place.
void rope(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* positions,
          const RopeParams& p);

// out[t][i] += bias[i] for t < n_tokens, i < dim (a biased projection's output).
void add_bias(float* x, const float* bias, int n_tokens, int64_t dim);

// Causal GQA attention over a KV cache. q[t] has n_heads*head_dim values; token t attends to
// cache rows 0..positions[t] inclusive (the caller has already written this step's K/V rows).
// Head h reads KV head h / (n_heads / n_kv_heads). Scale 1/sqrt(head_dim).
// out[t] has n_heads*head_dim values.
void attention(const float* q, const float* k_cache, const float* v_cache, int n_tokens,
               const int32_t* positions, int n_heads, int n_kv_heads, int head_dim, float* out);

// out[i][0..cols) = row(i) dequantised from `type`, for i < n, on the pool's threads: KV rows
// scattered over pages into one contiguous cache for attention.
void gather_rows(DType type, const std::function<const void*(int64_t)>& row, int64_t n,
                 int64_t cols, float* out);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)). out may alias gate or up.
void swiglu(const float* gate, const float* up, int64_t n, float* out);

// The gated FFN's activation of the gate (program.fbs Op.ffn_act): silu (SwiGLU: Llama, Qwen2,
// InternLM2) or GELU's tanh approximation (GeGLU: Gemma, as llama.cpp's ggml_gelu).
enum class FfnAct : uint8_t { silu = 0, gelu_tanh = 1 };

// out[i] = gelu(gate[i]) * up[i], gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) g (1 + 0.044715 g^2)))
// (ggml_gelu_f32's formula). out may alias gate or up.
void geglu(const float* gate, const float* up, int64_t n, float* out);

// The gated FFN by act: swiglu or geglu.
void gated_ffn(FfnAct act, const float* gate, const float* up, int64_t n, float* out);

// x[i] *= s (Gemma's embedding scale).
void scale(float* x, float s, int64_t n);

// x[i] += y[i].
void add(float* x, const float* y, int64_t n);

}  // namespace duet::ops
