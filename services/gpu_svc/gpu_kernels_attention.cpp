// GpuKernels' attention and KV launches: the KV row write, the chunk split of the keys, the
// partials buffer, the choice of attention kernel and its launch.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/kernel_args.h"

namespace duet::gpu {

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
  if (chain_recording() && t.count() == 1) {
    chain_kv_write(arena, k_off, k_stride, v_off, v_stride, kv, kv_units(kv), tok_off, t.begin);
    return nullptr;
  }
  cl_kernel k = dev_.kernel(name);
  set_args(k, arena, cl_ulong{k_off}, cl_uint{k_stride}, cl_ulong{v_off}, cl_uint{v_stride}, kv.kv,
           cl_ulong{kv.pages_offset}, cl_ulong{kv.page_bytes}, cl_uint{kv.page_tokens},
           cl_uint{kv_units(kv)}, cl_uint{kv.layer}, cl_ulong{tok_off}, cl_ulong{kv.page_table_off},
           cl_uint{kv.page_table_cols}, cl_uint{t.begin});
  const size_t global[2] = {kv_units(kv), t.count()};
  return launch(name.c_str(), k, 2, global, nullptr);
}

uint32_t GpuKernels::attention_chunk_keys(uint32_t n_keys) const {
  const uint32_t chunks = std::clamp(n_keys / attn_min_chunk_keys_, 1u, kAttnMaxChunks);
  return std::max(((n_keys + chunks - 1) / chunks + 15) & ~15u, 16u);
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

uint32_t GpuKernels::attention_chunk_slots(uint32_t max_keys) const {
  // attention_chunk_keys' target count, which grows with the keys and bounds the actual count
  return std::clamp(max_keys / attn_min_chunk_keys_, 1u, kAttnMaxChunks);
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
  // GPUs: a work-group per (head, token, chunk), keys read 8 values at a time.
  if (head_dim % 8 == 0 &&
      (attention_kernel_ == AttentionKernel::work_group ||
       (!attention_cpu_available_ && attention_kernel_ != AttentionKernel::portable)))
    return "attention_split_wg_" + type;
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
  // attention.cl's work-group kernels run ATTN_WG work-items a (head, token, chunk), and their
  // merge as many a (head, token).
  const bool work_group = split.rfind("attention_split_wg_", 0) == 0;
  const size_t group = work_group ? kAttnWorkGroup : 1;
  const size_t local[3] = {group, 1, 1};
  // The shared CPU kernel and its merge run a work-item a work-group (each serves its own KV
  // head: no rows to share in cache). launch()'s pinned CPU group made a group of every KV head
  // of a (token, chunk): a decode token at 64 keys was one group, one thread's work, and at 513
  // keys three (256, 256 and 1 keys), of which PoCL deals the first thread ceil(3 / 2) = 2.
  const bool pick_local = work_group || split.rfind("attention_gqa_cpu_", 0) == 0;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const uint32_t chunks = attention_chunk_slots(max_keys);
  const size_t per_token = attention_partials_per_token(n_heads, head_dim);
  if (chain_recording() && t.count() == 1) {
    // The CPU kernels are functions of their work-item's indices that a step chain calls too.
    uint32_t variant = 3;  // step_chain_cpu.cl's kernel code, 3: not chained
    if (split.rfind("attention_split_cpu_", 0) == 0) variant = 0;
    if (split.rfind("attention_gqa_cpu_", 0) == 0 && split.ends_with("_4x4")) variant = 1;
    if (split.rfind("attention_gqa_cpu_", 0) == 0 && split.ends_with("_8x2")) variant = 2;
    if (variant < 3) {
      chain_attention(arena, q_off, q_stride, out_off, out_stride, kv, kv_units(kv), tok_off,
                      n_heads, n_kv_heads, head_dim, scale, t.begin, variant,
                      n_heads / heads_per_item, chunks);
      return nullptr;
    }
  }
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
    const size_t global[3] = {n_heads / heads_per_item * group, count, chunks};
    last = launch(split.c_str(), k, 3, global, pick_local ? local : nullptr);
    if (first && !*first) {
      *first = last;
      clRetainEvent(*first);  // its own reference: `last` moves on
    }
    if (chunks > 1) {
      clReleaseEvent(last);
      const char* merge = work_group ? "attention_merge_wg" : "attention_merge";
      cl_kernel m = dev_.kernel(merge);
      set_args(m, arena, cl_ulong{out_off}, cl_uint{out_stride}, cl_ulong{tok_off},
               cl_uint{n_heads}, cl_uint{head_dim}, cl_uint{b}, attn_partials_,
               cl_uint{attn_min_chunk_keys_}, cl_uint{kAttnMaxChunks});
      const size_t merge_global[2] = {n_heads * group, count};
      last = launch(merge, m, 2, merge_global, pick_local ? local : nullptr);
    }
    b += count;
  } while (b < t.end);
  if (first && *first == last) clReleaseEvent(*first);  // one event, one reference
  return last;
}

}  // namespace duet::gpu
