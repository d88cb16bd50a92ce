#include "services/gpu_svc/op_fusion.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/model/dtype.h"
#include "core/model/ops.h"

namespace duet::gpu {
namespace {

bool same_tensor(const fb::TensorRef* a, const fb::TensorRef* b) {
  return a && b && a->segment() == b->segment() && a->offset() == b->offset() &&
         a->slot() == b->slot() && a->cols() == b->cols();
}

// Whether ops[i] can be folded into the launch of the op before it: nothing makes the host stop
// between them (a wait on another device's flag) and it covers every token of the step.
bool joinable(const fb::OpT& op) {
  return op.wait_flags.empty() && op.seq_begin == 0 && op.seq_end == 0;
}

// A matmul reading `in` on every token (its quantised input can come from the fused launch).
bool matmul_of(const fb::OpT& op, const fb::TensorRef* in) {
  return (op.kind == fb::OpKind::MatMul || op.kind == fb::OpKind::Logits) && op.weight &&
         joinable(op) && same_tensor(op.in0.get(), in);
}

bool norm_feeding_matmul(const fb::OpT& norm, const fb::OpT& mm) {
  return norm.kind == fb::OpKind::RmsNorm && norm.publish_flag < 0 && norm.in0 && norm.out &&
         norm.weight && norm.in0->cols() == norm.out->cols() && norm.out->cols() % 32 == 0 &&
         matmul_of(mm, norm.out.get());
}

// A matmul that can run with siblings: all of its tensor's rows (never a tensor plan's split),
// every token, and for the integer path a type of matmul_siblings_cpu.cl's (the GPU kernels'
// types are GpuKernels::siblings_fuse's to check at run time).
bool whole_matmul(const fb::OpT& op, FusionTarget target) {
  if (op.kind != fb::OpKind::MatMul || !op.weight || !op.in0 || !op.out) return false;
  const auto t = static_cast<DType>(op.weight->dtype());
  const bool typed = target == FusionTarget::gpu_kernels || t == DType::Q4_0 || t == DType::Q8_0 ||
                     dtype_is_k_quant(t);
  return typed && op.seq_begin == 0 && op.seq_end == 0 && op.row_begin == 0 &&
         (op.row_end == 0 || op.row_end == op.weight->rows()) &&
         op.weight->cols() == op.in0->cols();
}

// The quantised input one launch can share: Q4_0 and Q8_0 weights have zero points of their own
// (matmul_int8.cl's zp_shift), the K types none.
bool same_input_quantisation(const fb::OpT& a, const fb::OpT& b) {
  const auto ta = static_cast<DType>(a.weight->dtype()), tb = static_cast<DType>(b.weight->dtype());
  return ta == tb || (dtype_is_k_quant(ta) && dtype_is_k_quant(tb));
}

// How many matmuls from ops[i] form a sibling group (0 or 1: none): whole matmuls of the same
// input (on the integer path: quantised alike), none but the last publishing a flag, none after
// the first waiting for one.
uint32_t siblings_at(const std::vector<std::unique_ptr<fb::OpT>>& ops, size_t i,
                     FusionTarget target) {
  const fb::OpT& first = *ops[i];
  if (!whole_matmul(first, target)) return 0;
  uint32_t n = 1;
  while (n < GpuKernels::kMaxSiblings && i + n < ops.size()) {
    const fb::OpT& prev = *ops[i + n - 1];
    const fb::OpT& op = *ops[i + n];
    if (prev.publish_flag >= 0 || !whole_matmul(op, target) || !op.wait_flags.empty() ||
        !same_tensor(op.in0.get(), first.in0.get()) ||
        (target == FusionTarget::cpu_integer && !same_input_quantisation(first, op)) ||
        same_tensor(op.out.get(), first.in0.get()))
      break;
    ++n;
  }
  return n;
}

bool same_rope(const fb::OpT& a, const fb::OpT& b) {
  const bool factors = a.freq_factors != nullptr;
  return a.freq_base == b.freq_base && a.freq_scale == b.freq_scale && a.rope_mode == b.rope_mode &&
         a.head_dim == b.head_dim && factors == (b.freq_factors != nullptr) &&
         (!factors || a.freq_factors->offset() == b.freq_factors->offset());
}

}  // namespace

std::vector<FusedGroup> plan_fusion(const fb::ProgramT& prog, FusionTarget target) {
  const auto& ops = prog.ops;
  std::vector<FusedGroup> plan(ops.size());
  for (size_t i = 0; i < ops.size();) {
    const fb::OpT& op = *ops[i];
    const fb::OpT* next = i + 1 < ops.size() ? ops[i + 1].get() : nullptr;
    const fb::OpT* after = i + 2 < ops.size() ? ops[i + 2].get() : nullptr;
    FusedGroup g;
    if (op.kind == fb::OpKind::Add && op.publish_flag < 0 && op.in0 && op.in1 && op.out && next &&
        after && joinable(*next) && same_tensor(next->in0.get(), op.out.get()) &&
        op.in0->cols() == op.out->cols() && op.in1->cols() == op.out->cols() &&
        norm_feeding_matmul(*next, *after)) {
      g = {Fusion::add_norm_quantize, 2};
    } else if (op.kind == fb::OpKind::RmsNorm && next && norm_feeding_matmul(op, *next)) {
      g = {Fusion::norm_quantize, 1};
    } else if (op.kind == fb::OpKind::SwiGlu && op.publish_flag < 0 &&
               op.ffn_act == static_cast<uint8_t>(ops::FfnAct::silu) && op.in0 && op.in1 &&
               op.out && op.out->cols() % 32 == 0 && op.in0->cols() == op.out->cols() &&
               op.in1->cols() == op.out->cols() && next && matmul_of(*next, op.out.get())) {
      g = {Fusion::swiglu_quantize, 1};
    } else if (const uint32_t n = siblings_at(ops, i, target); n >= 2) {
      g = {Fusion::sibling_matmuls, n};
    } else if (op.kind == fb::OpKind::Rope && op.publish_flag < 0 && op.in0 && next &&
               next->kind == fb::OpKind::Rope && joinable(*next) && next->in0 &&
               same_rope(op, *next) && !same_tensor(op.in0.get(), next->in0.get())) {
      g = {Fusion::rope_pair, 2};
    }
    plan[i] = g;
    i += g.ops;  // a *_quantize group's matmul may open a sibling group: planning goes on there
  }
  return plan;
}

FusedLaunch launch_fused(GpuKernels& kernels, const fb::ProgramT& prog, size_t i, FusedGroup g,
                         cl_mem arena, const ArenaOffsets& at, cl_mem weights, uint64_t tok_off,
                         TokenRange all, std::span<const MatmulArgs> matmuls) {
  const fb::OpT& op = *prog.ops[i];
  const MatmulArgs* next = matmuls.size() == 1 ? matmuls.data() : nullptr;
  switch (g.kind) {
    case Fusion::add_norm_quantize:
    case Fusion::norm_quantize: {
      const fb::OpT& norm = g.kind == Fusion::norm_quantize ? op : *prog.ops[i + 1];
      std::optional<GpuKernels::ResidualAdd> add;
      if (g.kind == Fusion::add_norm_quantize)
        add = GpuKernels::ResidualAdd{at(*op.in0), op.in0->cols(), at(*op.in1), op.in1->cols()};
      if (next && kernels.quantizes_input(*next))
        return {kernels.add_rmsnorm_quantize(
                    arena, add, at(*norm.in0), norm.in0->cols(), at(*norm.out), norm.out->cols(),
                    weights, norm.weight->offset(), norm.in0->cols(), norm.eps, all, *next),
                g.ops};
      // The GPU kernels fuse the add and the norm; the matmul after runs apart.
      if (!add || !kernels.gpu_kernels()) return {};
      cl_event e = kernels.add_rmsnorm(arena, *add, at(*norm.in0), norm.in0->cols(), at(*norm.out),
                                       norm.out->cols(), weights, norm.weight->offset(),
                                       norm.in0->cols(), norm.eps, all);
      return {e, e ? g.ops : 0};
    }
    case Fusion::swiglu_quantize:
      if (!next || !kernels.quantizes_input(*next)) return {};
      return {
          kernels.swiglu_quantize(arena, at(*op.in0), op.in0->cols(), at(*op.in1), op.in1->cols(),
                                  at(*op.out), op.out->cols(), op.out->cols(), all, *next),
          g.ops};
    case Fusion::rope_pair: {
      const fb::OpT& k = *prog.ops[i + 1];
      RopeArgs r;
      r.freq_base = op.freq_base;
      r.freq_scale = op.freq_scale;
      r.mode = op.rope_mode;
      r.w = weights;
      r.has_factors = op.freq_factors != nullptr;
      if (op.freq_factors) r.factors_off = op.freq_factors->offset();
      return {kernels.rope_pair(arena, at(*op.in0), op.in0->cols(), op.n_heads, at(*k.in0),
                                k.in0->cols(), k.n_heads, op.head_dim, r, tok_off, all),
              g.ops};
    }
    case Fusion::sibling_matmuls: {
      if (matmuls.size() != g.ops) return {};
      // The GPU kernels: where the group's GEMVs differ, its first two may still fuse.
      const size_t least = kernels.gpu_kernels() ? 2 : g.ops;
      for (size_t n = g.ops; n >= least && n >= 2; --n)
        if (cl_event e = kernels.matmul_siblings(arena, matmuls.first(n)))
          return {e, static_cast<uint32_t>(n)};
      return {};
    }
    case Fusion::none:
      break;
  }
  return {};
}

bool fusion_from_env() {
  return setting_text("DUET_GPU_FUSE") == "1";  // checked: anything but 0 or 1 throws
}

}  // namespace duet::gpu
