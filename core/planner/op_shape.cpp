#include "core/planner/op_shape.h"

#include "core/base/enum_names.h"

namespace duet {

namespace {

constexpr std::string_view kOpKindNames[] = {"Embed",     "RmsNorm", "MatMul", "Rope",   "KvWrite",
                                             "Attention", "SwiGlu",  "Add",    "Logits", "AddBias"};
static_assert(std::size(kOpKindNames) == static_cast<size_t>(OpKind::AddBias) + 1,
              "a name for every OpKind, in order");

}  // namespace

std::string op_kind_name(OpKind k) {
  const std::string_view name = enum_name(kOpKindNames, k, "");
  if (!name.empty()) return std::string(name);
  return "OpKind(" + std::to_string(static_cast<int>(k)) + ")";
}

std::string op_shape_name(const OpShape& s) {
  return op_kind_name(s.kind) + " " + std::string(dtype_name(s.wtype)) +
         " m=" + std::to_string(s.m) + " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) +
         (s.weight_stationary_transposed ? " order=WxT" : " order=xWT");
}

}  // namespace duet
