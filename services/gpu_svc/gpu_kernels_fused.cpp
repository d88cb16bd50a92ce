// Fused launches (gpu_kernels.h; the runner's op_fusion.h decides where). A decode step of a 1B
// model is ~260-340 kernels: on PoCL every one wakes the worker threads and waits for the
// slowest, on NVIDIA's OpenCL every enqueue costs 16-19 us of host time (bench/gpu/RESULTS.md,
// "2026-11-28: discrete GPUs"). These do the work of two or three of them in one, with the same
// bits: the CPU integer path's, and the GPU kernels' (sibling GEMVs, add + rmsnorm, rope pair).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/kernel_args.h"
#include "services/gpu_svc/tiled_weights.h"

namespace duet::gpu {

bool GpuKernels::quantizes_input(const MatmulArgs& a) const {
  if (!int8_matmul_ || a.packed_rows || a.tokens.count() == 0 || a.row_end <= a.row_begin)
    return false;
  if (dtype_is_k_quant(a.wtype)) return a.k % kQK_K == 0;  // matmul_kq's integer path
  if (a.wtype != DType::Q4_0 && a.wtype != DType::Q8_0) return false;
  // matmul(): the cooperative GEMV (a GPU's, or a test's choice) takes few tokens first.
  return !(coop_gemv_ && a.tokens.count() <= 4) && dev_.info().type == "cpu";
}

int sibling_type_code(DType t) {
  switch (t) {
    case DType::Q4_0:
      return 0;
    case DType::Q8_0:
      return 1;
    case DType::Q4_K:
      return 2;
    case DType::Q5_K:
      return 3;
    case DType::Q6_K:
      return 4;
    default:
      return -1;
  }
}

bool GpuKernels::siblings_fuse(std::span<const MatmulArgs> mm) const {
  return sibling_pick(mm).has_value();
}

std::optional<GpuKernels::SiblingPick> GpuKernels::sibling_pick(
    std::span<const MatmulArgs> mm) const {
  if (mm.size() < 2 || mm.size() > kMaxSiblings) return std::nullopt;
  const MatmulArgs& a = mm[0];
  const ArenaRows input(a.x_off, a.x_stride, a.tokens);
  for (size_t s = 0; s < mm.size(); ++s) {
    const MatmulArgs& m = mm[s];
    if (m.rows_from_table || m.row_begin != 0 || m.x_off != a.x_off || m.x_stride != a.x_stride ||
        m.k != a.k || m.tokens.begin != a.tokens.begin || m.tokens.end != a.tokens.end)
      return std::nullopt;
    // Apart, a matmul writing its siblings' input (or outputs) would change what they compute.
    const ArenaRows out(m.y_off, m.y_stride, m.tokens);
    if (out.overlaps(input)) return std::nullopt;
    for (size_t o = 0; o < s; ++o)
      if (out.overlaps(ArenaRows(mm[o].y_off, mm[o].y_stride, mm[o].tokens))) return std::nullopt;
  }
  if (quantizes_input(a)) {  // the integer path: the T = 1 kernels only (decode)
    if (a.tokens.count() != 1) return std::nullopt;
    const auto bits_zp = int8_bits_zp(a);
    for (const MatmulArgs& m : mm)
      if (!quantizes_input(m) || !m.tiled || sibling_type_code(m.wtype) < 0 ||
          int8_bits_zp(m) != bits_zp)
        return std::nullopt;
    return SiblingPick{.int8 = true};
  }
  // The GPU GEMVs: every one the same sibling kernel (matmul_siblings_gpu.cl).
  std::optional<GemvPick> first = gemv_pick(a);
  if (!first || first->siblings.empty() || a.tokens.count() == 0) return std::nullopt;
  for (const MatmulArgs& m : mm.subspan(1)) {
    const std::optional<GemvPick> g = gemv_pick(m);
    if (quantizes_input(m) || !g || g->siblings != first->siblings) return std::nullopt;
  }
  return SiblingPick{.gemv = std::move(*first)};
}

cl_event GpuKernels::matmul_siblings(cl_mem arena, std::span<const MatmulArgs> mm) {
  const std::optional<SiblingPick> pick = sibling_pick(mm);
  if (!pick) return nullptr;
  return pick->int8 ? int8_siblings(arena, mm) : gemv_siblings(arena, mm, pick->gemv);
}

cl_event GpuKernels::int8_siblings(cl_mem arena, std::span<const MatmulArgs> mm) {
  const MatmulArgs& a = mm[0];
  const auto [bits, zp_shift] = int8_bits_zp(a);
  quantize_int8_input(arena, a, bits, zp_shift);  // once, as the first of them apart
  if (chain_recording()) {  // one barrier after the last: they read one input, write apart
    for (size_t s = 0; s < mm.size(); ++s) chain_matmul(arena, mm[s], bits, s + 1 == mm.size());
    return nullptr;
  }
  const std::string name = std::string("matmul_i8_siblings_t1_") +
                           (int8_vnni_ ? "vnni" : "portable") + "_a" + std::to_string(bits);
  cl_kernel k = dev_.kernel(name);
  set_args(k, cl_uint{a.k}, arena, cl_uint{a.tokens.begin}, int8_tiles_);
  size_t items = 0;
  for (size_t s = 0; s < kMaxSiblings; ++s) {
    const bool used = s < mm.size();
    const MatmulArgs& m = mm[std::min(s, mm.size() - 1)];  // unused: any buffer, 0 rows
    const cl_uint at = static_cast<cl_uint>(4 + 5 * s);
    set_arg(k, at, m.tiled);
    set_arg(k, at + 1, cl_uint{static_cast<uint32_t>(sibling_type_code(m.wtype))});
    set_arg(k, at + 2, cl_uint{used ? m.row_end : 0u});
    set_arg(k, at + 3, cl_ulong{m.y_off});
    set_arg(k, at + 4, cl_uint{m.y_stride});
    if (used) items += (m.row_end + kTiledRows - 1) / kTiledRows;
  }
  // matmul_int8's work-groups of 4 16-row items (a group may hold two segments' items).
  constexpr size_t kGroup = 4;
  const size_t global[2] = {round_up(items, kGroup), 1};
  const size_t local[2] = {kGroup, 1};
  return launch(name.c_str(), k, 2, global, local);
}

// Each segment's work-groups are the ones its GEMV apart would launch, one after another
// (GEMV_SIB_SEGMENT in matmul_siblings_gpu.cl finds a group's segment by the same counts).
cl_event GpuKernels::gemv_siblings(cl_mem arena, std::span<const MatmulArgs> mm,
                                   const GemvPick& g) {
  forget_quantized_input();
  const MatmulArgs& a = mm[0];
  cl_kernel k = dev_.kernel(g.siblings);
  set_args(k, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride}, cl_uint{a.tokens.begin},
           cl_ulong{a.tok_off});
  size_t groups = 0;
  for (size_t s = 0; s < kMaxSiblings; ++s) {
    const bool used = s < mm.size();
    const MatmulArgs& m = mm[std::min(s, mm.size() - 1)];  // unused: any buffer, 0 rows
    const cl_uint at = static_cast<cl_uint>(6 + 7 * s);
    const int type = sibling_type_code(m.wtype);
    set_arg(k, at, m.w);
    set_arg(k, at + 1, cl_ulong{m.w_off});
    set_arg(k, at + 2, cl_uint{m.packed_rows ? m.packed_rows : m.row_end});
    set_arg(k, at + 3, cl_uint{static_cast<uint32_t>(std::max(type, 0))});
    set_arg(k, at + 4, cl_uint{used ? m.row_end : 0u});
    set_arg(k, at + 5, cl_ulong{m.y_off});
    set_arg(k, at + 6, cl_uint{m.y_stride});
    if (used) groups += (m.row_end + g.rows_per_group - 1) / g.rows_per_group;
  }
  const size_t global[2] = {groups * g.group, a.tokens.count()};
  const size_t local[2] = {g.group, 1};
  return launch(g.siblings.c_str(), k, 2, global, local);
}

