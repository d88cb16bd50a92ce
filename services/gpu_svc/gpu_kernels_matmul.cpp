// GpuKernels' matmul launches: the CPU GEMV/GEMM, the integer (int8 activation) path with its
// input quantisation, the dispatch by weight type and device, and the GPU GEMV variants.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/kernel_args.h"
#include "services/gpu_svc/tiled_weights.h"
#include "services/gpu_svc/weight_pack.h"

namespace duet::gpu {

// CPU devices (PoCL): the GEMV runs one row per work-item (matmul_t1_*), the GEMM tiles of
// kCpuGemmRows rows x kCpuGemmTokens tokens per work-item (matmul_cpu_gemm_*, matmul.cl).
cl_event GpuKernels::matmul_cpu(cl_mem arena, const MatmulArgs& a) {
  if (int8_matmul_ && (a.wtype == DType::Q4_0 || a.wtype == DType::Q8_0))
    return matmul_int8(arena, a);
  forget_quantized_input();
  constexpr size_t kCpuGemmRows = 3, kCpuGemmTokens = 6;  // CPU_GEMM_ROWS/_TOKENS in matmul.cl
  constexpr size_t kRowGroup = 16;  // work-items per work-group: PoCL runs a group per thread
  const bool gemm = a.tokens.count() > 2;
  const std::string name =
      std::string(gemm ? "matmul_cpu_gemm_" : "matmul_t1_") + kernel_type_suffix(a.wtype);
  cl_kernel k = dev_.kernel(name);
  set_args(k, a.w, cl_ulong{a.w_off}, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride},
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0});
  const size_t rows_per_item = gemm ? kCpuGemmRows : 1, tokens_per_item = gemm ? kCpuGemmTokens : 1;
  const size_t items = (a.row_end - a.row_begin + rows_per_item - 1) / rows_per_item;
  const size_t global[2] = {round_up(items, kRowGroup),
                            (a.tokens.count() + tokens_per_item - 1) / tokens_per_item};
  const size_t local[2] = {kRowGroup, 1};
  return launch(name.c_str(), k, 2, global, local);
}

// Two launches: quantize_q8_act writes the token rows' quantised blocks into int8_tiles_ (grown on
// demand), then matmul_i8_* reads them. The returned event is the matmul's (profiling then
// counts the matmul only; the quantisation reads k floats per token, ~1/rows of the matmul).
// One token takes the T = 1 kernel (no tile to fill), more the 8- or 16-token GEMM: the same
// bits.
cl_event GpuKernels::matmul_int8(cl_mem arena, const MatmulArgs& a) {
  const uint32_t n = a.tokens.count();
  if (n == 0 || a.row_end <= a.row_begin) {
    const size_t none[1] = {0};
    return launch("matmul_i8", nullptr, 1, none, nullptr);
  }
  const auto [bits, zp_shift] = int8_bits_zp(a);
  quantize_int8_input(arena, a, bits, zp_shift);
  if (chain_recording() && n == 1) {
    chain_matmul(arena, a, bits, /*barrier=*/true);
    return nullptr;
  }

  // VNNI: 8-token items measured best of 8, 12 and 16 (bench/gpu/RESULTS.md); AMX: a whole
  // 16-token input tile per item (one tile product per plane and block).
  constexpr size_t kRowsPerItem = kTiledRows;  // matmul_int8.cl: a work-item is a 16-row group
  const bool amx = int8_amx_ && int8_vnni_ && n > kInt8GemmTokens;
  const size_t tokens_per_item = n == 1 ? 1 : amx ? kInt8TileTokens : kInt8GemmTokens;
  const char* isa = amx ? "_amx" : int8_vnni_ ? "_vnni" : "_portable";
  const std::string name = std::string("matmul_i8_") + kernel_type_suffix(a.wtype) + "_t" +
                           std::to_string(tokens_per_item) + isa + "_a" + std::to_string(bits) +
                           (a.tiled ? "_tiled" : "_file");
  cl_kernel k = dev_.kernel(name);
  set_args(k, a.tiled ? a.tiled : a.w, cl_ulong{a.tiled ? 0 : a.w_off}, cl_uint{a.k}, arena,
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0}, int8_tiles_);
  // PoCL runs a work-group per thread: groups of 4 items (64 rows) spread a K/V projection's
  // 512 rows over 8 groups.
  constexpr size_t kGroup = 4;
  // Tiled: the 16-row groups from the one holding row_begin; the file's layout: from row_begin.
  const size_t first_row = a.tiled ? a.row_begin / kRowsPerItem * kRowsPerItem : a.row_begin;
  const size_t items = (a.row_end - first_row + kRowsPerItem - 1) / kRowsPerItem;
  const size_t global[2] = {round_up(items, kGroup), (n + tokens_per_item - 1) / tokens_per_item};
  const size_t local[2] = {kGroup, 1};
  return launch(name.c_str(), k, 2, global, local);
}

