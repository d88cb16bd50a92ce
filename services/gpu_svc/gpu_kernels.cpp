// Over 600 lines (issue 26): the launch of every kernel (one wrapper each); split (matmul /
// attention and KV) once the branches editing it this session have merged.
#include "services/gpu_svc/gpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <stdexcept>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "services/gpu_svc/kernel_args.h"
#include "services/gpu_svc/tiled_weights.h"
#include "services/gpu_svc/weight_pack.h"

namespace duet::gpu {
namespace {

bool host_has_vnni() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

bool env_off(const char* name) {
  return setting_text(name) == "0";
}

// PoCL's own choice (pocl_default_local_size_optimizer) of a group along one dimension of
// `global` items: the largest divisor that is a multiple of gcd(global, the preferred multiple,
// >= 1)
// and fits the device's group limit, then split until there is a group per compute unit, as long
// as a group keeps at least 4 preferred multiples.
size_t cpu_group_size(size_t global, size_t multiple, size_t max_group, size_t compute_units) {
  const size_t grain = std::gcd(multiple, global);
  size_t units = std::min(global, std::max<size_t>(max_group, 1)) / grain;
  while (units > 1 && (global / grain) % units != 0) --units;
  size_t group = std::max<size_t>(units, 1) * grain;
  const size_t min_group = std::min(4 * multiple, max_group);
  for (;;) {
    size_t splits = compute_units / (global / group);
    if (splits <= 1 || group < splits * min_group) break;
    while (splits > 1 && !(group % splits == 0 && (group / splits) % grain == 0)) --splits;
    if (splits <= 1) break;
    group /= splits;
  }
  return group;
}

}  // namespace

GpuKernels::GpuKernels(ClDevice& dev) : dev_(dev), coop_gemv_(dev.info().type == "gpu") {
  int8_matmul_ = !env_off("DUET_GPU_INT8_MATMUL") && int8_kernels_available();
  int8_vnni_ = int8_matmul_ && !env_off("DUET_GPU_INT8_VNNI") && host_has_vnni();
  if (dev_.info().type == "cpu") {
    // PoCL reports its device-wide multiple for every kernel; its own group choice uses that.
    check_cl(clGetKernelWorkGroupInfo(dev_.kernel("add"), dev_.id(),
                                      CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                      sizeof cpu_group_multiple_, &cpu_group_multiple_, nullptr),
             "clGetKernelWorkGroupInfo");
    cpu_group_multiple_ = std::max<size_t>(cpu_group_multiple_, 1);
    try {
      dev_.kernel("attention_split_cpu_f16");
      attention_cpu_available_ = true;
    } catch (const Error&) {  // built by clang only (attention.cl)
    }
  }
  // The attention kernel family (set_attention_kernel): shared (default), per_head, portable;
  // for side-by-side runs of a whole stack (bench/longctx). Checked by the registry.
  if (const std::string v = setting_text("DUET_GPU_ATTENTION"); v == "per_head")
    attention_kernel_ = AttentionKernel::per_head;
  else if (v == "portable")
    attention_kernel_ = AttentionKernel::portable;
  if (const auto e = setting_override("DUET_GPU_INT8_ACT_BITS")) {
    try {
      set_int8_act_bits(*e);
    } catch (const Error& err) {
      throw Error(Errc::invalid_argument, "DUET_GPU_INT8_ACT_BITS='" + *e + "': " + err.what());
    }
  }
}

GpuKernels::~GpuKernels() {
  if (int8_tiles_) clReleaseMemObject(int8_tiles_);
  if (attn_partials_) clReleaseMemObject(attn_partials_);
}

// matmul_int8.cl is built for clang's x86 targets only, and only a CPU device shares the
// host's instruction set (the VNNI kernels are chosen by the host's CPU).
bool GpuKernels::int8_kernels_available() {
  if (dev_.info().type != "cpu") return false;
  try {
    dev_.kernel("quantize_q8_act");
    return true;
  } catch (const Error&) {
    return false;
  }
}

void GpuKernels::set_int8_matmul(bool on) {
  if (on && !int8_kernels_available())
    throw Error(Errc::unsupported, "gpu_svc: no integer matmul path on device " + dev_.info().name +
                                       " (CPU devices on x86 only)");
  int8_matmul_ = on;
}

// 16 bits for every role by default: any role at 8 bits flips a clear-margin reference token
// in some plan (gpu_kernels.h, bench/gpu/RESULTS.md).
std::array<int, kMatmulRoles> GpuKernels::default_int8_act_bits() {
  std::array<int, kMatmulRoles> bits{};
  bits.fill(16);
  return bits;
}

void GpuKernels::set_int8_act_bits(MatmulRole role, int bits) {
  if (bits != 8 && bits != 16)
    throw Error(
        Errc::invalid_argument,
        "gpu_svc: integer matmul activation bits must be 8 or 16, not " + std::to_string(bits));
  int8_act_bits_.at(static_cast<size_t>(role)) = bits;
}

void GpuKernels::set_int8_act_bits(int bits) {
  for (int r = 0; r < kMatmulRoles; ++r) set_int8_act_bits(static_cast<MatmulRole>(r), bits);
}

int GpuKernels::int8_act_bits() const {
  return *std::max_element(int8_act_bits_.begin(), int8_act_bits_.end());
}

void GpuKernels::set_int8_act_bits(const std::string& spec) {
  const auto parse_bits = [&](const std::string& v) {
    if (v != "8" && v != "16")
      throw Error(Errc::invalid_argument,
                  "gpu_svc: integer matmul activation bits must be 8 or 16, not '" + v + "'");
    return std::stoi(v);
  };
  std::array<int, kMatmulRoles> bits = int8_act_bits_;  // all or nothing
  size_t at = 0;
  while (at <= spec.size()) {  // items in order: "bits" (every role) or "role=bits"
    const size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, end - at);
    at = end + 1;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      bits.fill(parse_bits(item));
      continue;
    }
    const std::string role = item.substr(0, eq);
    int r = 0;
    while (r < kMatmulRoles && matmul_role_name(static_cast<MatmulRole>(r)) != role) ++r;
    if (r == kMatmulRoles)
      throw Error(Errc::invalid_argument,
                  "gpu_svc: no matmul role '" + role + "' (q k v o gate up down logits)");
    bits[static_cast<size_t>(r)] = parse_bits(item.substr(eq + 1));
  }
  int8_act_bits_ = bits;
}

