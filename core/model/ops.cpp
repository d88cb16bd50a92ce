#include "core/model/ops.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/base/thread_pool.h"
#include "core/model/ops_dot.h"
#include "core/model/quant.h"

namespace duet::ops {
namespace {

std::mutex g_pool_mutex;
std::shared_ptr<ThreadPool> g_pool;

int default_threads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

std::shared_ptr<ThreadPool> pool() {
  std::lock_guard lock(g_pool_mutex);
  if (!g_pool) g_pool = std::make_shared<ThreadPool>(default_threads());
  return g_pool;
}

// Scratch that grows to the largest size a thread has needed, then is reused: the hot path
// allocates only the first time a shape is seen.
float* scratch(std::vector<float>& buf, size_t n) {
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

void require(bool ok, const char* op, const std::string& what) {
  if (!ok) throw Error(Errc::invalid_argument, std::string("ops::") + op + ": " + what);
}

// Prefill: rows are unpacked to floats once and reused for every token. Tiles of this many rows
// stay in L2 while the tokens stream past.
constexpr int64_t kRowTile = 16;
// Below this many tokens a row is read in its stored type once per token (decode).
constexpr int kUnpackMinTokens = 4;

}  // namespace

void set_num_threads(int n) {
  require(n >= 1, "set_num_threads", "thread count must be >= 1, got " + std::to_string(n));
  auto fresh = std::make_shared<ThreadPool>(n);
  std::lock_guard lock(g_pool_mutex);
  g_pool = std::move(fresh);
}

int num_threads() {
  return pool()->size();
}

void embed(const Matrix& table, const int32_t* tokens, int n_tokens, float* out) {
  require(n_tokens >= 0, "embed", "negative token count");
  for (int t = 0; t < n_tokens; ++t) {
    require(tokens[t] >= 0 && tokens[t] < table.rows, "embed",
            "token id " + std::to_string(tokens[t]) + " at position " + std::to_string(t) +
                " is outside [0, " + std::to_string(table.rows) + ")");
  }
  for (int t = 0; t < n_tokens; ++t)
    dequantize_row(table.type, table.row(tokens[t]), out + t * table.cols, table.cols);
}

void rmsnorm(const float* x, const float* weight, int n_tokens, int dim, float eps, float* out) {
  require(n_tokens >= 0 && dim > 0, "rmsnorm", "bad shape");
  pool()->parallel_for(n_tokens, 8, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* xt = x + t * dim;
      double sum_sq = 0.0;
      for (int i = 0; i < dim; ++i) sum_sq += static_cast<double>(xt[i]) * xt[i];
      const float scale = static_cast<float>(1.0 / std::sqrt(sum_sq / dim + eps));
      float* ot = out + t * dim;
      for (int i = 0; i < dim; ++i) ot[i] = xt[i] * scale * weight[i];
    }
  });
}

void matmul(const Matrix& w, const float* x, int n_tokens, float* y, int64_t row_begin,
            int64_t row_end) {
  if (row_end < 0) row_end = w.rows;
  require(w.data != nullptr, "matmul", "weight has no data");
  require(n_tokens >= 0, "matmul", "negative token count");
  require(row_begin >= 0 && row_begin <= row_end && row_end <= w.rows, "matmul",
          "row range [" + std::to_string(row_begin) + ", " + std::to_string(row_end) +
              ") outside the weight's " + std::to_string(w.rows) + " rows");
  require(w.cols % dtype_block_elems(w.type) == 0, "matmul",
          "columns not a whole number of blocks");
  const int64_t cols = w.cols;
  const int64_t out_stride = w.rows;
  const int64_t n_rows = row_end - row_begin;
  if (n_tokens < kUnpackMinTokens) {
    pool()->parallel_for(n_rows, 16, [&](int64_t begin, int64_t end) {
      for (int64_t r = row_begin + begin; r < row_begin + end; r += kMaxStreams) {
        const int count = static_cast<int>(std::min<int64_t>(kMaxStreams, row_begin + end - r));
        const void* rows[kMaxStreams];
        for (int s = 0; s < count; ++s) rows[s] = w.row(r + s);
        for (int t = 0; t < n_tokens; ++t) {
          const float* xs[kMaxStreams];
          std::fill(xs, xs + count, x + t * cols);
          dot_rows(w.type, rows, xs, count, cols, y + t * out_stride + r);
        }
      }
    });
    return;
  }
  const int64_t n_tiles = (n_rows + kRowTile - 1) / kRowTile;
  const int64_t scale_stride = cols / kQK + 1;
  pool()->parallel_for(n_tiles, 1, [&](int64_t tile_begin, int64_t tile_end) {
    thread_local std::vector<float> q_buf, scale_buf;
    float* q = scratch(q_buf, static_cast<size_t>(kRowTile * cols));
    float* scales = scratch(scale_buf, static_cast<size_t>(kRowTile * scale_stride));
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t r0 = row_begin + tile * kRowTile;
      const int64_t r1 = std::min(r0 + kRowTile, row_end);
      for (int64_t r = r0; r < r1; ++r)
        unpack_row(w.type, w.row(r), q + (r - r0) * cols, scales + (r - r0) * scale_stride, cols);
      // A few tokens against every row of the tile: the tokens' activations stay in L1.
      for (int t = 0; t < n_tokens; t += kMaxStreams) {
        const int count = std::min(kMaxStreams, n_tokens - t);
        const float* xs[kMaxStreams];
        for (int s = 0; s < count; ++s) xs[s] = x + (t + s) * cols;
        for (int64_t r = r0; r < r1; ++r) {
          float out[kMaxStreams];
          dot_unpacked(w.type, q + (r - r0) * cols, scales + (r - r0) * scale_stride, xs, count,
                       cols, out);
          for (int s = 0; s < count; ++s) y[(t + s) * out_stride + r] = out[s];
        }
      }
    }
  });
}

