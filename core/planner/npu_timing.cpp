#include "core/planner/npu_timing.h"

#include <algorithm>

#include "core/base/error.h"

namespace duet {
namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

double bytes_per_element(DType t) {
  return static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_elems(t));
}

void check_shape(const SocProfile& soc, const OpShape& s) {
  if (s.kind != OpKind::MatMul && s.kind != OpKind::Logits)
    throw Error(Errc::unsupported, "the NPU runs MatMul and Logits only, not " + op_shape_name(s));
  if (s.m <= 0 || s.k <= 0 || s.n <= 0)
    throw Error(Errc::invalid_argument, "NPU op shape needs positive m, k, n: " + op_shape_name(s));
  if (soc.npu.cores <= 0 || soc.npu.array_rows <= 0 || soc.npu.array_cols <= 0)
    throw Error(Errc::invalid_argument, "SoC profile '" + soc.name + "' has no NPU arrays");
}

// MB of a graph's fp16 activation operands: the input [n][k] and the output [n][m].
double activation_mb(const OpShape& s) {
  return static_cast<double>(s.n * s.k + s.n * s.m) * 2.0 / 1e6;
}

// The processor form ([npu] cpu_gflops > 0): weights read, then the products, no overlap.
NpuTiming cpu_npu_timing(const SocProfile& soc, const OpShape& s) {
  const auto& npu = soc.npu;
  NpuTiming t;
  const double weights = static_cast<double>(s.m * s.k) * bytes_per_element(s.wtype);
  t.dma_bytes = weights + static_cast<double>(s.n * (s.k + s.m)) * 2.0;
  t.dma_us = weights / (npu.cpu_weight_gbps * 1e3);
  if (npu.cpu_dequant_gbps > 0 && static_cast<double>(s.n) >= npu.cpu_dequant_min_tokens)
    t.dma_us += weights / (npu.cpu_dequant_gbps * 1e3);
  t.compute_us = 2.0 * static_cast<double>(s.m * s.k * s.n) / (npu.cpu_gflops * 1e3);
  t.launch_us = npu.cpu_call_us;
  t.total_us = t.launch_us + t.dma_us + t.compute_us;
  return t;
}

}  // namespace

NpuTiming npu_timing(const SocProfile& soc, const OpShape& s) {
  check_shape(soc, s);
  if (soc.npu.cpu_gflops > 0) return cpu_npu_timing(soc, s);
  const auto& npu = soc.npu;
  constexpr double kActBytes = 2;  // fp16 activations, and weights once dequantised in SRAM

  // Streamed operand [rows][kd] and stationary operand [kd][cols] in the chosen order.
  const bool weight_streams = s.weight_stationary_transposed;
  const int64_t rows = weight_streams ? s.m : s.n;
  const int64_t cols = weight_streams ? s.n : s.m;
  const int64_t kd = s.k;
  const double streamed_bytes_per_elem = weight_streams ? bytes_per_element(s.wtype) : kActBytes;
  const double stationary_bytes_per_elem = weight_streams ? kActBytes : bytes_per_element(s.wtype);

  NpuTiming t;
  t.tiles_k = ceil_div(kd, npu.array_rows);
  t.tiles_c = ceil_div(cols, npu.array_cols);
  t.passes = ceil_div(t.tiles_c, npu.cores);
  const int64_t kd_padded = t.tiles_k * npu.array_rows;
  const int64_t cols_padded = t.tiles_c * npu.array_cols;
  const int64_t rows_padded = ceil_div(rows, npu.array_rows) * npu.array_rows;

  // Half the SRAM buffers a chunk of streamed rows (fp16, whole reduction), the other half holds
  // the stationary operand if it fits.
  const double half_sram = npu.sram_bytes / 2;
  const int64_t fit_rows =
      static_cast<int64_t>(half_sram / (static_cast<double>(kd_padded) * kActBytes));
  t.chunk_rows = std::max<int64_t>(npu.array_rows, fit_rows / npu.array_rows * npu.array_rows);
  t.chunk_rows = std::min(t.chunk_rows, rows_padded);
  t.chunks = ceil_div(rows, t.chunk_rows);
  t.stationary_in_sram = static_cast<double>(kd_padded * cols_padded) * kActBytes <= half_sram;
  t.stationary_loads = t.chunks * t.tiles_k * t.passes;

  const double load_cycles =
      npu.stationary_load_cycles + (t.stationary_in_sram ? 0.0 : npu.stationary_fetch_cycles);
  // With fewer stationary column tiles than cores (decode: one column), the spare cores load
  // the same tiles (at the same time) and take different streamed rows.
  t.row_groups = std::max<int64_t>(1, npu.cores / t.tiles_c);
  const double cycles = static_cast<double>(t.stationary_loads) * (load_cycles + npu.fill_cycles) +
                        static_cast<double>(t.tiles_k * t.passes * ceil_div(rows, t.row_groups));
  t.compute_us = cycles / (npu.clock_ghz * 1e3);

  const double stationary_bytes =
      static_cast<double>(kd_padded * cols_padded) * stationary_bytes_per_elem;
  t.dma_bytes = static_cast<double>(rows * kd) * streamed_bytes_per_elem +
                stationary_bytes * (t.stationary_in_sram ? 1.0 : static_cast<double>(t.chunks)) +
                static_cast<double>(rows_padded * cols_padded) * kActBytes;
  t.dma_us = t.dma_bytes / (npu.dma_gbps * 1e3);
  t.launch_us = npu.launch_us;
  t.total_us = t.launch_us + std::max(t.compute_us, t.dma_us);
  return t;
}

double npu_modeled_us(const SocProfile& soc, const OpShape& shape) {
  return npu_timing(soc, shape).total_us;
}

double npu_pipelined_us(const SocProfile& soc, const OpShape& shape) {
  const NpuTiming t = npu_timing(soc, shape);
  // A processor-form NPU pays each call in a step too: every op is its own GEMM call (its
  // worker threads woken, joined), whatever started it.
  if (soc.npu.cpu_gflops > 0) return t.total_us;
  // A decode graph (the activation, <= one column tile, is the stationary operand and the
  // weights stream): its per-chunk reloads of the activation tiles are what an isolated
  // execution pays; in the running step it streams its weights at the DMA rate (npu_timing.h).
  // No launch: the step's ops run as one program.
  if (t.tiles_c == 1 && shape.weight_stationary_transposed) {
    const double stream_cycles =
        static_cast<double>(t.tiles_k * t.passes * ceil_div(shape.m, t.row_groups));
    return std::max(t.dma_us, stream_cycles / (soc.npu.clock_ghz * 1e3));
  }
  return std::max(t.compute_us, t.dma_us);
}

double npu_activation_io_us(const SocProfile& soc, const OpShape& s) {
  return soc.npu.activation_io_us_per_mb * activation_mb(s);
}

double npu_graph_compile_us(const SocProfile& soc, const OpShape& s) {
  check_shape(soc, s);
  return soc.npu.compile_base_us + soc.npu.compile_us_per_mb * activation_mb(s);
}

}  // namespace duet