void GpuKernels::set_int8_vnni(bool on) {
  if (on && !host_has_vnni())
    throw Error(Errc::unsupported, "gpu_svc: this CPU has no AVX-512 VNNI");
  int8_vnni_ = on;
}

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
    case DType::Q4_K:
      return "q4_k";
    case DType::Q5_K:
      return "q5_k";
    case DType::Q6_K:
      return "q6_k";
    case DType::Q4_1:  // fp32 kernels only (matmul_qx.cl)
      return "q4_1";
    case DType::Q5_0:
      return "q5_0";
    case DType::Q5_1:
      return "q5_1";
    case DType::E0M4:  // fp32 kernels only (matmul_qx_e0m4.cl)
      return "e0m4";
    default:  // BF16 has no gpu_svc kernels yet
      break;
  }
  throw Error(Errc::unsupported, "gpu_svc kernels do not read weight type " +
                                     std::string(dtype_name(t)) + " (" +
                                     std::to_string(static_cast<int>(t)) + ")");
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
  // PoCL compiles a kernel again for every work-group size it is launched with (LLVM, at the
  // first such launch: 0.1-3 s a kernel). Left to choose, it makes a group of the whole token
  // dimension, so each step token count not seen before on the machine recompiled every kernel
  // without a fixed group: serving stalled 3 s in a step the first time it held, say, 57 tokens.
  // On a CPU device those launches get a pinned group instead: 1 along the tokens (the last
  // dimension), and along the first the size PoCL itself picks for a one-token launch (one group
  // per core where the groups stay large enough), so decode runs as before and a kernel compiles
  // once per model. GPU drivers do not recompile per group size: they keep choosing.
  size_t pinned[3] = {1, 1, 1};
  if (!local && cpu_group_multiple_ > 0 && dims >= 2) {
    pinned[0] = cpu_group_size(global[0], cpu_group_multiple_, dev_.info().max_work_group,
                               static_cast<size_t>(dev_.info().compute_units));
    local = pinned;
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
  forget_quantized_input();
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
  forget_quantized_input();
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
                          uint32_t head_dim, const RopeArgs& r, uint64_t tok_off, TokenRange t) {
  forget_quantized_input();
  const cl_uint has_ff = r.has_factors ? 1 : 0;
  if (dev_.info().type == "cpu") {  // the frequency once per pair, the angle once per token
    cl_kernel k = dev_.kernel("rope_heads");
    set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_uint{head_dim}, cl_float{r.freq_base},
             cl_ulong{tok_off}, cl_uint{t.begin}, cl_uint{n_heads}, cl_uint{t.count()},
             cl_float{r.freq_scale}, cl_uint{r.mode}, r.w, cl_ulong{r.factors_off}, has_ff);
    const size_t global[2] = {head_dim / 2u,
                              (t.count() + kRopeTokensPerItem - 1) / kRopeTokensPerItem};
    return launch("rope_heads", k, 2, global, nullptr);
  }
  cl_kernel k = dev_.kernel("rope");
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_uint{head_dim}, cl_float{r.freq_base},
           cl_ulong{tok_off}, cl_uint{t.begin}, cl_float{r.freq_scale}, cl_uint{r.mode}, r.w,
           cl_ulong{r.factors_off}, has_ff);
  const size_t global[3] = {head_dim / 2u, n_heads, t.count()};
  return launch("rope", k, 3, global, nullptr);
}

