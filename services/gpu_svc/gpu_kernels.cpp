#include "services/gpu_svc/gpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "services/gpu_svc/weight_pack.h"

namespace duet::gpu {
namespace {

struct LocalBytes {
  size_t n;
};

void set_arg(cl_kernel k, cl_uint i, const LocalBytes& v) {
  check_cl(clSetKernelArg(k, i, v.n, nullptr), "clSetKernelArg(local)");
}
template <typename T>
void set_arg(cl_kernel k, cl_uint i, const T& v) {
  check_cl(clSetKernelArg(k, i, sizeof(T), &v), "clSetKernelArg");
}
template <typename... A>
void set_args(cl_kernel k, const A&... a) {
  cl_uint i = 0;
  (set_arg(k, i++, a), ...);
}

size_t round_up(size_t v, size_t m) {
  return (v + m - 1) / m * m;
}

}  // namespace

const char* kernel_type_suffix(DType t) {
  switch (t) {
    case DType::Q4_0:
      return "q4_0";
    case DType::Q8_0:
      return "q8_0";
    case DType::F16:
      return "f16";
    case DType::F32:
      return "f32";
  }
  throw Error(Errc::unsupported,
              "gpu_svc kernels do not read weight type " + std::to_string(static_cast<int>(t)));
}

cl_event GpuKernels::launch(const char* name, cl_kernel k, cl_uint dims, const size_t* global,
                            const size_t* local) {
  for (cl_uint d = 0; d < dims; ++d)
    if (global[d] == 0) {  // an empty range: nothing to run, but callers still get an event
      cl_event e = nullptr;
      check_cl(clEnqueueMarkerWithWaitList(dev_.queue(), 0, nullptr, &e),
               "clEnqueueMarkerWithWaitList");
      return e;
    }
  cl_event e = nullptr;
  const cl_int err =
      clEnqueueNDRangeKernel(dev_.queue(), k, dims, nullptr, global, local, 0, nullptr, &e);
  if (err != CL_SUCCESS)
    throw Error(Errc::internal,
                std::string("enqueue of kernel ") + name + " failed: " + cl_error_name(err));
  return e;
}

cl_event GpuKernels::embed(cl_mem arena, DType wtype, cl_mem w, uint64_t w_off, uint32_t cols,
                           uint64_t tok_off, uint64_t out_off, uint32_t out_stride, TokenRange t,
                           uint32_t packed_rows) {
  const std::string name =
      std::string(packed_rows ? "embed_packed_" : "embed_") + kernel_type_suffix(wtype);
  cl_kernel k = dev_.kernel(name);
  set_args(k, w, cl_ulong{w_off}, cl_uint{cols}, cl_ulong{tok_off}, arena, cl_ulong{out_off},
           cl_uint{out_stride}, cl_uint{t.begin});
  if (packed_rows) set_arg(k, 8, cl_uint{packed_rows});
  const size_t global[2] = {cols / static_cast<size_t>(kQK), t.count()};
  return launch(name.c_str(), k, 2, global, nullptr);
}

cl_event GpuKernels::rmsnorm(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint64_t out_off,
                             uint32_t out_stride, cl_mem w, uint64_t w_off, uint32_t dim, float eps,
                             TokenRange t) {
  cl_kernel k = dev_.kernel("rmsnorm");
  // A power of two no larger than the row or the device's work-group limit.
  size_t lsz = dev_.info().type == "gpu" ? 256 : 16;
  while (lsz > 1 && (lsz > dev_.info().max_work_group || lsz > dim)) lsz /= 2;
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_ulong{out_off}, cl_uint{out_stride}, w,
           cl_ulong{w_off}, cl_uint{dim}, cl_float{eps}, cl_uint{t.begin},
           LocalBytes{lsz * sizeof(float)});
  const size_t global[2] = {lsz, t.count()};
  const size_t local[2] = {lsz, 1};
  return launch("rmsnorm", k, 2, global, local);
}