cl_event GpuKernels::add_rmsnorm(cl_mem arena, const ResidualAdd& add, uint64_t x_off,
                                 uint32_t x_stride, uint64_t out_off, uint32_t out_stride, cl_mem w,
                                 uint64_t w_off, uint32_t dim, float eps, TokenRange t) {
  // A token's work-group reads its a and b rows before its barrier and writes out after: out
  // may be a or b, row for row, but no other rows of theirs.
  const ArenaRows out(out_off, out_stride, t);
  for (const auto& [off, stride] : {std::pair{add.a_off, add.a_stride}, {add.b_off, add.b_stride}})
    if (out.overlaps(ArenaRows(off, stride, t)) && !(off == out_off && stride == out_stride))
      return nullptr;
  forget_quantized_input();
  cl_kernel k = dev_.kernel("add_rmsnorm");
  const size_t lsz = rmsnorm_group(dim);  // rmsnorm()'s: the same partial sums, the same scale
  set_args(k, arena, cl_ulong{add.a_off}, cl_uint{add.a_stride}, cl_ulong{add.b_off},
           cl_uint{add.b_stride}, cl_ulong{x_off}, cl_uint{x_stride}, cl_ulong{out_off},
           cl_uint{out_stride}, w, cl_ulong{w_off}, cl_uint{dim}, cl_float{eps}, cl_uint{t.begin},
           LocalBytes{lsz * sizeof(float)});
  const size_t global[2] = {lsz, t.count()};
  const size_t local[2] = {lsz, 1};
  return launch("add_rmsnorm", k, 2, global, local);
}

