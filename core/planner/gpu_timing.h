#pragma once
// Modelled time of one op on a SoC profile's GPU (deploy/soc/<name>.toml, [gpu]): what the op
// would cost on, say, a Snapdragon 8 Gen 3's Adreno, whatever device actually runs it here.
//
// The model is a roofline with HeteroInfer's GPU and memory characteristics:
//   GPU-1 "linear performance": the GEMM kernel's throughput grows with the token count and then
//     flattens, peak * n / (n + gemm_half_tokens), so its time is linear in n with an intercept:
//     t = 2 m k (n + gemm_half_tokens) / achievable_gflops.
//   Memory-1 "one processor cannot saturate DRAM": the GEMV kernel (decode, a few tokens) streams
//     the weights once, but the bandwidth it draws ramps with the output rows it keeps in flight,
//     bandwidth * m / (m + gemv_half_rows), up to one processor's ceiling (bandwidth_gbps, the
//     paper's 40-45 GB/s). So T(m rows) = k * bytes * (m + gemv_half_rows) / bandwidth: half the
//     rows take clearly less than all of them, yet draw less bandwidth; the other half on the NPU
//     streams over its own DMA at the same time, which is why a decode weight split pays
//     (aggregate bandwidth up, capped by memory.dual_gbps: the solver's shared-bandwidth floor).
//     The GEMV's dot products run at gemv_gflops, so past a few tokens the GEMM is faster.
//   GPU-2 expensive sync: a blocking clFinish costs sync_us (gpu_sync_us), charged by whoever
//     composes a timeline, not by each op.
// Every op pays launch_us, a matmul also matmul_fixed_us. Element-wise ops move fp16 activations
// at the bandwidth.
//
// Parameters ([gpu] and [gpu.params]): bandwidth_gbps, achievable_gflops, launch_us, sync_us,
// params.gemv_half_rows, params.gemv_gflops, params.gemm_half_tokens, params.matmul_fixed_us.
// Optional [gpu.params], none of them in the SoC files (whose numbers they therefore leave as
// they were), fitted for a host profile from the ops inside real steps (core/planner/
// trace_profile.h): op_fixed_us (every kernel that is not a matmul pays it beyond launch_us: on
// PoCL a launch wakes the worker threads, ~1 us to tens of us, where a phone's is ~10 us),
// elementwise_gbps (the rate the element-wise kernels and the embedding go through activations
// at; default bandwidth_gbps) and attention_gflops (attention's arithmetic rate; default
// achievable_gflops; its K/V reads stay at bandwidth_gbps). op_gap_us, the idle
// time between two kernels of a step, is the timeline's (core/planner/timeline.h).
// For sd8gen3, sync_us (~400 us) and launch_us are the paper's device facts; achievable_gflops
// (1200, the paper's "~1 TFLOPS in practice") and gemm_half_tokens were fitted to the prefill
// rows of the paper's Table 3 (W4A16 weights, read as Q4_0); bandwidth_gbps (40.7),
// gemv_half_rows (2656) and matmul_fixed_us (119) solve its three decode rows exactly
// ([4096,4096], [28672,4096], [4096,14336] x1: 511, 1903, 1467 us); gemv_gflops (400) puts the
// GEMV/GEMM crossover at ~65 tokens, so 16 ragged tokens cost ~1.5 ms (the x257-272 rows).
// tests/gpu/gpu_timing_test.cpp checks the GPU column within 25%.
//
// Shapes (core/planner/op_shape.h): matmul/logits m x k weight, n tokens. Element-wise ops: n
// tokens of max(m, k) features. Attention: n query tokens, k context positions, m = n_heads *
// head_dim.
#include "core/planner/op_shape.h"
#include "core/planner/soc_profile.h"

namespace duet {

// What an isolated, synchronised measurement of the op costs (enqueue, run, clFinish): the
// profiler's view, HeteroInfer's Table 3. The solver's latencies.
double gpu_modeled_us(const SocProfile& soc, const OpShape& shape);

// What the op costs inside a pipelined stream of kernels (enqueued ahead on the in-order queue,
// no host synchronisation between them: a decode or prefill step with fast sync). Two terms of
// the isolated measurement are not paid there (the reasoning, with the paper's numbers, is in
// gpu_timing.cpp above gpu_pipelined_us):
//   matmul_fixed_us: the measured window's dispatch and completion round trip through the host;
//   the GEMV's row ramp: an isolated GEMV fills and drains the GPU's gemv_half_rows rows in
//     flight once per kernel; back-to-back kernels overlap one's drain with the next's fill, so
//     the weights stream at one processor's steady decode bandwidth, memory.single_gbps (the
//     paper measures 43.3 GB/s for the GPU alone in decode, section 5.4).
// Everything else (launch, the GEMM's rate, element-wise ops, attention) is as gpu_modeled_us.
double gpu_pipelined_us(const SocProfile& soc, const OpShape& shape);
// The cost of one blocking host-device synchronisation (clFinish) on this GPU.
double gpu_sync_us(const SocProfile& soc);

}  // namespace duet
