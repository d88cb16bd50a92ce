#include "core/planner/op_shape.h"

namespace duet {

std::string op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Embed:
      return "Embed";
    case OpKind::RmsNorm:
      return "RmsNorm";
    case OpKind::MatMul:
      return "MatMul";
    case OpKind::Rope:
      return "Rope";
    case OpKind::KvWrite:
      return "KvWrite";
    case OpKind::Attention:
      return "Attention";
    case OpKind::SwiGlu:
      return "SwiGlu";
    case OpKind::Add:
      return "Add";
    case OpKind::Logits:
      return "Logits";
    case OpKind::AddBias:
      return "AddBias";
  }
  return "OpKind(" + std::to_string(static_cast<int>(k)) + ")";
}

std::string op_shape_name(const OpShape& s) {
  return op_kind_name(s.kind) + " " + std::string(dtype_name(s.wtype)) +
         " m=" + std::to_string(s.m) + " k=" + std::to_string(s.k) + " n=" + std::to_string(s.n) +
         (s.weight_stationary_transposed ? " order=WxT" : " order=xWT");
}

}  // namespace duet