cl_event GpuKernels::add_rmsnorm_quantize(cl_mem arena, const std::optional<ResidualAdd>& add,
                                          uint64_t x_off, uint32_t x_stride, uint64_t out_off,
                                          uint32_t out_stride, cl_mem w, uint64_t w_off,
                                          uint32_t dim, float eps, TokenRange t,
                                          const MatmulArgs& next) {
  if (!quantizes_input(next) || next.tokens.begin != t.begin || next.tokens.end != t.end ||
      next.x_off != out_off || next.x_stride != out_stride || next.k != dim)
    throw Error(Errc::invalid_argument,
                "gpu_svc: add_rmsnorm_quantize's matmul does not read the norm's rows on the "
                "integer path");
  forget_quantized_input();
  const auto [bits, zp_shift] = int8_bits_zp(next);
  reserve_int8_tiles(dim, t.count());
  // rmsnorm()'s group size on a CPU device: the same partial sums, so the same scale.
  size_t lsz = 16;
  while (lsz > 1 && (lsz > dev_.info().max_work_group || lsz > dim)) lsz /= 2;
  const ResidualAdd r = add.value_or(ResidualAdd{});
  const QuantizedInput quantized{
      true, arena, out_off, out_stride, dim, t.begin, t.end, static_cast<uint32_t>(bits), zp_shift};
  if (chain_recording() && t.count() == 1) {
    chain_add_rmsnorm(arena, r, add.has_value(), x_off, x_stride, out_off, out_stride, w, w_off,
                      dim, eps, t.begin, bits, zp_shift, static_cast<uint32_t>(lsz));
    quantized_ = quantized;
    return nullptr;
  }
  cl_kernel k = dev_.kernel("add_rmsnorm_q8");
  set_args(k, arena, cl_ulong{r.a_off}, cl_uint{r.a_stride}, cl_ulong{r.b_off}, cl_uint{r.b_stride},
           cl_uint{add ? 1u : 0u}, cl_ulong{x_off}, cl_uint{x_stride}, cl_ulong{out_off},
           cl_uint{out_stride}, w, cl_ulong{w_off}, cl_uint{dim}, cl_float{eps}, cl_uint{t.begin},
           int8_tiles_, cl_uint{static_cast<uint32_t>(bits)}, cl_uint{zp_shift},
           LocalBytes{lsz * sizeof(float)});
  const size_t global[2] = {lsz, t.count()};
  const size_t local[2] = {lsz, 1};
  cl_event e = launch("add_rmsnorm_q8", k, 2, global, local);
  quantized_ = quantized;
  return e;
}

