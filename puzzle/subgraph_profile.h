#pragma once
// Subgraph-level profiles for Puzzle's simulator: what one subgraph of a model costs on the
// modelled SoC, from core/timeline's compose_timeline over the subgraph's own ops (its GPU and NPU
// op lists, the waits between them, pipelining, syncs, padding, contention inside it), not a sum
// of per-layer times (Puzzle 2.1.2: sums mispredict subgraphs).
//
// Profiles are keyed by a Merkle hash of the subgraph: each op hashes to a leaf (kind, device,
// role, weight type and dims, rows, token range, graph mode, heads, its position in its unit and
// its waits inside the unit; never its layer number), a unit's hash is the Merkle root over its
// ops, joined by the hashes of its waits on the earlier units that are inside the subgraph (the
// others are met before the subgraph starts and dropped), and a subgraph's hash is the root over
// its units' hashes. Every decoder layer of a model has the same
// shape, so layers 3-5 and 10-12 hash alike and share one profile: the cache turns the GA's tens
// of thousands of subgraph lookups into a few hundred timeline runs.
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/model/shapes.h"
#include "core/planner/soc_profile.h"
#include "core/planner/solver.h"
#include "core/planner/timeline.h"
#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {

// One stage's cost as the simulator uses it.
struct StageCost {
  Proc proc = Proc::gpu;
  double span_us = 0;  // first op's start to last op's end, run alone
  double gpu_us = 0;   // GPU busy time inside it (an NPU subgraph's norms, RoPE, attention, adds)
  double npu_us = 0;   // NPU busy time inside it
  double bytes = 0;    // DRAM traffic (memory contention with the other device)
  double demand_gbps() const { return span_us > 0 ? bytes / span_us / 1e3 : 0; }
};

struct ProfileStats {
  uint64_t hits = 0, misses = 0;
};

// One model shape on one SoC: its units' op lists under the GPU-only and NPU-only plans and under
// the per-op solver's tensor plans (one per phase and token count, solved on first use), their
// hashes, and a profile cache. Not thread-safe.
class ModelCoster {
 public:
  // context_bucket > 0 rounds a decode step's cached context up to a multiple of it (so a
  // request's decode steps share a few profiles); 0 costs every context exactly.
  ModelCoster(const ModelShape& shape, const SocProfile& soc, int64_t context_bucket = 256,
              ShapeTypes types = {});

  const ModelShape& shape() const { return shape_; }
  int units() const { return units_; }
  // The Merkle hash of units [first, last] placed on `proc` (Proc::both: under the tensor plan
  // for a step of n_tokens).
  uint64_t subgraph_hash(int first, int last, Proc proc, int64_t n_tokens = 1);
  // The subgraph alone on the SoC at a step of n_tokens with `context` positions cached.
  StageCost subgraph(int first, int last, Proc proc, int64_t n_tokens, int64_t context);
  // duet's per-op solver's plan for a step of n_tokens (decode at 1, prefill above).
  const Plan& tensor_plan(int64_t n_tokens);
  // The subgraph's schedule (ops of units [first, last], waits outside it dropped).
  Schedule subgraph_schedule(int first, int last, Proc proc, int64_t n_tokens = 1);
  int64_t bucket(int64_t context) const;
  const ProfileStats& stats() const { return stats_; }
  const SolverOptions& solver_options() const { return options_; }

 private:
  struct Variant {  // the model under one plan
    Schedule schedule;
    std::vector<int> gpu_unit, npu_unit;  // each op's unit
    std::vector<uint64_t> unit_hash;      // its ops and the waits among them
    // Waits on earlier units: (how many units back, their hash), kept where that unit is inside.
    std::vector<std::vector<std::pair<int, uint64_t>>> unit_links;
    uint64_t plan_hash = 0;
  };
  const Variant& variant(Proc proc, int64_t n_tokens);
  Variant build_variant(const Plan& plan) const;
  StageCost run(const Schedule& s, int64_t n_tokens, int64_t context, Proc proc) const;

  ModelShape shape_;
  const SocProfile& soc_;
  int64_t context_bucket_;
  ShapeTypes types_;
  SolverOptions options_;
  int units_;
  std::map<std::pair<int, int64_t>, Variant> variants_;  // (proc, tokens: 0 unless both)
  std::map<int64_t, Plan> tensor_plans_;
  struct Key {
    uint64_t hash;
    int64_t n, context;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  std::unordered_map<Key, StageCost, KeyHash> cache_;
  ProfileStats stats_;
};

}  // namespace duet::puzzle
