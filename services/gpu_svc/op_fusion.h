#pragma once
// Which consecutive ops of a program gpu_svc launches as one kernel (GpuKernels' fused launches,
// gpu_kernels_fused.cpp). A llama decode step is ~16-20 launches per layer; on PoCL each one
// wakes the worker threads and waits for the slowest, which costs more than the per-token ops'
// own work, and on NVIDIA's OpenCL each enqueue costs 16-19 us of host time, more than the
// step's kernels together (bench/gpu/RESULTS.md, "2026-11-28: discrete GPUs"). On the CPU
// integer path six groups per layer are fused:
//   add_norm_quantize: Add (the residual), RmsNorm of its output, the matmul reading the norm
//                      (its input quantisation rides along; the matmul itself still launches)
//   norm_quantize:     RmsNorm, the matmul reading it (the first layer's, after Embed)
//   swiglu_quantize:   SwiGlu (silu), the down matmul reading it
//   rope_pair:         Rope of Q, Rope of K (same parameters): one launch
//   sibling_matmuls:   2 or 3 consecutive MatMuls of the same input (Q, K, V; gate, up), each
//                      of a whole tensor: one launch for decode steps (GpuKernels::
//                      matmul_siblings; the same input quantisation, types Q4_0, Q8_0 or the K
//                      types, which may mix), the matmuls apart for more tokens
// The GPU kernels (GpuKernels::gpu_kernels(): GPUs, in copies mode too) fuse three of them, with
// kernels of their own:
//   add_norm_quantize: Add and RmsNorm as one launch (GpuKernels::add_rmsnorm); the matmul
//                      after runs apart
//   rope_pair:         as above (GpuKernels::rope_pair's rope_pair kernel)
//   sibling_matmuls:   2 or 3 GEMVs (up to 4 tokens) of the same kernel, or of K types which
//                      may mix (matmul_siblings_gpu.cl); where the group's GEMVs differ (a
//                      variant by shape, a layout, a type), its first two where they fuse,
//                      the rest apart
// and run norm_quantize's and swiglu_quantize's ops apart.
// Fused ops give the same bits as the ops apart (the tests check it), so whether a step fused
// never changes its tokens. A group never spans a cross-device wait or a published flag (the
// other device must see each op's output when its flag says so), nor a token sub-range, nor a
// matmul's row range (a tensor plan's split).
// DUET_GPU_FUSE=0 turns fusion off (fusion_from_env), and with it the step chains that GpuRunner
// builds on top of these groups for one-token steps (GpuKernels::begin_chain).
#include <cstdint>
#include <span>
#include <vector>

#include "core/program/program.h"
#include "services/gpu_svc/gpu_kernels.h"

namespace duet::gpu {

enum class Fusion : uint8_t {
  none,
  add_norm_quantize,
  norm_quantize,
  swiglu_quantize,
  rope_pair,
  sibling_matmuls
};

struct FusedGroup {
  Fusion kind = Fusion::none;
  // The ops the one launch replaces, from this one (1: the op alone). For the *_quantize kinds
  // the op right after them is the matmul whose input quantisation rides along: it is still
  // launched on its own (or with its siblings), then skipping its quantisation.
  uint32_t ops = 1;
};

// Whose fused launches a plan is for: the CPU integer path's, or the GPU kernels' (sibling
// groups of any weight types: GpuKernels::siblings_fuse decides at run time which launch as one).
enum class FusionTarget : uint8_t { cpu_integer, gpu_kernels };

// Per op of `prog`: the group starting there (Fusion::none where none starts). Whether that
// matmul takes the integer path (so that the *_quantize kinds apply) is the runner's check at
// run time (GpuKernels::quantizes_input), with the ops apart as the fallback.
std::vector<FusedGroup> plan_fusion(const fb::ProgramT& prog,
                                    FusionTarget target = FusionTarget::cpu_integer);

// What launch_fused enqueued: its event and the ops it did (0 and null: none, run them apart).
struct FusedLaunch {
  cl_event event = nullptr;
  uint32_t ops = 0;
};

// Enqueues group g at prog.ops[i] through `kernels`: the launch, which may do fewer ops than g
// (a sibling group's prefix on the GPU kernels), or none when the ops must run apart after all.
// `matmuls`: the args of the matmul after a *_quantize group (null when it is not on the integer
// path), of the group's matmuls for sibling_matmuls (null when GpuKernels::siblings_fuse says no:
// more than one token, no tiled copy, ...). arena/weights/tok_off as the runner passes them to the
// kernels, `at` the step's arena offsets; `all`: the step's tokens.
FusedLaunch launch_fused(GpuKernels& kernels, const fb::ProgramT& prog, size_t i, FusedGroup g,
                         cl_mem arena, const ArenaOffsets& at, cl_mem weights, uint64_t tok_off,
                         TokenRange all, std::span<const MatmulArgs> matmuls);

// DUET_GPU_FUSE: unset or "1" on, "0" off; anything else throws invalid_argument.
bool fusion_from_env();

}  // namespace duet::gpu