cl_event GpuKernels::add_bias(cl_mem arena, uint64_t x_off, uint32_t x_stride, cl_mem w,
                              uint64_t b_off, uint32_t cols, TokenRange t) {
  forget_quantized_input();
  cl_kernel k = dev_.kernel("add_bias");
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, w, cl_ulong{b_off}, cl_uint{t.begin});
  const size_t global[2] = {cols, t.count()};
  return launch("add_bias", k, 2, global, nullptr);
}

namespace {

// A kernel of elementwise.cl that combines two arena tensors into a third (swiglu, add), its
// arguments set, and its range: a work-item per column and token.
struct ElementwiseLaunch {
  cl_kernel kernel;
  size_t global[2];
};

ElementwiseLaunch elementwise2(ClDevice& dev, const char* name, cl_mem arena, uint64_t a_off,
                               uint32_t a_stride, uint64_t b_off, uint32_t b_stride,
                               uint64_t out_off, uint32_t out_stride, uint32_t cols, TokenRange t) {
  cl_kernel k = dev.kernel(name);
  set_args(k, arena, cl_ulong{a_off}, cl_uint{a_stride}, cl_ulong{b_off}, cl_uint{b_stride},
           cl_ulong{out_off}, cl_uint{out_stride}, cl_uint{t.begin});
  return {k, {cols, t.count()}};
}

}  // namespace

cl_event GpuKernels::swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                            uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                            TokenRange t) {
  if (int8_matmul_ && cols % kQK == 0) {
    // CPU devices with the integer path: by 32-value blocks, the bits of the fused swiglu_q8
    // (kernels/matmul_int8.cl), so a step's tokens do not depend on what fused.
    forget_quantized_input();
    cl_kernel k = dev_.kernel("swiglu_blocks");
    set_args(k, arena, cl_ulong{g_off}, cl_uint{g_stride}, cl_ulong{u_off}, cl_uint{u_stride},
             cl_ulong{out_off}, cl_uint{out_stride}, cl_uint{cols}, cl_uint{t.begin},
             cl_uint{t.end});
    const size_t global[2] = {cols / static_cast<size_t>(kQK), t.count()};
    return launch("swiglu_blocks", k, 2, global, nullptr);
  }
  return binary("swiglu", arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, cols, t);
}

cl_event GpuKernels::add(cl_mem arena, uint64_t a_off, uint32_t a_stride, uint64_t b_off,
                         uint32_t b_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                         TokenRange t) {
  return binary("add", arena, a_off, a_stride, b_off, b_stride, out_off, out_stride, cols, t);
}

