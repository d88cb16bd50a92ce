#include "core/planner/gpu_timing.h"

#include <algorithm>
#include <string>

#include "core/base/error.h"

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

double gpu_us(const SocProfile& soc, const OpShape& s, bool pipelined) {
  const auto& g = soc.gpu;
  require_positive(g.bandwidth_gbps, soc, "bandwidth_gbps");
  require_positive(g.achievable_gflops, soc, "achievable_gflops");
  if (s.m < 0 || s.k < 0 || s.n < 0)
    throw Error(Errc::invalid_argument, "gpu timing: negative dimension in " + op_shape_name(s));
  const double bytes_per_us = g.bandwidth_gbps * 1e3;
  const double flops_per_us = g.achievable_gflops * 1e3;
  const double m = static_cast<double>(s.m), k = static_cast<double>(s.k),
               n = static_cast<double>(s.n);
  if (s.n == 0) return 0.0;
  // The kernels that are not matmuls (a host profile's optional parameters; absent on the SoC
  // files, where they are the launch and the roofline's rates): a fixed cost beyond the launch,
  // the rate the element-wise kernels go through activations at, and attention's arithmetic
  // rate (its K/V reads stream at bandwidth_gbps, as weights do).
  const double op_fixed_us = g.launch_us + g.param_or("op_fixed_us", 0.0);
  const double activation_bytes_per_us =
      g.param_or("elementwise_gbps", 0.0) > 0 ? g.param("elementwise_gbps") * 1e3 : bytes_per_us;
  const double attention_flops_per_us =
      g.param_or("attention_gflops", 0.0) > 0 ? g.param("attention_gflops") * 1e3 : flops_per_us;

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
      // Pipelined, the fill and drain overlap the neighbouring kernels': the weights stream at
      // one processor's steady bandwidth.
      const double stream_bytes_per_us =
          pipelined ? (soc.mem.single_gbps > 0 ? soc.mem.single_gbps * 1e3 : bytes_per_us)
                    : bytes_per_us * m / (m + half_rows);
      const double gemv = std::max(weights / stream_bytes_per_us + activations / bytes_per_us,
                                   2.0 * m * k * n / gemv_flops_per_us);
      // GEMM: throughput ramps with n (GPU-1), never faster than reading its operands once.
      const double gemm = std::max(2.0 * m * k * (n + half_tokens) / flops_per_us,
                                   (weights + activations) / bytes_per_us);
      return g.launch_us + (pipelined ? 0.0 : g.param("matmul_fixed_us")) + std::min(gemv, gemm);
    }
    case OpKind::Attention: {
      const double flops = 4.0 * n * k * m;  // scores and the weighted sum of V
      const double bytes = 2.0 * k * m * kActivationBytes + 2.0 * n * m * kActivationBytes;
      // The cached K and V stream like weights (bandwidth_gbps); the arithmetic at its own rate.
      return op_fixed_us + std::max(flops / attention_flops_per_us, bytes / bytes_per_us);
    }
    case OpKind::Embed: {
      const double row = std::max(m, k);
      return op_fixed_us + n * row * (weight_bytes_per_element(s.wtype) + kActivationBytes) /
                               activation_bytes_per_us;
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
      return op_fixed_us + arrays * n * std::max(m, k) * kActivationBytes / activation_bytes_per_us;
    }
  }
  throw Error(Errc::invalid_argument, "gpu timing: unknown op kind in " + op_shape_name(s));
}

}  // namespace

double gpu_modeled_us(const SocProfile& soc, const OpShape& s) {
  return gpu_us(soc, s, false);
}

// Why a pipelined decode is twice as fast as Table 3's kernels add up to (issue 23).
//
// Table 3's GPU decode rows are isolated, synchronised measurements (the profiler runs one op,
// then waits for it): [4096,4096] 511 us, [28672,4096] 1903 us, [4096,14336] 1467 us for 9.4,
// 66.1 and 33.0 MB of W4A16 weights, an effective 18.5, 34.7 and 22.5 GB/s. Summed over
// Llama-8B's 32 layers (q, k, v, o, gate+up, down) they are ~150 ms a token on the GPU alone,
// yet the paper's decode is 14.01 tok/s, 71 ms for ~4.2 GB of weights: 59 GB/s, which is the
// combined GPU+NPU bandwidth it measures during that decode (59.5 GB/s; the GPU alone 43.3 GB/s,
// section 5.4; Memory-1: one processor reaches 40-45 GB/s, two about 60).
//
// The isolated GEMV above is T = launch + fixed + W (m + h) / (m B), W the weight bytes, m its
// rows, h = gemv_half_rows; rewritten, T = launch + fixed + W / B + h k b / B (b the bytes per
// weight): a constant, the weights at the full rate, and the time to stream h rows of k weights.
// Both extra terms are per-kernel costs of measuring one kernel alone:
//   fixed (119 us): the measured window's round trip through the host: the enqueue reaching an
//     idle GPU and the completion reaching the waiting thread (GPU-2: a blocking clFinish costs
//     ~400 us and "blocks the execution of subsequent GPU kernels");
//   h k b / B (150 us at k = 4096, 526 us at k = 14336): the kernel starts with no rows in
//     flight and ends with the GPU emptying; its bandwidth ramps up and down over about h rows.
// In the decode with fast synchronisation the host never blocks on the GPU: the kernels are
// queued ahead and "the GPU's inherent queue ordering ensures correct synchronization for GPU
// kernels without incurring additional submission overhead" (section 4.3), so each kernel's
// work-groups start as the previous kernel's retire: no host round trip, and one kernel's drain
// overlaps the next one's fill. What remains is the weights at one processor's steady decode
// bandwidth (memory.single_gbps, the paper's 43 GB/s) and the launch. Checks against figures
// not used for any fit: the GPU-only decode this gives for Llama-8B, 9.35 tok/s (4.2 GB at
// 43 GB/s plus attention and norms), is the paper's GPU-only engines' (MNN-OpenCL 14.01 / 1.50
// = 9.3 tok/s, MLC 14.01 / 1.52 = 9.2); with the NPU streaming its share alongside
// (core/planner/npu_timing.h, npu_pipelined_us) and the two capped at memory.dual_gbps by the
// timeline's contention, the solver's tensor plan decodes at 11.6 tok/s, 0.83x the paper's
// 14.01 (bench/modeled/RESULTS.md). Without fast sync (a clFinish after each GPU op the NPU
// needs) the kernels pay the isolated cost again: core/planner/timeline.h's SyncMode::blocking.
double gpu_pipelined_us(const SocProfile& soc, const OpShape& s) {
  return gpu_us(soc, s, true);
}

double gpu_sync_us(const SocProfile& soc) {
  return soc.gpu.sync_us;
}

}  // namespace duet