void rope(float* x, int n_tokens, int n_heads, int head_dim, const int32_t* positions,
          const RopeParams& p) {
  require(head_dim > 0 && head_dim % 2 == 0, "rope",
          "head_dim must be even, got " + std::to_string(head_dim));
  require(n_tokens >= 0 && n_heads > 0, "rope", "bad shape");
  require(p.freq_base > 0.0f, "rope", "freq_base must be positive");
  require(p.freq_scale > 0.0f, "rope", "freq_scale must be positive");
  require(p.mode == RopeMode::normal || p.mode == RopeMode::neox, "rope", "unknown mode");
  const int half = head_dim / 2;
  // The partner of value i of a pair: adjacent (normal) or half a head away (neox).
  const int first_stride = p.mode == RopeMode::normal ? 2 : 1;
  const int partner = p.mode == RopeMode::normal ? 1 : half;
  pool()->parallel_for(n_tokens, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int i = 0; i < half; ++i) {
        // Angles in double: positions up to a long context times the fastest frequency lose
        // digits in float.
        double theta = positions[t] * static_cast<double>(p.freq_scale) *
                       std::pow(static_cast<double>(p.freq_base), -2.0 * i / head_dim);
        if (p.freq_factors) theta /= static_cast<double>(p.freq_factors[i]);
        const float c = static_cast<float>(std::cos(theta));
        const float s = static_cast<float>(std::sin(theta));
        for (int h = 0; h < n_heads; ++h) {
          float* v = x + (t * n_heads + h) * head_dim + first_stride * i;
          const float a = v[0], b = v[partner];
          v[0] = a * c - b * s;
          v[partner] = a * s + b * c;
        }
      }
    }
  });
}

void add_bias(float* x, const float* bias, int n_tokens, int64_t dim) {
  require(n_tokens >= 0 && dim > 0, "add_bias", "bad shape");
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* row = x + t * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += bias[i];
  }
}

void attention(const float* q, const float* k_cache, const float* v_cache, int n_tokens,
               const int32_t* positions, int n_heads, int n_kv_heads, int head_dim, float* out) {
  require(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention",
          "n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv_heads " +
              std::to_string(n_kv_heads));
  require(head_dim > 0 && n_tokens >= 0, "attention", "bad shape");
  int32_t max_pos = -1;
  for (int t = 0; t < n_tokens; ++t) {
    require(positions[t] >= 0, "attention", "negative position at token " + std::to_string(t));
    max_pos = std::max(max_pos, positions[t]);
  }
  const int group = n_heads / n_kv_heads;
  const int64_t kv_dim = static_cast<int64_t>(n_kv_heads) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  pool()->parallel_for(
      static_cast<int64_t>(n_tokens) * n_heads, 1, [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> score_buf;
        float* scores = scratch(score_buf, static_cast<size_t>(max_pos) + 1);
        for (int64_t item = begin; item < end; ++item) {
          const int64_t t = item / n_heads;
          const int h = static_cast<int>(item % n_heads);
          const int64_t kv_off = static_cast<int64_t>(h / group) * head_dim;
          const float* qh = q + (t * n_heads + h) * head_dim;
          const int n_keys = positions[t] + 1;
          float max_score = -INFINITY;
          for (int j = 0; j < n_keys; ++j) {
            scores[j] = dot_row(DType::F32, k_cache + j * kv_dim + kv_off, qh, head_dim) * scale;
            max_score = std::max(max_score, scores[j]);
          }
          float sum = 0.0f;
          for (int j = 0; j < n_keys; ++j) {
            scores[j] = std::exp(scores[j] - max_score);
            sum += scores[j];
          }
          float* oh = out + (t * n_heads + h) * head_dim;
          std::fill(oh, oh + head_dim, 0.0f);
          for (int j = 0; j < n_keys; ++j) {
            const float p = scores[j] / sum;
            const float* vj = v_cache + j * kv_dim + kv_off;
            for (int d = 0; d < head_dim; ++d) oh[d] += p * vj[d];
          }
        }
      });
}

void gather_rows(DType type, const std::function<const void*(int64_t)>& row, int64_t n,
                 int64_t cols, float* out) {
  require(n >= 0 && cols > 0, "gather_rows", "bad shape");
  pool()->parallel_for(n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dequantize_row(type, row(i), out + i * cols, cols);
  });
}

void swiglu(const float* gate, const float* up, int64_t n, float* out) {
  pool()->parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
  });
}

void geglu(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoefA = 0.044715f;
  pool()->parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = gate[i];
      out[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * g * (1.0f + kCoefA * g * g))) * up[i];
    }
  });
}

void gated_ffn(FfnAct act, const float* gate, const float* up, int64_t n, float* out) {
  switch (act) {
    case FfnAct::silu:
      return swiglu(gate, up, n, out);
    case FfnAct::gelu_tanh:
      return geglu(gate, up, n, out);
  }
  throw Error(Errc::invalid_argument,
              "gated ffn: unknown activation " + std::to_string(static_cast<int>(act)));
}

void scale(float* x, float s, int64_t n) {
  pool()->parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] *= s;
  });
}

void add(float* x, const float* y, int64_t n) {
  pool()->parallel_for(n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
  });
}

}  // namespace duet::ops
