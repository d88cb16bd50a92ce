#pragma once
// Modelled time of one op on a SoC profile's GPU (deploy/soc/<name>.toml, [gpu]): what the op
// would cost on, say, a Snapdragon 8 Gen 3's Adreno, whatever device actually runs it here.
//
// The model is a roofline with HeteroInfer's two GPU characteristics:
//   GPU-1 "linear performance": the GEMM kernel's throughput grows with the token count and then
//     flattens, peak * n / (n + gemm_half_tokens), so its time is linear in n with an intercept:
//     t = 2 m k (n + gemm_half_tokens) / achievable_gflops. The GEMV kernel (decode) streams the
//     weights once per token at the memory bandwidth, derated while fewer than
//     full_occupancy_rows output rows leave compute units idle. Each op takes the faster kernel.
//   GPU-2 expensive sync: a blocking clFinish costs sync_us (gpu_sync_us), charged by whoever
//     composes a timeline, not by each op.
// Every op pays launch_us, a matmul also matmul_fixed_us. Element-wise ops move fp16 activations
// at the bandwidth.
//
// Parameters ([gpu] and [gpu.params]): bandwidth_gbps, achievable_gflops, launch_us, sync_us,
// params.full_occupancy_rows, params.gemm_half_tokens, params.matmul_fixed_us. For sd8gen3,
// sync_us (~400 us) and launch_us are the paper's device facts; achievable_gflops (1200, the
// paper's "~1 TFLOPS in practice"), bandwidth_gbps (37, its "40-45 GB/s") and the three params
// were fitted to the GPU column of the paper's Table 3 (W4A16 weights, read as Q4_0), which the
// model then reproduces within 8% (tests/gpu/gpu_timing_test.cpp).
//
// Shapes (core/op_shape.h): matmul/logits m x k weight, n tokens. Element-wise ops: n tokens of
// max(m, k) features. Attention: n query tokens, k context positions, m = n_heads * head_dim.
#include "core/op_shape.h"
#include "core/soc_profile.h"

namespace duet {

double gpu_modeled_us(const SocProfile& soc, const OpShape& shape);
// The cost of one blocking host-device synchronisation (clFinish) on this GPU.
double gpu_sync_us(const SocProfile& soc);

}  // namespace duet