std::pair<int, uint32_t> GpuKernels::int8_bits_zp(const MatmulArgs& a) const {
  const int bits = a.role ? int8_act_bits(*a.role) : int8_act_bits();
  // The weights' zero point as a shift: Q4_0 nibbles are w + 8, Q8_0 bytes w + 128 (the XOR);
  // K types have none (their mins are applied per sub-block in the kernel).
  const uint32_t zp_shift = a.wtype == DType::Q4_0 ? 3 : a.wtype == DType::Q8_0 ? 7 : 0;
  return {bits, zp_shift};
}

void GpuKernels::reserve_int8_tiles(uint32_t k, uint32_t n) {
  const size_t tile_bytes = int8_tile_bytes(k);
  const size_t tiles = (n + kInt8TileTokens - 1) / kInt8TileTokens;
  if (tile_bytes * tiles <= int8_tiles_bytes_) return;
  flush_chain();  // recorded stages name the buffer being replaced
  forget_quantized_input();
  if (int8_tiles_) clReleaseMemObject(int8_tiles_);  // queued users keep it alive
  int8_tiles_ = nullptr;
  int8_tiles_bytes_ = 0;
  cl_int err = CL_SUCCESS;
  const size_t bytes = tile_bytes * std::max<size_t>(tiles, 8);
  int8_tiles_ = clCreateBuffer(dev_.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer(int8 tiles)");
  int8_tiles_bytes_ = bytes;
}

void GpuKernels::quantize_int8_input(cl_mem arena, const MatmulArgs& a, int bits,
                                     uint32_t zp_shift) {
  const uint32_t n = a.tokens.count();
  reserve_int8_tiles(a.k, n);
  const QuantizedInput input{true,    arena,          a.x_off,      a.x_stride,
                             a.k,     a.tokens.begin, a.tokens.end, static_cast<uint32_t>(bits),
                             zp_shift};
  if (!(reuse_quantized_ && quantized_ == input) && chain_recording() && n == 1) {
    chain_quantize(arena, a, bits, zp_shift);
    quantized_ = input;
  } else if (!(reuse_quantized_ && quantized_ == input)) {
    cl_kernel qk = dev_.kernel("quantize_q8_act");
    set_args(qk, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride}, cl_uint{a.k},
             cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, int8_tiles_,
             cl_uint{static_cast<uint32_t>(bits)}, cl_uint{zp_shift});
    const size_t qglobal[2] = {a.k / static_cast<size_t>(kQK), n};
    clReleaseEvent(launch("quantize_q8_act", qk, 2, qglobal, nullptr));
    quantized_ = input;
  }
  // The output may overwrite the input rows (or, for Logits, rows we do not bound here).
  if (a.rows_from_table ||
      ArenaRows(a.y_off, a.y_stride, a.tokens).overlaps(ArenaRows(a.x_off, a.x_stride, a.tokens)))
    forget_quantized_input();
}

void GpuKernels::reuse_quantized_inputs() {
  reuse_quantized_ = true;
  forget_quantized_input();
}

cl_event GpuKernels::matmul(cl_mem arena, const MatmulArgs& a) {
  if (dtype_is_k_quant(a.wtype)) return matmul_kq(arena, a);
  if (a.packed_rows && !has_packed_layout(a.wtype))
    throw Error(Errc::invalid_argument, std::string("gpu_svc: no packed layout for ") +
                                            kernel_type_suffix(a.wtype) + " weights");
  if (const std::optional<GemvPick> g = gemv_pick(a)) return gemv_gpu(arena, a, *g);
  if (!a.packed_rows && dev_.info().type == "cpu") return matmul_cpu(arena, a);
  forget_quantized_input();  // the float paths do not track their outputs
  const uint32_t per_item = a.tokens.count() <= 2 ? 1 : kMatmulTokensPerItem;
  const std::string name = std::string(a.packed_rows ? "matmul_packed_t" : "matmul_t") +
                           (per_item == 1 ? "1_" : "8_") + kernel_type_suffix(a.wtype);
  cl_kernel k = dev_.kernel(name);
  set_args(k, a.w, cl_ulong{a.w_off}, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride},
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0});
  if (a.packed_rows) set_arg(k, 14, cl_uint{a.packed_rows});
  const size_t rows = a.row_end - a.row_begin;
  const size_t row_group = dev_.info().type == "gpu" ? 64 : 16;
  const size_t global[2] = {round_up(rows, row_group),
                            (a.tokens.count() + per_item - 1) / per_item};
  const size_t local[2] = {row_group, 1};
  return launch(name.c_str(), k, 2, global, local);
}

