#pragma once
// The tensor-partition solver (HeteroInfer section 4.4). For every partitionable matmul of a model
// (Q/K/V/O, FFN gate+up fused, down, logits), a phase and a token count, it evaluates every
// placement the plan contract (core/program/plan.h) can express and keeps the one with the least
//
//   min( max(T_gpu(p1), T_npu(p2)) + T_sync + T_copy,  T_gpu(all),  T_npu(all) + T_sync + T_copy )
//
//   weight_split      p1 = the first gpu_rows output rows, p2 = the rest, all tokens
//   activation_split  p2 = npu_tokens tokens in standard-size NPU graphs, p1 = the ragged rest
//   hybrid            an activation split whose NPU chunk is itself weight-split (the GPU runs its
//                     rows of the chunk, then every row of the rest); or a weight split whose NPU
//                     part runs as several standard graphs or a padded one (npu_tokens >= n)
//   padding           the whole op on the NPU, padded up to standard graphs
// GPU:NPU ratios come from a grid of small integer ratios a:b (1 <= a, b <= max_ratio_term), the
// rows rounded to the NPU tile. T_sync is the fast synchronisation (sleep for the predicted time,
// then poll a flag: HeteroInfer 4.3); T_copy is the zero-fill of padded activation rows (shared
// buffers mean nothing else moves). The NPU's graph mode is one per plan: the solver solves the
// layer under padding and under pipe and keeps the cheaper.
//
// Plans come out as JSON (plan_to_json) for the plan cache, solver_svc's PlanReply and `duet plan`;
// plan_from_json turns one back into a Plan.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/planner/latency_model.h"
#include "core/planner/profiler.h"
#include "core/planner/soc_profile.h"
#include "core/program/plan.h"

namespace duet {

// Bump on any change to what the solver decides: cached plans of an older version are re-solved.
inline constexpr uint32_t kSolverVersion = 2;

enum class Phase : uint8_t { prefill = 0, decode = 1 };
std::string_view phase_name(Phase p);
Phase phase_from_name(std::string_view name);  // throws invalid_argument

struct SolverOptions {
  // Token counts the NPU has static graphs for (1 is the decode graph).
  std::vector<int64_t> npu_graph_tokens = {1, 32, 64, 128, 256, 512, 1024};
  int max_ratio_term = 4;  // GPU:NPU ratios a:b with 1 <= a, b <= this
  int64_t row_align = 32;  // split rows in NPU tile multiples
  double sync_us = 30;     // one fast GPU<->NPU synchronisation
  double copy_gbps = 43;   // activation copies at one processor's bandwidth
  // Both devices streaming at once share the SoC's memory (HeteroInfer Memory-1: ~60 GB/s
  // together): a split is never faster than the bytes both parts stream over this. 0: no floor.
  double shared_gbps = 0;
  // Where the two devices slow each other when they run at once (measured here: they share the
  // CPU cores), a split costs max(gpu, npu) + contention * min(gpu, npu). 0: none (modelled).
  double contention = 0;
  const SocProfile* soc = nullptr;  // online-prepare's graph compile cost (none without it)
  // The NPU graph modes solve_plan tries (it keeps the cheaper plan).
  std::vector<NpuGraphMode> modes = {NpuGraphMode::padding, NpuGraphMode::pipe};
};
// sync_us from [gpu.params] fast_sync_us when the profile has it; copy_gbps = memory.single_gbps;
// shared_gbps = memory.dual_gbps.
SolverOptions solver_options_for(const SocProfile& soc);

// The NPU graphs that run `tokens` tokens under a graph mode (padding: one graph, the smallest
// standard size >= tokens; pipe: standard graphs largest-first, the last padded; exact and
// online_prepare: one graph of exactly `tokens`).
std::vector<int64_t> npu_graphs_for(int64_t tokens, NpuGraphMode mode, const SolverOptions& o);

// One op's decision: a row of the paper's Table 3.
struct OpDecision {
  std::string name;  // the weight: "q", "gate+up", ...
  OpKind kind = OpKind::MatMul;
  DType wtype = DType::Q4_0;
  int64_t m = 0, k = 0, n = 0;  // weight [m, k], activation [k, n]
  double t_gpu = 0;             // the whole op on the GPU
  double t_npu = 0;             // the whole op on the NPU, under the plan's graph mode
  Placement placement;
  int ratio_gpu = 0, ratio_npu = 0;  // weight and hybrid splits
  double gpu_part_us = 0, npu_part_us = 0, sync_us = 0, copy_us = 0;
  // Split placements: the bytes both parts stream over SolverOptions::shared_gbps (a floor on the
  // overlapped time; 0 where it does not apply).
  double shared_bw_us = 0;
  double contention_us = 0;  // SolverOptions::contention x the shorter part (split placements)
  // Online preparation of this op's NPU graph: paid once per request and distinct shape (the
  // layers share graphs), so not part of chosen_us.
  double compile_us = 0;
  double chosen_us = 0;  // the objective's value for the chosen placement
  std::string ratio;     // "3:1", "GPU-only", "NPU-only", "dynamic:256", "2:3 (weight)"
  std::string why;
};

// The time of one fixed placement of `w` at n tokens (what solve_op minimises).
OpDecision evaluate_placement(const WeightShape& w, int64_t n, const Placement& p, int ratio_gpu,
                              int ratio_npu, NpuGraphMode mode, const LatencySource& src,
                              const SolverOptions& o);
// The best placement of `w` at n tokens under a graph mode.
OpDecision solve_op(const WeightShape& w, int64_t n, NpuGraphMode mode, const LatencySource& src,
                    const SolverOptions& o);

struct PlanResult {
  Plan plan;
  Phase phase = Phase::prefill;
  int64_t n_tokens = 0;
  int n_layer = 0;
  std::vector<OpDecision> ops;  // one per WeightShape, logits last
  double layer_us = 0;          // one decoder layer's matmuls
  double compile_us = 0;        // online graph preparation, once per distinct NPU shape
  double total_us = 0;          // n_layer layers plus the logits plus compile_us
};

// The solver's plan ("tensor"). Logits run for one token per sequence in both phases.
PlanResult solve_plan(const std::vector<WeightShape>& weights, int n_layer, Phase phase,
                      int64_t n_tokens, const LatencySource& src, const SolverOptions& o);

// HeteroInfer's baselines, evaluated with the same latencies: "gpu-only", "npu-only" (padding),
// "online-prepare", "npu-pipe", "layer" (prefill matmuls on the NPU in W^T A^T order, decode on
// the GPU). Throws invalid_argument for another name (online-prepare needs options.soc).
std::vector<std::string> baseline_names();
PlanResult baseline_plan(std::string_view name, const std::vector<WeightShape>& weights,
                         int n_layer, Phase phase, int64_t n_tokens, const LatencySource& src,
                         const SolverOptions& o);

// {"name", "npu_mode", "phase", "n_tokens", "layer_us", "total_us", "matmul": {role: {strategy,
// gpu_rows, npu_tokens}}, "rows": [OpDecision...]}. Callers add version/keys.
nlohmann::json plan_to_json(const PlanResult& r);
// Reads "name", "npu_mode" and "matmul" (every role must be present). Throws bad_format naming the
// field.
Plan plan_from_json(const nlohmann::json& j);

}  // namespace duet