cl_event GpuKernels::rope(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t n_heads,
                          uint32_t head_dim, float freq_base, uint64_t tok_off, TokenRange t) {
  cl_kernel k = dev_.kernel("rope");
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_uint{head_dim}, cl_float{freq_base},
           cl_ulong{tok_off}, cl_uint{t.begin});
  const size_t global[3] = {head_dim / 2u, n_heads, t.count()};
  return launch("rope", k, 3, global, nullptr);
}

cl_event GpuKernels::swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                            uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                            TokenRange t) {
  cl_kernel k = dev_.kernel("swiglu");
  set_args(k, arena, cl_ulong{g_off}, cl_uint{g_stride}, cl_ulong{u_off}, cl_uint{u_stride},
           cl_ulong{out_off}, cl_uint{out_stride}, cl_uint{t.begin});
  const size_t global[2] = {cols, t.count()};
  return launch("swiglu", k, 2, global, nullptr);
}

cl_event GpuKernels::add(cl_mem arena, uint64_t a_off, uint32_t a_stride, uint64_t b_off,
                         uint32_t b_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                         TokenRange t) {
  cl_kernel k = dev_.kernel("add");
  set_args(k, arena, cl_ulong{a_off}, cl_uint{a_stride}, cl_ulong{b_off}, cl_uint{b_stride},
           cl_ulong{out_off}, cl_uint{out_stride}, cl_uint{t.begin});
  const size_t global[2] = {cols, t.count()};
  return launch("add", k, 2, global, nullptr);
}

// CPU devices (PoCL): the GEMV runs one row per work-item (matmul_t1_*), the GEMM tiles of
// kCpuGemmRows rows x kCpuGemmTokens tokens per work-item (matmul_cpu_gemm_*, matmul.cl).
cl_event GpuKernels::matmul_cpu(cl_mem arena, const MatmulArgs& a) {
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

cl_event GpuKernels::matmul(cl_mem arena, const MatmulArgs& a) {
  if (a.packed_rows && !has_packed_layout(a.wtype))
    throw Error(Errc::invalid_argument, std::string("gpu_svc: no packed layout for ") +
                                            kernel_type_suffix(a.wtype) + " weights");
  // The GPU GEMV indexes packed blocks (Q8_0: 16-byte pieces) with 32 bits.
  const bool small_enough = uint64_t{a.packed_rows} * (a.k / kQK) * 2 < (uint64_t{1} << 32);
  if (coop_gemv_ && a.tokens.count() <= 4 && small_enough) return gemv_gpu(arena, a);
  if (!a.packed_rows && dev_.info().type == "cpu") return matmul_cpu(arena, a);
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
  const bool known = std::any_of(std::begin(kGemvVariants), std::end(kGemvVariants),
                                 [&](const char* v) { return variant == v; });
  if (!variant.empty() && !known)
    throw Error(Errc::invalid_argument, "gpu_svc: no GEMV variant '" + variant + "'");
  gemv_variant_ = variant;
}

// The GPU GEMV, one token per work-group column. The fast kernels need 16-byte aligned rows:
// packed tensors have them (the runner packs only 16-byte aligned ones), F16/F32 rows have them
// when the tensor does (k is a multiple of 32); other tensors take the file-layout kernels.
cl_event GpuKernels::gemv_gpu(cl_mem arena, const MatmulArgs& a) {
  const size_t rows = a.row_end - a.row_begin;
  const bool plain_float = a.wtype == DType::F16 || a.wtype == DType::F32;
  // Measured on the H100 (bench/gpu/RESULTS.md): tall matrices want few lanes per row, the
  // others more lanes per row (more warps per SM); packed ones stage x in local memory.
  const bool tall = rows >= 16384;
  const std::string variant = !gemv_variant_.empty() ? gemv_variant_
                              : plain_float          ? (tall ? "l32r2" : "l128r4")
                                                     : (tall ? "l16r4x" : "l64r4x");
  std::string name;
  if (a.packed_rows)
    name = std::string("gemv_packed_") + kernel_type_suffix(a.wtype) + "_" + variant;
  else if (plain_float && a.w_off % 16 == 0)
    name = std::string("gemv_vec_") + kernel_type_suffix(a.wtype) + "_" + variant;
  cl_kernel k = dev_.kernel(name.empty() ? a.wtype == DType::Q4_0 ? std::string("gemv_coop4_q4_0")
                                                                  : std::string("gemv_coop_") +
                                                                        kernel_type_suffix(a.wtype)
                                         : name);
  set_args(k, a.w, cl_ulong{a.w_off}, cl_uint{a.k}, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride},
           cl_ulong{a.y_off}, cl_uint{a.y_stride}, cl_uint{a.row_begin}, cl_uint{a.row_end},
           cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, cl_ulong{a.tok_off},
           cl_int{a.rows_from_table ? 1 : 0});
  if (!name.empty()) {
    set_arg(k, 14, cl_uint{a.packed_rows ? a.packed_rows : a.row_end});
    // "l<lanes>r<rows per lane group>[p|x]"
    const size_t lanes = std::stoul(variant.substr(1));
    const size_t rows_per_group =
        kGemvLaneGroups * std::stoul(variant.substr(variant.find('r') + 1));
    const size_t global[2] = {
        (rows + rows_per_group - 1) / rows_per_group * kGemvLaneGroups * lanes, a.tokens.count()};
    const size_t local[2] = {kGemvLaneGroups * lanes, 1};
    return launch(name.c_str(), k, 2, global, local);
  }
  if (a.wtype == DType::Q4_0) {
    const size_t global[2] = {round_up(rows, 8) * 32, a.tokens.count()};
    const size_t local[2] = {8 * 32, 1};
    return launch("gemv_coop4_q4_0", k, 2, global, local);
  }
  const size_t global[2] = {round_up(rows, kGemvRows) * kGemvLanes, a.tokens.count()};
  const size_t local[2] = {kGemvRows * kGemvLanes, 1};
  return launch("gemv_coop", k, 2, global, local);
}

