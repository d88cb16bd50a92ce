// GpuKernels' setup and the launches of the other kernels: the device choices (int8 path and its
// activation bits, CPU group sizes), the common launch, embedding, norms, RoPE, elementwise ops
// and copies.
// The matmuls are in gpu_kernels_matmul.cpp (K-quants in gpu_kernels_kq.cpp), attention and KV in
// gpu_kernels_attention.cpp, fused ops in gpu_kernels_fused.cpp.
#include "services/gpu_svc/gpu_kernels.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/base/error.h"
#include "core/base/settings.h"
#include "services/gpu_svc/kernel_args.h"

namespace duet::gpu {
namespace {

// AMX-INT8 in the CPU (as host_has_vnni asks), and the tile state granted to this process by
// Linux (5.16 on: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); without it the first tile
// instruction faults). Asked once; the grant is the whole process's, PoCL's worker threads
// included.
bool host_grants_amx() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool granted = [] {
    if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
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

GpuKernels::GpuKernels(ClDevice& dev)
    : dev_(dev),
      coop_gemv_(dev.info().type == "gpu"),
      gpu_kernels_(dev.info().type == "gpu"),
      attn_min_chunk_keys_(dev.info().type == "gpu" ? kAttnMinChunkKeysGpu : kAttnMinChunkKeys) {
  int8_matmul_ = !env_off("DUET_GPU_INT8_MATMUL") && int8_kernels_available();
  int8_vnni_ = int8_matmul_ && !env_off("DUET_GPU_INT8_VNNI") && host_has_vnni();
  int8_amx_ = int8_vnni_ && !env_off("DUET_GPU_INT8_AMX") && host_grants_amx();
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
  // The attention kernel family (set_attention_kernel): shared (default), per_head, portable,
  // work_group;
  // for side-by-side runs of a whole stack (bench/longctx). Checked by the registry.
  if (const std::string v = setting_text("DUET_GPU_ATTENTION"); v == "per_head")
    attention_kernel_ = AttentionKernel::per_head;
  else if (v == "portable")
    attention_kernel_ = AttentionKernel::portable;
  else if (v == "work_group")
    attention_kernel_ = AttentionKernel::work_group;
  if (const auto e = setting_override("DUET_GPU_INT8_ACT_BITS")) {
    try {
      set_int8_act_bits(*e);
    } catch (const Error& err) {
      throw Error(Errc::invalid_argument, "DUET_GPU_INT8_ACT_BITS='" + *e + "': " + err.what());
    }
  }
}

GpuKernels::~GpuKernels() {
  release_chain();
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

void GpuKernels::set_gpu_kernels(bool on) {
  gpu_kernels_ = on;
  coop_gemv_ = on;
  if (on) int8_matmul_ = int8_vnni_ = int8_amx_ = false;
  forget_quantized_input();
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

void GpuKernels::set_int8_isa(Int8Isa isa) {
  if (isa == Int8Isa::amx && !(host_has_vnni() && host_grants_amx()))
    throw Error(Errc::unsupported,
                "gpu_svc: no AMX-INT8 here (the CPU lacks it, or Linux refused the tile state)");
  set_int8_vnni(isa != Int8Isa::portable);
  int8_amx_ = isa == Int8Isa::amx;
}

const char* GpuKernels::int8_isa_name(Int8Isa isa) {
  return isa == Int8Isa::portable ? "portable" : isa == Int8Isa::vnni ? "vnni" : "amx";
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
  if (!chain_words_.empty()) flush_chain();  // what was recorded runs first
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
  ++launches_;
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
  const size_t lsz = rmsnorm_group(dim);
  set_args(k, arena, cl_ulong{x_off}, cl_uint{x_stride}, cl_ulong{out_off}, cl_uint{out_stride}, w,
           cl_ulong{w_off}, cl_uint{dim}, cl_float{eps}, cl_uint{t.begin},
           LocalBytes{lsz * sizeof(float)});
  const size_t global[2] = {lsz, t.count()};
  const size_t local[2] = {lsz, 1};
  return launch("rmsnorm", k, 2, global, local);
}

size_t GpuKernels::rmsnorm_group(uint32_t dim) const {
  // A power of two no larger than the row or the device's work-group limit.
  size_t lsz = gpu_kernels_ ? 256 : 16;
  while (lsz > 1 && (lsz > dev_.info().max_work_group || lsz > dim)) lsz /= 2;
  return lsz;
}

cl_event GpuKernels::rope(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t n_heads,
                          uint32_t head_dim, const RopeArgs& r, uint64_t tok_off, TokenRange t) {
  forget_quantized_input();
  const cl_uint has_ff = r.has_factors ? 1 : 0;
  if (dev_.info().type == "cpu" &&
      !gpu_kernels_) {  // the frequency once per pair, the angle once per token
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

cl_event GpuKernels::copy(cl_mem src, cl_mem dst, size_t bytes) {
  forget_quantized_input();
  cl_kernel k = dev_.kernel("copy_f32");
  set_args(k, src, dst);
  const size_t global[1] = {bytes / 64};
  return launch("copy_f32", k, 1, global, nullptr);
}

}  // namespace duet::gpu
