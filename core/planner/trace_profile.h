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
// Samples of one (device, kind, type, m, k, n) are reduced to their median. The profile's
// timing is "steps": core/planner/soc_profile_fit.h fits the pipelined op models to it.
// handoff_us is the median over steps of the frontend's step time minus the longest device span
// (doorbells, reports, logits copy: what host_check adds per step). contention is 1: on a host
// whose "GPU" (PoCL) and "NPU" (the emulator) are processes sharing the same CPU cores, each
// would use all of them alone and gets about half while the other runs (the old per-op
// measurement of it ranged 0.03-1.0 between runs on this 2-core VM, with other load).
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/planner/profiler.h"

namespace duet {

struct TraceProfileReport {
  Profile profile;
  size_t op_spans = 0;     // matmul spans taken
  size_t skipped_ops = 0;  // matmul spans of split plans (shape unknown from the name)
  size_t steps = 0;        // steps seen
  // One cross-device hand-off here (the timeline's fast sync): over the steps where both devices
  // ran one after the other (gpu-only, npu-only, layer), the longer device span minus every op's
  // time, per op that waited on the other device's flags; the median. 0: no step had such a wait.
  double handoff_sync_us = 0;
};

// Throws bad_format when a trace is not duet trace-event JSON, invalid_argument when no span
// names a matmul of an unsplit plan.
TraceProfileReport profile_from_traces(const std::vector<nlohmann::json>& traces,
                                       const LlamaModel& model, const std::string& model_key);

}  // namespace duet