cl_event GpuKernels::copy(cl_mem src, cl_mem dst, size_t bytes) {
  cl_kernel k = dev_.kernel("copy_f32");
  set_args(k, src, dst);
  const size_t global[1] = {bytes / 64};
  return launch("copy_f32", k, 1, global, nullptr);
}

cl_event GpuKernels::kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                              uint32_t v_stride, const KvArgs& kv, uint64_t tok_off, TokenRange t) {
  cl_kernel k = dev_.kernel("kv_write");
  set_args(k, arena, cl_ulong{k_off}, cl_uint{k_stride}, cl_ulong{v_off}, cl_uint{v_stride}, kv.kv,
           cl_ulong{kv.pages_offset}, cl_ulong{kv.page_bytes}, cl_uint{kv.page_tokens},
           cl_uint{kv.kv_dim}, cl_uint{kv.layer}, cl_ulong{tok_off}, cl_ulong{kv.page_table_off},
           cl_uint{kv.page_table_cols}, cl_uint{t.begin});
  const size_t global[2] = {kv.kv_dim, t.count()};
  return launch("kv_write", k, 2, global, nullptr);
}

cl_event GpuKernels::attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                               uint32_t out_stride, const KvArgs& kv, uint64_t tok_off,
                               uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                               TokenRange t) {
  cl_kernel k = dev_.kernel("attention");
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  set_args(k, arena, cl_ulong{q_off}, cl_uint{q_stride}, cl_ulong{out_off}, cl_uint{out_stride},
           kv.kv, cl_ulong{kv.pages_offset}, cl_ulong{kv.page_bytes}, cl_uint{kv.page_tokens},
           cl_uint{kv.kv_dim}, cl_uint{kv.layer}, cl_ulong{tok_off}, cl_ulong{kv.page_table_off},
           cl_uint{kv.page_table_cols}, cl_uint{n_heads}, cl_uint{n_kv_heads}, cl_uint{head_dim},
           cl_float{scale}, cl_uint{t.begin});
  const size_t global[2] = {n_heads, t.count()};
  return launch("attention", k, 2, global, nullptr);
}

}  // namespace duet::gpu
