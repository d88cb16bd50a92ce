#pragma once
// A plan says, for every partitionable op of a model (the matmuls), which device computes it and
// how it is split. Norms, RoPE, attention, SwiGLU and residual adds always run on the GPU, as in
// HeteroInfer's layer- and tensor-level designs; the embedding lookup too.
//
// Strategies (HeteroInfer §5, MISSION.md):
//   gpu_only, npu_only     the whole matmul on one device
//   weight_split           output rows [0, gpu_rows) on the GPU, the rest on the NPU, at once
//   activation_split       token rows [0, npu_tokens) on the NPU (standard-size chunks), the
//                          ragged rest on the GPU
//   hybrid                 activation split whose NPU part is itself weight-split by gpu_rows
//   padding                npu_only, the NPU graph padded up to npu_tokens (a standard size)
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet {

enum class Device : uint8_t { gpu = 0, npu = 1 };

enum class MatmulRole : uint8_t { q = 0, k, v, o, gate, up, down, logits };
constexpr int kMatmulRoles = 8;
std::string_view matmul_role_name(MatmulRole r);

enum class Strategy : uint8_t {
  gpu_only = 0,
  npu_only,
  weight_split,
  activation_split,
  hybrid,
  padding,
};
std::string_view strategy_name(Strategy s);
Strategy strategy_from_name(std::string_view name);  // throws invalid_argument

struct Placement {
  Strategy strategy = Strategy::gpu_only;
  int64_t gpu_rows = 0;    // weight_split / hybrid: output rows [0, gpu_rows) on the GPU
  int64_t npu_tokens = 0;  // activation_split / hybrid / padding: tokens handled by the NPU
  bool operator==(const Placement&) const = default;
};

// What the NPU does with a token count it has no compiled graph for (HeteroInfer's baselines).
enum class NpuGraphMode : uint8_t {
  exact = 0,       // a graph for exactly this shape must exist (else an error)
  padding = 1,     // run the next standard-size graph, padded
  online_prepare,  // compile a graph for this shape now, paying the compile cost
  pipe,            // several standard-size graphs in a row (NPU-pipe)
};
std::string_view npu_graph_mode_name(NpuGraphMode m);

struct Plan {
  std::string name;  // "gpu-only", "npu-only", "layer", "tensor", ...
  std::array<Placement, kMatmulRoles> matmul{};
  NpuGraphMode npu_mode = NpuGraphMode::padding;

  // Whether `o` places every matmul as this plan does (its name aside): the same program.
  bool same_placements(const Plan& o) const { return matmul == o.matmul && npu_mode == o.npu_mode; }
  Placement& at(MatmulRole r) { return matmul[static_cast<int>(r)]; }
  const Placement& at(MatmulRole r) const { return matmul[static_cast<int>(r)]; }
  bool uses_npu() const;

  // Every matmul on the GPU.
  static Plan gpu_only();
  // Every matmul on the NPU (the rest on the GPU): HeteroInfer's layer-level execution.
  static Plan npu_only();
  // The plans that need no solver, by name: gpu-only, npu-only (= layer; token counts with no
  // compiled graph padded up), npu-only:online-prepare (a graph compiled for the exact count),
  // npu-only:pipe (standard-size graphs chained). Error(invalid_argument) for any other name.
  static Plan fixed(const std::string& name);
};

}  // namespace duet
