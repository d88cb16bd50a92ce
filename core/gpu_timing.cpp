#include "core/gpu_timing.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace duet {
namespace {

constexpr double kActivationBytes = 2.0;  // fp16 activations on the phone (A16)

double weight_bytes_per_element(DType t) {
  return static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_elems(t));
}

void require_positive(double v, const SocProfile& soc, const char* key) {
  if (!(v > 0))
    throw Error(Errc::bad_format, "SoC profile " + soc.name + ": [gpu] " + key +
                                      " must be positive for the GPU model");
}

}  // namespace

double gpu_sync_us(const SocProfile& soc) {
  return soc.gpu.sync_us;
}

double gpu_modeled_us(const SocProfile& soc, const OpShape& s) {
  const auto& g = soc.gpu;
  require_positive(g.bandwidth_gbps, soc, "bandwidth_gbps");
  require_positive(g.achievable_gflops, soc, "achievable_gflops");
  if (s.m < 0 || s.k < 0 || s.n < 0)
    throw Error(Errc::invalid_argument,
                "gpu_modeled_us: negative dimension in " + op_shape_name(s));
  const double bytes_per_us = g.bandwidth_gbps * 1e3;
  const double flops_per_us = g.achievable_gflops * 1e3;
  const double m = static_cast<double>(s.m), k = static_cast<double>(s.k),
               n = static_cast<double>(s.n);
  if (s.n == 0) return 0.0;

  switch (s.kind) {
    case OpKind::MatMul:
    case OpKind::Logits: {
      const double half_rows = g.param("gemv_half_rows");
      const double half_tokens = g.param("gemm_half_tokens");
      const double gemv_flops_per_us = g.param("gemv_gflops") * 1e3;
      const double weights = m * k * weight_bytes_per_element(s.wtype);
      const double activations = n * (k + m) * kActivationBytes;
      // GEMV (decode, a few tokens): the weights stream once for all n tokens. The bandwidth it
      // draws ramps with the output rows in flight (Memory-1: one processor cannot saturate
      // DRAM; fewer rows, fewer outstanding loads), bandwidth * m / (m + gemv_half_rows); its
      // dot products run at gemv_gflops, below the tiled GEMM's rate.
      const double stream_bytes_per_us = bytes_per_us * m / (m + half_rows);
      const double gemv = std::max(weights / stream_bytes_per_us + activations / bytes_per_us,
                                   2.0 * m * k * n / gemv_flops_per_us);
      // GEMM: throughput ramps with n (GPU-1), never faster than reading its operands once.
      const double gemm = std::max(2.0 * m * k * (n + half_tokens) / flops_per_us,
                                   (weights + activations) / bytes_per_us);
      return g.launch_us + g.param("matmul_fixed_us") + std::min(gemv, gemm);
    }
    case OpKind::Attention: {
      const double flops = 4.0 * n * k * m;  // scores and the weighted sum of V
      const double bytes = 2.0 * k * m * kActivationBytes + 2.0 * n * m * kActivationBytes;
      return g.launch_us + std::max(flops / flops_per_us, bytes / bytes_per_us);
    }
    case OpKind::Embed: {
      const double row = std::max(m, k);
      return g.launch_us +
             n * row * (weight_bytes_per_element(s.wtype) + kActivationBytes) / bytes_per_us;
    }
    case OpKind::RmsNorm:
    case OpKind::Rope:
    case OpKind::SwiGlu:
    case OpKind::Add:
    case OpKind::AddBias:
    case OpKind::KvWrite: {
      // Arrays touched per element: read + write, plus a second input for the binary ops.
      const double arrays = (s.kind == OpKind::SwiGlu || s.kind == OpKind::Add) ? 3.0
                            : s.kind == OpKind::KvWrite                         ? 4.0
                                                                                : 2.0;
      return g.launch_us + arrays * n * std::max(m, k) * kActivationBytes / bytes_per_us;
    }
  }
  throw Error(Errc::invalid_argument, "gpu_modeled_us: unknown op kind in " + op_shape_name(s));
}

}  // namespace duet
