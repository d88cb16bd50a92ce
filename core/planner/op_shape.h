#pragma once
// The shape of one device op, independent of flatbuffers, so the timing models
// (core/planner/npu_timing, core/planner/gpu_timing), the solver and the services can all describe
// "what is being computed".
//
// A matmul computes y[n][m] = sum_k W[m][k] * x[n][k]: the weight W is [m][k] (m output
// features, k input features; GGUF's ne1 x ne0), the activation x is [n][k] (n tokens).
#include <cstdint>
#include <string>

#include "core/model/dtype.h"

namespace duet {

// Values mirror schemas/program.fbs OpKind so the two convert with a cast.
enum class OpKind : uint8_t {
  Embed = 0,
  RmsNorm = 1,
  MatMul = 2,
  Rope = 3,
  KvWrite = 4,
  Attention = 5,
  SwiGlu = 6,
  Add = 7,
  Logits = 8,
  AddBias = 9,
};

struct OpShape {
  OpKind kind = OpKind::MatMul;
  DType wtype = DType::F16;  // the weight's storage type (activations are fp16 on the NPU)
  int64_t m = 0;             // weight rows = output features
  int64_t k = 0;             // weight cols = input features (the reduction)
  int64_t n = 0;             // activation rows = tokens
  // HeteroInfer's operand order: compute (W x^T) so the small activation is the stationary
  // operand and the large weight streams through the arrays. false = the naive x W^T order
  // with the weight stationary (NPU-2: several times slower).
  bool weight_stationary_transposed = true;

  bool operator==(const OpShape&) const = default;
};

// "MatMul Q4_0 m=4096 k=4096 n=128 order=WxT": names a shape in errors, logs and cache keys.
std::string op_shape_name(const OpShape& s);
std::string op_kind_name(OpKind k);

}  // namespace duet