cl_event GpuKernels::geglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                           uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                           TokenRange t) {
  return binary("geglu", arena, g_off, g_stride, u_off, u_stride, out_off, out_stride, cols, t);
}

cl_event GpuKernels::binary(const char* name, cl_mem arena, uint64_t a_off, uint32_t a_stride,
                            uint64_t b_off, uint32_t b_stride, uint64_t out_off,
                            uint32_t out_stride, uint32_t cols, TokenRange t) {
  forget_quantized_input();
  const ElementwiseLaunch l = elementwise2(dev_, name, arena, a_off, a_stride, b_off, b_stride,
                                           out_off, out_stride, cols, t);
  return launch(name, l.kernel, 2, l.global, nullptr);
}

cl_event GpuKernels::scale(cl_mem arena, uint64_t x_off, uint32_t x_stride, float s, uint32_t cols,
                           TokenRange t) {
  forget_quantized_input();
  cl_kernel k = dev_.kernel("scale_rows");
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_float{s}, cl_uint{t.begin});
  const size_t global[2] = {cols, t.count()};
  return launch("scale_rows", k, 2, global, nullptr);
}

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
// One token takes the T = 1 kernel (no tile to fill), more the 8-token tile: the same bits.
cl_event GpuKernels::matmul_int8(cl_mem arena, const MatmulArgs& a) {
  const uint32_t n = a.tokens.count();
  if (n == 0 || a.row_end <= a.row_begin) {
    const size_t none[1] = {0};
    return launch("matmul_i8", nullptr, 1, none, nullptr);
  }
  const auto [bits, zp_shift] = int8_bits_zp(a);
  quantize_int8_input(arena, a, bits, zp_shift);

  // 8-token tiles measured best of 8, 12 and 16 (bench/gpu/RESULTS.md).
  constexpr size_t kRowsPerItem = kTiledRows;  // matmul_int8.cl: a work-item is a 16-row group
  const size_t tokens_per_item = n == 1 ? 1 : kInt8TileTokens;
  const std::string name = std::string("matmul_i8_") + kernel_type_suffix(a.wtype) + "_t" +
                           std::to_string(tokens_per_item) + (int8_vnni_ ? "_vnni" : "_portable") +
                           "_a" + std::to_string(bits) + (a.tiled ? "_tiled" : "_file");
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
  if (!(reuse_quantized_ && quantized_ == input)) {
    cl_kernel qk = dev_.kernel("quantize_q8_act");
    set_args(qk, arena, cl_ulong{a.x_off}, cl_uint{a.x_stride}, cl_uint{a.k},
             cl_uint{a.tokens.begin}, cl_uint{a.tokens.end}, int8_tiles_,
             cl_uint{static_cast<uint32_t>(bits)}, cl_uint{zp_shift});
    const size_t qglobal[2] = {a.k / static_cast<size_t>(kQK), n};
    clReleaseEvent(launch("quantize_q8_act", qk, 2, qglobal, nullptr));
    quantized_ = input;
  }
  // The output may overwrite the input rows (or, for Logits, rows we do not bound here).
  const uint64_t x_begin = a.x_off + uint64_t{a.tokens.begin} * a.x_stride * 4,
                 x_end = a.x_off + uint64_t{a.tokens.end} * a.x_stride * 4,
                 y_begin = a.y_off + uint64_t{a.tokens.begin} * a.y_stride * 4,
                 y_end = a.y_off + uint64_t{a.tokens.end} * a.y_stride * 4;
  if (a.rows_from_table || (y_begin < x_end && x_begin < y_end)) forget_quantized_input();
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
  // The GPU GEMV indexes packed blocks (Q8_0: 16-byte pieces) with 32 bits.
  const bool small_enough = uint64_t{a.packed_rows} * (a.k / kQK) * 2 < (uint64_t{1} << 32);
  if (coop_gemv_ && a.tokens.count() <= 4 && small_enough) return gemv_gpu(arena, a);
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
cl_event GpuKernels::gemv_gpu(cl_mem arena, const MatmulArgs& a) {
  forget_quantized_input();
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
  forget_quantized_input();
  cl_kernel k = dev_.kernel("copy_f32");
  set_args(k, src, dst);
  const size_t global[1] = {bytes / 64};
  return launch("copy_f32", k, 1, global, nullptr);
}

namespace {

const char* kv_type_suffix(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::Q8_0:
      return "q8_0";
    default:
      throw Error(Errc::unsupported,
                  "gpu_svc: KV values of type " + std::string(dtype_name(t)) + " (f32, f16, q8_0)");
  }
}

// Units of a KV row (attention.cl's kv_units): values, or 32-value blocks for Q8_0.
uint32_t kv_units(const KvArgs& kv) {
  return kv.value_type == DType::Q8_0 ? kv.kv_dim / 32 : kv.kv_dim;
}

// Query heads one work-item of a split kernel serves: the GQ of attention_gqa_cpu_*_NVxGQ.
uint32_t shared_heads_per_item(const std::string& kernel) {
  if (kernel.rfind("attention_gqa_cpu_", 0) != 0) return 1;
  return static_cast<uint32_t>(std::stoul(kernel.substr(kernel.rfind('x') + 1)));
}

size_t attention_partials_per_token(uint32_t n_heads, uint32_t head_dim) {
  return size_t{n_heads} * GpuKernels::kAttnMaxChunks * (head_dim + 2) * sizeof(float);
}

}  // namespace