cl_event GpuKernels::swiglu_quantize(cl_mem arena, uint64_t g_off, uint32_t g_stride,
                                     uint64_t u_off, uint32_t u_stride, uint64_t out_off,
                                     uint32_t out_stride, uint32_t cols, TokenRange t,
                                     const MatmulArgs& next) {
  if (!quantizes_input(next) || next.tokens.begin != t.begin || next.tokens.end != t.end ||
      next.x_off != out_off || next.x_stride != out_stride || next.k != cols)
    throw Error(Errc::invalid_argument,
                "gpu_svc: swiglu_quantize's matmul does not read the product's rows on the "
                "integer path");
  forget_quantized_input();
  const auto [bits, zp_shift] = int8_bits_zp(next);
  reserve_int8_tiles(cols, t.count());
  const QuantizedInput quantized{true,    arena,   out_off, out_stride,
                                 cols,    t.begin, t.end,   static_cast<uint32_t>(bits),
                                 zp_shift};
  if (chain_recording() && t.count() == 1) {
    chain_swiglu(arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, cols, t.begin, bits,
                 zp_shift);
    quantized_ = quantized;
    return nullptr;
  }
  cl_kernel k = dev_.kernel("swiglu_q8");
  set_args(k, arena, cl_ulong{g_off}, cl_uint{g_stride}, cl_ulong{u_off}, cl_uint{u_stride},
           cl_ulong{out_off}, cl_uint{out_stride}, cl_uint{cols}, cl_uint{t.begin}, cl_uint{t.end},
           int8_tiles_, cl_uint{static_cast<uint32_t>(bits)}, cl_uint{zp_shift});
  // quantize_q8_act's range: a work-item per block and token.
  const size_t global[2] = {cols / static_cast<size_t>(kQK), t.count()};
  cl_event e = launch("swiglu_q8", k, 2, global, nullptr);
  quantized_ = quantized;
  return e;
}

cl_event GpuKernels::rope_pair(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t x_heads,
                               uint64_t y_off, uint32_t y_stride, uint32_t y_heads,
                               uint32_t head_dim, const RopeArgs& r, uint64_t tok_off,
                               TokenRange t) {
  forget_quantized_input();
  const cl_uint has_ff = r.has_factors ? 1u : 0u;
  if (dev_.info().type == "cpu" && !gpu_kernels_) {  // where rope() runs rope_heads
    if (chain_recording() && t.count() == 1) {
      chain_rope_pair(arena, x_off, x_stride, x_heads, y_off, y_stride, y_heads, head_dim, r,
                      tok_off, t.begin);
      return nullptr;
    }
    cl_kernel k = dev_.kernel("rope_heads_pair");
    set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_uint{x_heads}, cl_ulong{y_off},
             cl_uint{y_stride}, cl_uint{y_heads}, cl_uint{head_dim}, cl_float{r.freq_base},
             cl_ulong{tok_off}, cl_uint{t.begin}, cl_uint{t.count()}, cl_float{r.freq_scale},
             cl_uint{r.mode}, r.w, cl_ulong{r.factors_off}, has_ff);
    // rope()'s range on CPU devices: a work-item per pair and kRopeTokensPerItem tokens.
    const size_t global[2] = {head_dim / 2u,
                              (t.count() + kRopeTokensPerItem - 1) / kRopeTokensPerItem};
    return launch("rope_heads_pair", k, 2, global, nullptr);
  }
  cl_kernel k = dev_.kernel("rope_pair");
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_uint{x_heads}, cl_ulong{y_off},
           cl_uint{y_stride}, cl_uint{head_dim}, cl_float{r.freq_base}, cl_ulong{tok_off},
           cl_uint{t.begin}, cl_float{r.freq_scale}, cl_uint{r.mode}, r.w, cl_ulong{r.factors_off},
           has_ff);
  // rope()'s range: a work-item per pair, head (x's, then y's) and token.
  const size_t global[3] = {head_dim / 2u, size_t{x_heads} + y_heads, t.count()};
  return launch("rope_pair", k, 3, global, nullptr);
}

}  // namespace duet::gpu
