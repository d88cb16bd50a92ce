#pragma once
// The NPU timing model: how long a matmul would take on the profile's NPU, a set of
// weight-stationary systolic arrays (HeteroInfer section 2.3). Mechanistic, no per-shape tables:
//
//   The NPU computes T S where S, the stationary operand [kd][sc], is cut into array-sized
//   tiles (tiles_k x tiles_c, padded: NPU-1 stage performance) that are loaded into the arrays
//   and held while the rows of T, the streamed operand [r][kd], flow through them. The cores
//   hold different stationary column tiles and share the streamed rows, so the column tiles
//   take ceil(tiles_c / cores) passes; with fewer column tiles than cores (decode), the spare
//   cores hold the same tiles and split the streamed rows (cores / tiles_c groups). T is brought
//   into SRAM in chunks of rows (as many as half the SRAM holds in fp16); every chunk needs every
//   stationary tile again: a (re)load per (chunk, k tile, pass), dearer when S does not fit the
//   other half of SRAM (fetched from DRAM). Array time = loads x (load + fill) + streamed rows; DMA
//   (streamed operand once, stationary once or once per chunk, output) overlaps it; a fixed launch
//   cost is added.
//
//   Order (NPU-2): with weight_stationary_transposed the activation is S and the weight streams
//   (HeteroInfer's W x^T); otherwise the large weight is S and is reloaded for every few tokens.
//   Shape (NPU-3): a wide weight (k large) makes S tall, chunks short and reloads many.
//
// A host profile may describe a different machine: [npu] cpu_gflops > 0 (soc_profile.h) makes the
// NPU a processor that reads a graph's weights and then computes its products, one after the
// other, with a fixed cost per call: cpu_call_us + weight bytes / cpu_weight_gbps + 2 m k n /
// cpu_gflops, isolated or in a step alike; from cpu_dequant_min_tokens tokens on, + weight bytes /
// cpu_dequant_gbps (the emulator's prefill path dequantises tiles of rows into a buffer first,
// where decode dots the stored rows: fitted on tiny-fortune, 0.13-0.21 rms log error without it
// with the 16-token ops under and the 64-token ones over by up to 1.33x). That is this host's
// "NPU", npu_svc's CPU GEMM (services/npu_svc/npu_gemm.cpp: a thread pool woken per call; decode
// dots over the stored rows, prefill dequantises a tile of rows and multiplies it with every
// token), which the systolic model fits at 0.3-0.6 rms log error whatever its arrays
// (bench/modeled/RESULTS.md).
//
// Activation I/O in a step (issue 23, npu_activation_io_us, charged by core/planner/timeline.h):
// inside a running step every NPU graph's fp16 input [n][k] was just written by the GPU and its
// output [n][m] is read by the GPU next, through shared buffers: per graph execution the data
// must be made coherent for the other device's view and brought between the flat shared layout
// and the NPU's tiled one (GPU-2: the states of CPU, GPU and NPU views kept consistent); the
// weights are referenced, not moved. An isolated measurement (Table 3, the profiler, the solver's
// latencies) reuses buffers no other device touched, so it is not in npu_modeled_us. It is a cost
// per activation byte: nothing in decode (a token is a few KB), growing with the prompt.
// activation_io_us_per_mb = 128 on sd8gen3: the order of the one per-token residual in Table 3
// (from [4096,4096] x128 to x256 the paper's NPU grows by 972 us, the arrays' by 702: 270 us for
// 2.1 MB more activations), not a fit to a figure it is checked against. What it explains: its
// cost per FLOP goes as 1/m + 1/k, so InternLM-1.8B's 2048-wide graphs pay twice Llama-8B's per
// FLOP, offsetting their shorter reductions (NPU-3: fewer reloads); the paper's prefill figures
// put the two models at about the same efficiency (1092 / 247.9 = 4.4x the tokens/s for 4.6x
// fewer FLOPs), which the arrays alone put at 1.3x (bench/modeled/RESULTS.md).
#include <cstdint>

#include "core/planner/op_shape.h"
#include "core/planner/soc_profile.h"

namespace duet {

struct NpuTiming {
  double total_us = 0;    // launch + max(compute, dma)
  double compute_us = 0;  // array time: stationary loads, fills, streamed rows
  double dma_us = 0;      // DRAM traffic at the NPU's DMA bandwidth
  double launch_us = 0;
  int64_t tiles_k = 0, tiles_c = 0;    // stationary operand tiles (reduction x columns)
  int64_t passes = 0;                  // ceil(tiles_c / cores)
  int64_t row_groups = 1;              // cores / tiles_c when spare cores split the rows
  int64_t chunk_rows = 0, chunks = 0;  // streamed operand rows per SRAM chunk, and their count
  int64_t stationary_loads = 0;        // chunks x tiles_k x passes
  bool stationary_in_sram = false;
  double dma_bytes = 0;
};

// Throws Errc::invalid_argument for non-positive dims, Errc::unsupported for ops the NPU does
// not run (only MatMul and Logits are NPU ops).
NpuTiming npu_timing(const SocProfile& soc, const OpShape& shape);
// An isolated, synchronised graph execution (the profiler's view, Table 3's NPU column).
double npu_modeled_us(const SocProfile& soc, const OpShape& shape);
// The same graph inside a pipelined step (core/planner/timeline.h, fast sync). Two costs of an
// isolated execution (one request, one graph, its reply: the profiler's view) are not paid there
// (and one is added by the timeline: the activation I/O above):
//   launch_us (fitted to Table 3's decode rows): the per-request round trip. A step's NPU ops run
//     as one program (npu_svc's RunStep: the op list executes inside the NPU side, each op
//     started by a flag in shared memory, HeteroInfer 4.3), one request per step, not per graph;
//   a decode graph's per-chunk reloads of its stationary activation tiles (<= 32 tokens, one
//     column tile, the weights streaming): Table 3's NPU decode rows (693 us for 9.4 MB of
//     [4096,4096] weights, 3886 us for 66 MB: 14-17 GB/s) are array-bound on them, while the
//     paper measures the NPU at 40-45 GB/s on decoding workloads (Figure 5, Memory-1); so in a
//     running decode the graph streams its weights at the DMA rate: max(DMA, streamed rows).
// The second is the least-supported step of the decode reconciliation: the paper gives the two
// rates, not the NPU's mechanism between them (bench/modeled/RESULTS.md says what it costs).
double npu_pipelined_us(const SocProfile& soc, const OpShape& shape);

// Bringing one execution's activation operands (input [n][k], output [n][m], fp16) between the
// devices inside a step (above): the timeline's, not npu_modeled_us's.
double npu_activation_io_us(const SocProfile& soc, const OpShape& shape);

// Online preparation of a static graph for `shape`: a fixed cost plus a cost per MB of the
// graph's activation operands (input [n][k] and output [n][m], fp16); the weights are
// referenced, not rewritten, so they do not count (fitted to HeteroInfer's 408 ms at 135
// tokens and 2050 ms at 1000 for the ~4 graphs of a Llama-8B layer).
double npu_graph_compile_us(const SocProfile& soc, const OpShape& shape);

}  // namespace duet