void GpuKernels::set_gemv_variant(const std::string& variant) {
  const bool known = std::any_of(std::begin(kGemvTuningVariants), std::end(kGemvTuningVariants),
                                 [&](const char* v) { return variant == v; });
  if (!variant.empty() && !known)
    throw Error(Errc::invalid_argument, "gpu_svc: no GEMV variant '" + variant + "'");
  if (!variant.empty()) {
    try {
      (void)dev_.kernel("gemv_vec_f32_" + variant);
    } catch (const Error&) {
      throw Error(Errc::invalid_argument,
                  "gpu_svc: GEMV variant '" + variant +
                      "' is a tuning variant, built only with DeviceOptions::gemv_tuning "
                      "(gpu_bench --gemv-variants opens its device so)");
    }
  }
  gemv_variant_ = variant;
}

// The GPU GEMV, one token per work-group column. The fast kernels need 16-byte aligned rows:
// packed tensors have them (the runner packs only 16-byte aligned ones), F16/F32 rows have them
// when the tensor does (k is a multiple of 32); other tensors take the file-layout kernels.
std::optional<GpuKernels::GemvPick> GpuKernels::gemv_pick(const MatmulArgs& a) const {
  if (!coop_gemv_ || a.tokens.count() > 4) return std::nullopt;
  GemvPick g;
  if (dtype_is_k_quant(a.wtype)) {
    // matmul_kq: the integer path first; its argument errors are its own to throw.
    if (int8_matmul_ || a.k % kQK_K != 0 || a.packed_rows) return std::nullopt;
    g.kernel = std::string("gemv_kq_") + kernel_type_suffix(a.wtype);
    g.siblings = "gemv_kq_siblings";
    g.group = 8 * 32;  // KQ_GEMV_ROWS rows in matmul_kq_gpu.cl, 32 work-items each
    g.rows_per_group = 8;
    return g;
  }
  // The GPU GEMV indexes packed blocks (Q8_0: 16-byte pieces) with 32 bits.
  if (uint64_t{a.packed_rows} * (a.k / kQK) * 2 >= (uint64_t{1} << 32)) return std::nullopt;
  const size_t rows = a.row_end > a.row_begin ? a.row_end - a.row_begin : 0;
  const bool plain_float = a.wtype == DType::F16 || a.wtype == DType::F32;
  // Measured on the H100 (bench/gpu/RESULTS.md): tall matrices want few lanes per row, the
  // others more lanes per row (more warps per SM); packed ones stage x in local memory.
  const bool tall = rows >= 16384;
  const std::string variant = !gemv_variant_.empty() ? gemv_variant_
                              : plain_float          ? (tall ? "l32r2" : "l128r4")
                                                     : (tall ? "l16r4x" : "l64r4x");
  if (a.packed_rows)
    g.kernel = std::string("gemv_packed_") + kernel_type_suffix(a.wtype) + "_" + variant;
  else if (plain_float && a.w_off % 16 == 0)
    g.kernel = std::string("gemv_vec_") + kernel_type_suffix(a.wtype) + "_" + variant;
  if (!g.kernel.empty()) {
    // "l<lanes>r<rows per lane group>[p|x]"
    const size_t lanes = std::stoul(variant.substr(1));
    g.group = kGemvLaneGroups * lanes;
    g.rows_per_group = kGemvLaneGroups * std::stoul(variant.substr(variant.find('r') + 1));
    g.takes_w_rows = true;
    // Sibling kernels exist for the choice by shape only (matmul_siblings_gpu.cl).
    if (gemv_variant_.empty()) g.siblings = g.kernel + "_siblings";
    return g;
  }
  if (a.wtype == DType::Q4_0) {
    g.kernel = "gemv_coop4_q4_0";
    g.group = 8 * 32;  // GEMV4_ROWS rows, 32 work-items each
    g.rows_per_group = 8;
  } else {
    g.kernel = std::string("gemv_coop_") + kernel_type_suffix(a.wtype);
    g.group = size_t{kGemvRows} * kGemvLanes;
    g.rows_per_group = kGemvRows;
  }
  if (a.wtype == DType::Q4_0 || a.wtype == DType::Q8_0 || plain_float)
    g.siblings = g.kernel + "_siblings";
  return g;
}

cl_event GpuKernels::gemv_gpu(cl_mem arena, const MatmulArgs& a, const GemvPick& g) {
  forget_quantized_input();
  cl_kernel k = dev_.kernel(g.kernel);
  set_args(k, a.w, cl_ulong{a.w_off}, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride},
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0});
  if (g.takes_w_rows) set_arg(k, 14, cl_uint{a.packed_rows ? a.packed_rows : a.row_end});
  const size_t rows = a.row_end > a.row_begin ? a.row_end - a.row_begin : 0;
  const size_t global[2] = {(rows + g.rows_per_group - 1) / g.rows_per_group * g.group,
                            a.tokens.count()};
  const size_t local[2] = {g.group, 1};
  return launch(g.kernel.c_str(), k, 2, global, local);
}

}  // namespace duet::gpu
