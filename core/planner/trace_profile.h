#pragma once
// A measured Profile built from real steps (issue 23, item 4): the op times gpu_svc and npu_svc
// report for each op of each step, as `duet trace` writes them (services/frontend/
// frontend_trace.cpp), instead of ops timed one request at a time (ProfileOp, profiler.h).
//
// Why: on this 2-core host an op timed alone costs 4.6-5x what the same op costs inside a step
// (bench/modeled/RESULTS.md, 2026-11-26): a request per op pays the service's wake-up, cold
// caches and the other stacks' load, where a step's ops run back to back in one RunStep. The
// timeline composes in-step costs, so its profile should hold them.
//
// Only matmuls of steps run under an unsplit plan (gpu-only, npu-only, layer) are taken: there
// an op computes its whole weight ([m][k] from the model file, per layer) for all the step's
// tokens (Logits: one row per sequence), so its shape is known from its name ("MatMul q L3").
// Samples of one (device, kind, type, m, k, n) are reduced to their typical value: the mean of
// those within 3x the median (TTFT and TPOT are means; a span past 3x its median is the host's
// other tenants, bench/modeled/host_stalls.py). So is every figure below. The profile's
// timing is "steps": core/planner/soc_profile_fit.h fits the pipelined op models to it.
// handoff_us is the typical value over steps of the frontend's step time minus the longest device
// span (doorbells, reports, logits copy: what host_check adds per step).
//
// A step's device span holds more than its ops' own times (bench/modeled/RESULTS.md, issue 23):
// what the traces give beside the op points, each typical over steps:
//   gpu_op_gap_us (+ gpu_op_gap_us_per_token x the step's tokens beyond the first): on the
//     GPU-only steps,
//     (device span - its ops) / its ops: PoCL's idle time between a kernel's end and the
//     dependent one's start, the first kernel's start after the doorbell and the last one's
//     report, per op of the program (fused ops count: the timeline charges every op of the
//     program, core/planner/timeline.h); the decode steps' figure, and the median rise per
//     token of the other token counts' (here ~1.4 us an op in decode, 5-10 in a
//     prefill of 16-64 tokens);
//   npu_op_gap_us (+ npu_op_gap_us_per_token x tokens): the same on the NPU side, its flag
//     waits taken out too (the emulator's loop between two ops; on these 2 cores mostly the
//     publish of a flag, whose woken consumer takes the core);
//   handoff_sync_us: what is left of an unsplit step's span per flag wait once every op and
//     every gap is taken out (the cross-device hand-off: a futex wake and a reschedule here);
//   between_steps_us: the frontend's time from one step's end to the next one's start;
//   frontend_us: the frontend's time around the devices' spans (handoff_us above) per kind of
//     step (frontend_class: one device or both, prefill or decode): scheduling and the logits
//     copy grow with the tokens, two devices mean two reports to wait for and read;
//   gpu_steps: per GPU-only step the time of its ops that are not matmuls (norms, rope, KV
//     writes, attention, SwiGLU, adds, embed), which fit_step_costs fits the GPU's models for
//     them to ([gpu.params] op_fixed_us, elementwise_gbps, attention_gflops: gpu_timing.h).
// contention is 1: on a host
// whose "GPU" (PoCL) and "NPU" (the emulator) are processes sharing the same CPU cores, each
// would use all of them alone and gets about half while the other runs (the old per-op
// measurement of it ranged 0.03-1.0 between runs on this 2-core VM, with other load).
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/planner/profiler.h"
#include "core/planner/soc_profile.h"
#include "core/planner/timeline.h"

namespace duet {

// The GPU's work outside the matmuls in one GPU-only step.
struct StepWork {
  int64_t tokens = 0, context = 0;
  double other_us = 0;  // the measured time of its ops that are not MatMul or Logits
};

struct TraceProfileReport {
  Profile profile;
  size_t op_spans = 0;     // matmul spans taken
  size_t skipped_ops = 0;  // matmul spans of split plans (shape unknown from the name)
  size_t steps = 0;        // steps seen
  // One cross-device hand-off here (the timeline's fast sync): over the steps where both devices
  // ran one after the other (gpu-only, npu-only, layer), the longer device span minus every op's
  // time, per op that waited on the other device's flags; the median. 0: no step had such a wait.
  double handoff_sync_us = 0;
  double gpu_op_gap_us = 0, npu_op_gap_us = 0;  // 0: no step to measure it on
  double gpu_op_gap_us_per_token = 0, npu_op_gap_us_per_token = 0;
  double between_steps_us = 0;
  std::map<std::string, double> frontend_us;  // by frontend_class
  std::vector<StepWork> gpu_steps;
};

struct StepCostFit {
  size_t points = 0;  // distinct (tokens, context) of GPU-only steps
  double rms_log = 0, worst = 1;
};

// Throws bad_format when a trace is not duet trace-event JSON, invalid_argument when no span
// names a matmul of an unsplit plan.
TraceProfileReport profile_from_traces(const std::vector<nlohmann::json>& traces,
                                       const LlamaModel& model, const std::string& model_key);

// "gpu decode", "gpu prefill", "gpu+npu decode", "gpu+npu prefill": a step's kind for
// TraceProfileReport::frontend_us (prefill: more tokens than sequences).
std::string frontend_class(bool npu, bool prefill);

// What the timeline charges the GPU's ops that are not matmuls in one step of `schedule` (their
// compute, before any gap or contention): what fit_step_costs fits to StepWork::other_us.
double gpu_other_ops_us(const Schedule& schedule, const SocProfile& soc, int64_t tokens,
                        int64_t context);

// Puts what the traces measured beside the op points into `soc` (a profile fitted to r.profile:
// core/planner/soc_profile_fit.h): the op gaps ([gpu.params] op_gap_us, op_gap_us_per_token,
// [npu] op_gap_us, op_gap_us_per_token), and
// the GPU's non-matmul kernels fitted to r.gpu_steps, the time the timeline charges them in the
// model's GPU-only program (op_fixed_us, elementwise_gbps, attention_gflops; by coordinate
// descent on the log error of each step's sum). No GPU-only step: those are left out.
StepCostFit fit_step_costs(const TraceProfileReport& r, const LlamaModel& model, SocProfile& soc);

}  // namespace duet
