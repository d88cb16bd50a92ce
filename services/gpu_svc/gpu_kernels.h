#pragma once
// Host side of the kernels: one function per op, enqueueing on the device's in-order queue and
// returning the kernel's event (the caller releases it). Tensors are (buffer, byte offset, row
// stride in elements); every activation, the token table and the page tables live in one
// `arena` buffer, weights in `w`, KV pages in `kv`. Token rows [t_begin, t_end) are computed.
// Argument checking is the runner's (GpuRunner validates programs and steps): these enqueue.
#include <CL/cl.h>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "services/gpu_svc/cl_device.h"

namespace duet::gpu {

struct TokenRange {
  uint32_t begin = 0, end = 0;
  uint32_t count() const { return end - begin; }
};

struct MatmulArgs {
  DType wtype = DType::F32;
  cl_mem w = nullptr;
  uint64_t w_off = 0;
  uint32_t k = 0;  // input features (a multiple of 32)
  uint64_t x_off = 0;
  uint32_t x_stride = 0;
  uint64_t y_off = 0;
  uint32_t y_stride = 0;
  uint32_t row_begin = 0, row_end = 0;
  TokenRange tokens;
  uint64_t tok_off = 0;          // token table (read only when rows_from_table)
  bool rows_from_table = false;  // Logits: y row = the token's logits_row, skipped when -1
  // Non-zero: `w` holds this Q4_0/Q8_0 tensor (all its rows, of which [row_begin, row_end) are
  // computed) in the packed layout of weight_pack.h at w_off; 0: the file's layout.
  uint32_t packed_rows = 0;
};

struct KvArgs {
  cl_mem kv = nullptr;
  uint64_t pages_offset = 0;  // byte offset of page 0 in the KV segment
  uint64_t page_bytes = 0;
  uint32_t page_tokens = 0;
  uint32_t kv_dim = 0;
  uint32_t layer = 0;
  uint64_t page_table_off = 0;  // arena offset of int32 [n_seqs][page_table_cols]
  uint32_t page_table_cols = 0;
};

class GpuKernels {
 public:
  explicit GpuKernels(ClDevice& dev) : dev_(dev), coop_gemv_(dev.info().type == "gpu") {}
  // The cooperative GEMV for up to 4 tokens (default on GPUs; tests force it on PoCL too).
  void set_coop_gemv(bool on) { coop_gemv_ = on; }
  // The shape of the fast GPU GEMV (packed Q4_0/Q8_0, aligned F16/F32): "l<lanes>r<rows>[p|x]",
  // one of kGemvVariants (matmul_gpu.cl instantiates those), or "" (the default) for the choice
  // by shape measured on an H100 (bench/gpu/RESULTS.md). Throws invalid_argument for others.
  void set_gemv_variant(const std::string& variant);
  static constexpr const char* kGemvVariants[] = {"l32r2",  "l32r4",  "l32r8",  "l16r8",  "l64r4",
                                                  "l128r4", "l16r4p", "l16r8p", "l32r4p", "l32r8p",
                                                  "l64r4p", "l16r4x", "l16r8x", "l32r4x", "l64r4x"};
  ClDevice& device() { return dev_; }

  // packed_rows: as MatmulArgs::packed_rows (a tied table the runner packed for Logits).
  cl_event embed(cl_mem arena, DType wtype, cl_mem w, uint64_t w_off, uint32_t cols,
                 uint64_t tok_off, uint64_t out_off, uint32_t out_stride, TokenRange t,
                 uint32_t packed_rows = 0);
  cl_event rmsnorm(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint64_t out_off,
                   uint32_t out_stride, cl_mem w, uint64_t w_off, uint32_t dim, float eps,
                   TokenRange t);
  cl_event rope(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t n_heads,
                uint32_t head_dim, float freq_base, uint64_t tok_off, TokenRange t);
  cl_event swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                  uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                  TokenRange t);
  cl_event add(cl_mem arena, uint64_t a_off, uint32_t a_stride, uint64_t b_off, uint32_t b_stride,
               uint64_t out_off, uint32_t out_stride, uint32_t cols, TokenRange t);
  // The GEMV/GEMM choice: the cooperative GEMV on GPUs for a few tokens (matmul_gpu.cl: the
  // fast one for packed tensors and 16-byte aligned F16/F32 rows), the register-tiled kernel
  // otherwise (matmul.cl, or matmul_gpu.cl's for packed tensors).
  cl_event matmul(cl_mem arena, const MatmulArgs& a);
  cl_event kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                    uint32_t v_stride, const KvArgs& kv, uint64_t tok_off, TokenRange t);
  cl_event attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                     uint32_t out_stride, const KvArgs& kv, uint64_t tok_off, uint32_t n_heads,
                     uint32_t n_kv_heads, uint32_t head_dim, TokenRange t);

  // dst = src, 64 bytes per work-item (bytes a multiple of 64): bench/gpu's bandwidth yardstick.
  cl_event copy(cl_mem src, cl_mem dst, size_t bytes);

  static constexpr uint32_t kMatmulTokensPerItem = 8;  // the prefill variant's MM_TN in matmul.cl
  static constexpr uint32_t kGemvLanes = 16;           // GEMV_LWS in matmul_gpu.cl
  static constexpr uint32_t kGemvRows = 16;            // GEMV_ROWS in matmul_gpu.cl
  static constexpr uint32_t kGemvLaneGroups = 8;       // PG_GROUPS in matmul_gpu.cl
  static constexpr uint32_t kMaxHeadDim = 256;         // ATTN_MAX_HEAD_DIM in attention.cl

 private:
  cl_event launch(const char* name, cl_kernel k, cl_uint dims, const size_t* global,
                  const size_t* local);
  cl_event gemv_gpu(cl_mem arena, const MatmulArgs& a);
  cl_event matmul_cpu(cl_mem arena, const MatmulArgs& a);  // CPU devices (PoCL)
  ClDevice& dev_;
  bool coop_gemv_;
  std::string gemv_variant_;  // "": by shape
};

// A kernel-name suffix per weight type ("q4_0", ...); throws unsupported for others.
const char* kernel_type_suffix(DType t);

}  // namespace duet::gpu
