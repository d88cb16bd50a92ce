#pragma once
// Plans on demand: a query (model shape or file, SoC profile, timing mode, phase, token count)
// gets a profile (modelled: run now, it takes milliseconds; measured: the cached one, or a
// profiling run against the stack's gpu_svc and npu_svc), the solver's plan and the baselines,
// as JSON. Plans are cached on disk, <cache>/plans/<key>.json, keyed by shape, SoC, timing mode,
// phase and length bucket; each carries a version that goes up whenever the solver version or the
// profile it was solved from changes. `duet plan` and solver_svc both answer through here.
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/planner/profiler.h"
#include "core/planner/solver.h"

namespace duet {

struct PlanQuery {
  std::string shape = "llama3-8b";  // a named shape (core/model/shapes.h), unless model_path is set
  std::string model_path;           // a GGUF: its weight shapes and types
  std::string soc = "sd8gen3";
  std::string timing = "modeled";  // "modeled" | "measured"
  Phase phase = Phase::prefill;
  int64_t n_tokens = 1;
  // Measured mode: the stack whose gpu_svc and npu_svc run the ops.
  std::string stack_id = "default";
  std::string run_dir;  // empty: the stack's default run dir
  uint32_t reps = 3;
  std::chrono::milliseconds op_timeout{60000};
  bool reprofile = false;                // measured: ignore a cached profile
  std::vector<int64_t> profile_lengths;  // empty: standard + sweep (core/planner/profiler.h)
  int row_steps = 0;                     // rows profiled per weight; 0: 8 modelled, 4 measured
  bool use_cache = true;                 // plans: read and write the plan cache
  bool baselines = true;                 // add the baselines' totals to the answer
  std::string npu_mode = "auto";  // the tensor plan's NPU graph mode: auto (cheaper), padding, pipe

  void validate() const;  // throws invalid_argument naming the field
};

// The weights and layer count a query is about, and the name it is cached under.
struct QueryModel {
  std::string key;  // shape name, or the model file's name
  std::vector<WeightShape> weights;
  int n_layer = 0;
};
QueryModel query_model(const PlanQuery& q);

// The query's profile: modelled ones are run every time (and stored), measured ones come from the
// cache unless reprofile or absent. `from_cache` says which.
Profile profile_for(const PlanQuery& q, const QueryModel& model, bool* from_cache = nullptr);

// Whether profile_for would answer from the disk cache without profiling (modelled profiles are
// always run: false).
bool profile_cached(const PlanQuery& q, const QueryModel& model);

// The length bucket of a token count (its key in the plan cache): decode is 1; prefill plans are
// per exact length, since activation splits depend on the ragged rest.
int64_t length_bucket(Phase phase, int64_t n_tokens);
std::string plan_cache_path(const PlanQuery& q, const QueryModel& model);

// plan_to_json of the solver's plan plus "version", "fingerprint", "key", "shape", "soc",
// "timing", "profile" {device, entries, profiling_s, cached}, "cached" and, with baselines,
// "baselines" {name: total_us} and "best_single_device".
nlohmann::json plan_json_for(const PlanQuery& q);
// The solver's modelled sd8gen3 plan for a step of n_tokens of a model file (decode for 1; no
// plan cache, no baselines): what a `tensor` stack runs for that bucket, without solver_svc.
Plan modeled_plan_for(const std::string& model_path, int64_t n_tokens);

// The paper's Table 3 layout: weight shape, activation shape, T_gpu, T_npu, strategy, ratio, one
// line per op of each plan.
std::string format_plan_table(const std::vector<nlohmann::json>& plans);

}  // namespace duet
