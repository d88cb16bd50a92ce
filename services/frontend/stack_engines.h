#pragma once
// The engines a running stack serves with, by plan name:
//   reference           core/model/forward.h in the frontend process (the oracle)
//   gpu-only, npu-only, layer   fixed placements (core/program/plan.h), on gpu_svc and npu_svc
//   npu-only:online-prepare, npu-only:pipe   npu-only whose token counts with no compiled NPU
//                       graph are compiled for on the spot or chained from standard graphs
//                       (npu-only itself pads them: HeteroInfer's three baselines)
//   tensor              the solver's plan for the SoC per token bucket (modelled timing), asked of
//                       solver_svc, executed here and modelled on the SoC
//   auto                executes the solver's plan for this host (measured timing: the plan
//                       fastest here) and models the solver's plan for the SoC (issue 23 item 5);
//                       `--timing modeled` executes the SoC's plan, as tensor does
// While the solver is unreachable (or still profiling this host) a bucket runs gpu-only and
// status says so; the engine is rebuilt once idle to ask again.
// Programs run on the device services over ZeroMQ and shared memory (ProgramEngine).
#include <atomic>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "services/frontend/engine.h"
#include "services/frontend/kv_share.h"

namespace duet::frontend {

struct StackEngineConfig {
  std::string stack_id;
  std::string run_dir;
  std::string model_path;
  std::string soc = "sd8gen3";
  // What the solver optimises for the executed plan: "modeled" | "measured"; empty: the plan's
  // default (auto: measured, tensor: modeled). The SoC's modelled plan is always "modeled".
  std::string timing;
  int max_seqs = 16;  // sequences per step (the frontend's max running)
  int max_ctx = 0;    // positions per sequence (0 = the model's context)
  // Pages in the KV pool (core/model/kv_budget.h: sized by the stack's KV memory budget); 0: enough
  // for max_seqs sequences of max_ctx per engine sharing it.
  uint32_t kv_pages = 0;
  DType kv_type = DType::F16;     // KV values (`stack up --kv-type`)
  bool kv_prefix_sharing = true;  // prefix sharing of KV pages (env DUET_KV_PREFIX=off: none)
  int solver_timeout_ms = 5000;
  // An engine running gpu-only fallbacks (solver down) is rebuilt, once idle, after this long.
  int replan_after_ms = 5000;
  // Agent.xpu: the main and the proactive engine share one KV pool (kv_share.h), so a proactive
  // request's decode rides in the main engine's steps. The pool then holds KV for max_seqs
  // sequences per sharing engine (kKvSharers). Null: each engine has a KV segment of its own.
  std::shared_ptr<KvShare> kv_share;
  static constexpr uint32_t kKvSharers = 2;
  // The most tokens one step carries: programs are built for 1, 4, 16 and 64 tokens, and for
  // this many when it is larger (Agent.xpu's proactive engine: its prefill-only steps may be
  // longer, being preemptible).
  int max_step_tokens = 64;
  // Set while a restarted frontend adopts the requests of its journal (issue 22): the engine
  // built meanwhile attaches the stack's KV pool as the killed frontend left it. The frontend
  // clears it once adoption is over, so a later build starts a fresh pool.
  std::shared_ptr<std::atomic<bool>> adopt_kv;
};

// Every plan a stack serves, and the same list for error messages ("reference, gpu-only, ...").
const std::vector<std::string>& stack_plan_names();
// "subgraph:<path>": a subgraph placement from a JSON file (puzzle/subgraph_plan.h; issue 25).
inline constexpr std::string_view kSubgraphPlanPrefix = "subgraph:";
bool is_stack_plan(std::string_view plan);
std::string stack_plan_list();

// Makes the engine for `plan`. `instance` keeps the shm segment names and program ids of
// engines that live side by side apart (0 for the stack's main engine).
std::unique_ptr<Engine> make_stack_engine(const StackEngineConfig& config, const std::string& plan,
                                          uint32_t instance);

}  // namespace duet::frontend
