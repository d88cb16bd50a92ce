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
// JSON, version 1 (one placement for every step):
//   {"version": 1, "model": "llama3.2-1b", "units": 33,
//    "subgraphs": [{"first": 0, "last": 9, "device": "npu"}, ...]}  (device: gpu, npu, both)
// Version 2 (a placement per phase, as the per-phase GA chooses them: on the modelled SoC an
// LLM's prefill prefers the NPU and its decode steps the GPU):
//   {"version": 2, "model": "llama3.2-1b", "units": 33,
//    "prefill": {"subgraphs": [...]}, "decode": {"subgraphs": [...]}}
//
// Which steps are which phase (the stack's rule, services/frontend/program_engine.h): a step is a
// decode step when every entry in it is a request's sampled token (SeqStep::decode, set by the
// scheduler); a step holding any prompt token, a chunked prefill, a short prompt of one token,
// a prefill batched with decodes or an eval's per-position entries, is a prefill step. So the phase
// goes by the step's content, never by its size: a 1-token prompt runs the prefill placement, 16
// batched decodes the decode one. Both placements are registered once per engine (programs are per
// distinct placement, not per phase), the weights are read from the one mapped model file by both
// (no second copy).
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/shapes.h"
#include "core/planner/solver.h"
#include "core/program/plan.h"

namespace duet::puzzle {

// The newest version written and read; every older one is still read.
inline constexpr int kSubgraphPlanVersion = 2;

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
  // In unit order, covering [0, units): every step's placement, or with decode_subgraphs the
  // prefill steps'.
  std::vector<Subgraph> subgraphs;
  // The decode steps' placement (version 2); empty: they run `subgraphs` too (version 1).
  std::vector<Subgraph> decode_subgraphs;
  bool per_phase() const { return !decode_subgraphs.empty(); }
  const std::vector<Subgraph>& of(Phase phase) const {
    return phase == Phase::decode && per_phase() ? decode_subgraphs : subgraphs;
  }
  bool operator==(const SubgraphPlan&) const = default;
};

// Throws Error(bad_format) naming the problem (and, per phase, which phase's placement): no
// subgraphs, a subgraph out of [0, units) or with last < first, a gap or an overlap between
// neighbours, units != expected_units.
void validate_subgraph_plan(const SubgraphPlan& plan, int expected_units);

// Version 1 for one placement, version 2 for a placement per phase.
nlohmann::json subgraph_plan_to_json(const SubgraphPlan& plan);
// Reads either version and validates against the named shape's unit count. Throws
// Error(bad_format) for a missing or mistyped field, an unknown device, an unknown version;
// Error(not_found) for an unknown model.
SubgraphPlan subgraph_plan_from_json(const nlohmann::json& j);

}  // namespace duet::puzzle
