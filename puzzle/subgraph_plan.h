#pragma once
// Puzzle's subgraph placement for an LLM (issue 25 item 2's plan format): a model's op sequence
// cut into contiguous subgraphs of "units", each mapped to the GPU or the NPU.
//
// A unit is the finest piece a cut may fall between: half a decoder layer. Unit 2l is layer l's
// attention block (RMSNorm, Q/K/V, RoPE, KV write, attention, O, residual add; unit 0 also holds
// the token embedding), unit 2l+1 its FFN block (RMSNorm, gate, up, SwiGLU, down, residual add),
// and the last unit, 2L, the head (final RMSNorm, logits). So a model of L layers has 2L+1 units
// and cuts fall on layer boundaries or between a layer's attention and its FFN.
//
// A subgraph on the NPU runs its matmuls there as static graphs; its norms, RoPE, attention and
// adds stay on the GPU, as duet's plan contract says for every plan (core/plan.h): the NPU
// computes matmuls only. Hand-offs between subgraphs on different devices go through the
// existing flags (one fast sync; memory is shared, nothing is copied).
//
// JSON: {"version": 1, "model": "llama3.2-1b", "units": 33,
//        "subgraphs": [{"first": 0, "last": 9, "device": "npu"}, ...]}  (device: gpu, npu, both)
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/shapes.h"
#include "core/program/plan.h"

namespace duet::puzzle {

inline constexpr int kSubgraphPlanVersion = 1;

int unit_count(const ModelShape& shape);  // 2 * n_layer + 1
// "layer3.attn", "layer3.ffn", "embed+layer0.attn", "head".
std::string unit_name(int unit, int n_layer);

// Where a subgraph runs: the GPU, the NPU, or both under duet's per-op tensor plan (core/solver.h:
// each matmul placed or split by the HeteroInfer solver for the step's phase and token count;
// an extension of Puzzle's processors for LLMs, whose large matmuls gain from co-execution).
enum class Proc : uint8_t { gpu = 0, npu = 1, both = 2 };
inline constexpr int kProcs = 3;
std::string_view proc_name(Proc p);  // "gpu", "npu", "both"

struct Subgraph {
  int first = 0, last = 0;  // units [first, last]
  Proc device = Proc::gpu;
  bool operator==(const Subgraph&) const = default;
};

struct SubgraphPlan {
  std::string model;  // a core/shapes name
  int units = 0;
  std::vector<Subgraph> subgraphs;  // in unit order, covering [0, units)
  bool operator==(const SubgraphPlan&) const = default;
};

// Throws Error(bad_format) naming the problem: no subgraphs, a subgraph out of [0, units) or with
// last < first, a gap or an overlap between neighbours, units != expected_units.
void validate_subgraph_plan(const SubgraphPlan& plan, int expected_units);

nlohmann::json subgraph_plan_to_json(const SubgraphPlan& plan);
// Reads and validates against the named shape's unit count. Throws Error(bad_format) for a
// missing or mistyped field, an unknown device, a version other than kSubgraphPlanVersion;
// Error(not_found) for an unknown model.
SubgraphPlan subgraph_plan_from_json(const nlohmann::json& j);

}  // namespace duet::puzzle