cl_event GpuKernels::kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                              uint32_t v_stride, const KvArgs& kv, uint64_t tok_off, TokenRange t) {
  forget_quantized_input();
  const std::string name = kv.value_type == DType::F32
                               ? "kv_write"
                               : std::string("kv_write_") + kv_type_suffix(kv.value_type);
  cl_kernel k = dev_.kernel(name);
  set_args(k, arena, cl_ulong{k_off}, cl_uint{k_stride}, cl_ulong{v_off}, cl_uint{v_stride}, kv.kv,
           cl_ulong{kv.pages_offset}, cl_ulong{kv.page_bytes}, cl_uint{kv.page_tokens},
           cl_uint{kv_units(kv)}, cl_uint{kv.layer}, cl_ulong{tok_off}, cl_ulong{kv.page_table_off},
           cl_uint{kv.page_table_cols}, cl_uint{t.begin});
  const size_t global[2] = {kv_units(kv), t.count()};
  return launch(name.c_str(), k, 2, global, nullptr);
}

uint32_t GpuKernels::attention_chunk_keys(uint32_t n_keys) const {
  const uint32_t per = ((n_keys + kAttnMaxChunks - 1) / kAttnMaxChunks + 15) & ~15u;
  return std::max(per, attn_min_chunk_keys_);
}

void GpuKernels::set_attention_min_chunk_keys(uint32_t keys) {
  if (keys == 0 || keys % 16 != 0)
    throw Error(Errc::invalid_argument, "gpu_svc: a least attention chunk of " +
                                            std::to_string(keys) + " keys (a multiple of 16)");
  attn_min_chunk_keys_ = keys;
}

uint32_t GpuKernels::attention_chunks(uint32_t n_keys) const {
  const uint32_t per = attention_chunk_keys(n_keys);
  return (n_keys + per - 1) / per;
}

void GpuKernels::reserve_attention(uint32_t n_heads, uint32_t head_dim, uint32_t max_tokens) {
  const size_t per_token = attention_partials_per_token(n_heads, head_dim);
  const size_t bytes =
      std::max<size_t>(per_token, std::min<size_t>(size_t{std::max(max_tokens, 1u)} * per_token,
                                                   kAttnScratchBytes / per_token * per_token));
  if (bytes <= attn_partials_bytes_) return;
  if (attn_partials_) clReleaseMemObject(attn_partials_);
  attn_partials_ = nullptr;
  attn_partials_bytes_ = 0;
  cl_int err = CL_SUCCESS;
  attn_partials_ = clCreateBuffer(dev_.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer(attention partials)");
  attn_partials_bytes_ = bytes;
}

std::string GpuKernels::attention_kernel_name(uint32_t n_heads, uint32_t n_kv_heads,
                                              uint32_t head_dim, DType kv_type) const {
  const std::string type = kv_type_suffix(kv_type);
  // CPU devices: the vectorised kernels (head_dim a multiple of 16, up to ATTN_CPU_VECS * 16)
  // where their compiler built them (clang: PoCL).
  if (!attention_cpu_available_ || attention_kernel_ == AttentionKernel::portable ||
      head_dim % 16 != 0 || head_dim > 128)
    return "attention_split_" + type;
  const uint32_t group = n_kv_heads ? n_heads / n_kv_heads : 0;
  if (attention_kernel_ == AttentionKernel::shared && group > 0) {
    // attention.cl's DEFINE_ATTENTION_GQA_CPU instances: (head_dim / 16) x heads a work-item.
    if (head_dim == 64 && group % 4 == 0) return "attention_gqa_cpu_" + type + "_4x4";
    if (head_dim == 128 && group % 2 == 0) return "attention_gqa_cpu_" + type + "_8x2";
  }
  return "attention_split_cpu_" + type;
}

cl_event GpuKernels::attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                               uint32_t out_stride, const KvArgs& kv, uint64_t tok_off,
                               uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                               TokenRange t, uint32_t max_keys, cl_event* first) {
  forget_quantized_input();
  if (first) *first = nullptr;
  if (kv.value_type == DType::Q8_0 && head_dim % 32 != 0)
    throw Error(Errc::unsupported, "gpu_svc: Q8_0 KV needs head_dim a multiple of 32, not " +
                                       std::to_string(head_dim));
  reserve_attention(n_heads, head_dim, t.count());
  const std::string split = attention_kernel_name(n_heads, n_kv_heads, head_dim, kv.value_type);
  const uint32_t heads_per_item = shared_heads_per_item(split);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const uint32_t chunks = attention_chunks(std::max(max_keys, 1u));
  const size_t per_token = attention_partials_per_token(n_heads, head_dim);
  const uint32_t batch = static_cast<uint32_t>(attn_partials_bytes_ / per_token);
  cl_event last = nullptr;
  uint32_t b = t.begin;
  do {
    const uint32_t count = std::min(batch, t.end - b);
    if (last) clReleaseEvent(last);
    cl_kernel k = dev_.kernel(split);
    set_args(k, arena, cl_ulong{q_off}, cl_uint{q_stride}, cl_ulong{out_off}, cl_uint{out_stride},
             kv.kv, cl_ulong{kv.pages_offset}, cl_ulong{kv.page_bytes}, cl_uint{kv.page_tokens},
             cl_uint{kv_units(kv)}, cl_uint{kv.layer}, cl_ulong{tok_off},
             cl_ulong{kv.page_table_off}, cl_uint{kv.page_table_cols}, cl_uint{n_heads},
             cl_uint{n_kv_heads}, cl_uint{head_dim}, cl_float{scale}, cl_uint{b}, attn_partials_,
             cl_uint{attn_min_chunk_keys_}, cl_uint{kAttnMaxChunks});
    const size_t global[3] = {n_heads / heads_per_item, count, chunks};
    last = launch(split.c_str(), k, 3, global, nullptr);
    if (first && !*first) {
      *first = last;
      clRetainEvent(*first);  // its own reference: `last` moves on
    }
    if (chunks > 1) {
      clReleaseEvent(last);
      cl_kernel m = dev_.kernel("attention_merge");
      set_args(m, arena, cl_ulong{out_off}, cl_uint{out_stride}, cl_ulong{tok_off},
               cl_uint{n_heads}, cl_uint{head_dim}, cl_uint{b}, attn_partials_,
               cl_uint{attn_min_chunk_keys_}, cl_uint{kAttnMaxChunks});
      const size_t merge_global[2] = {n_heads, count};
      last = launch("attention_merge", m, 2, merge_global, nullptr);
    }
    b += count;
  } while (b < t.end);
  if (first && *first == last) clReleaseEvent(*first);  // one event, one reference
  return last;
}

}  // namespace duet::gpu
