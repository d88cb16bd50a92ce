#pragma once
// Host side of the kernels: one function per op, enqueueing on the device's in-order queue and
// returning the kernel's event (the caller releases it). Tensors are (buffer, byte offset, row
// stride in elements); every activation, the token table and the page tables live in one
// `arena` buffer, weights in `w`, KV pages in `kv`. Token rows [t_begin, t_end) are computed.
// Argument checking is the runner's (GpuRunner validates programs and steps): these enqueue.
#include <CL/cl.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/model/dtype.h"
#include "core/program/plan.h"
#include "services/gpu_svc/cl_device.h"

namespace duet::gpu {

// A Rope op's parameters (core/model/ops.h RopeParams): factors, when has_factors, are head_dim/2
// F32 values at factors_off in buffer w (the model's weights).
struct RopeArgs {
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  uint32_t mode = 0;  // 0 normal, 2 neox (ops::RopeMode)
  cl_mem w = nullptr;
  uint64_t factors_off = 0;
  bool has_factors = false;
};

struct TokenRange {
  uint32_t begin = 0, end = 0;
  uint32_t count() const { return end - begin; }
};

// The arena bytes [begin, end) of rows t of a [tokens][stride] f32 tensor at byte `off`: what a
// matmul reads or writes, for the checks that an output leaves an input (or another output) alone.
struct ArenaRows {
  uint64_t begin = 0, end = 0;
  ArenaRows(uint64_t off, uint32_t stride, TokenRange t)
      : begin(off + uint64_t{t.begin} * stride * 4), end(off + uint64_t{t.end} * stride * 4) {}
  bool overlaps(const ArenaRows& o) const { return begin < o.end && o.begin < end; }
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
  // CPU integer path: the tensor's tiled copy (tiled_weights.h; all its rows, w_off 0), or null
  // for the file's layout in `w`.
  cl_mem tiled = nullptr;
  // Which matmul of the layer: the integer path picks its activation bits by role (none: 16).
  std::optional<MatmulRole> role;
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
  DType value_type = DType::F32;  // F32, F16 or Q8_0 values (kernels/kv_write.cl)
};

// Q4_0/Q8_0 and K-quant (Q4_K/Q5_K/Q6_K: matmul_kq_cpu.cl, gpu_kernels_kq.cpp) matmuls on
// CPU devices (PoCL on x86) quantise their input rows per 32-value block
// and run integer block dot products (kernels/matmul_int8.cl; llama.cpp's scheme): faster, and
// batch-invariant (a token's output bits do not depend on the other tokens of the launch). On
// by default there; the environment variable DUET_GPU_INT8_MATMUL=0 turns it off (the fp32
// kernels of matmul.cl then run, as on every other device), DUET_GPU_INT8_VNNI=0 keeps it on
// but uses the portable kernels instead of AVX-512 VNNI (the same bits, slower). Where the CPU
// has AMX-INT8 and Linux grants this process the tile state, launches of more than 8 tokens run
// AMX tile products instead of vpdpbusd chains, but for a last tile of 8 tokens or fewer
// (matmul_int8_amx.cl: the same bits, 1.3-1.4x faster GEMMs); DUET_GPU_INT8_AMX=0 keeps them on
// VNNI. Weights are
// read from their tiled copy (MatmulArgs::tiled, tiled_weights.h: the runner makes one per
// tensor) or, without one, from the file's layout (transposed block by block: ~25% slower).
// Activations are quantised per 32-value block to 8 bits (llama.cpp's Q8_0) or 16 (two 8-bit
// planes: twice the dot instructions), per matmul role; 16 for every role by default. Measured
// on tiny-fortune (teacher-forced top-1 where the reference margin > 0.05, bench/gpu/RESULTS.md):
// 8 bits everywhere flips 7 of 285 (Q4_0) and 3 of 282 (Q8_0) positions; the least sensitive
// inputs (o: attention averages; gate/up and logits: RMS-normed rows; 62% of a llama3.2-1b
// layer's matmul FLOPs) at 8 bits with q/k/v (attention scores) and down (SwiGLU products,
// outlier channels) at 16 keep every position in the gpu-only plan but flip 1 (Q4_0) and 3
// (Q8_0) when the solver's tensor plan splits matmuls with the NPU, and smaller 8-bit sets
// still flip a near-threshold position in some plan or bucket set: so no role is 8-bit by
// default. DUET_GPU_INT8_ACT_BITS sets them (set_int8_act_bits' spec): "8" or "16" for every
// role, "role=bits,..." for the roles named, e.g. "16,o=8,gate=8,up=8,logits=8" (a speed
// option for prefill: bench/gpu/RESULTS.md).
class GpuKernels {
 public:
  explicit GpuKernels(ClDevice& dev);
  ~GpuKernels();
  GpuKernels(const GpuKernels&) = delete;
  GpuKernels& operator=(const GpuKernels&) = delete;
  // The cooperative GEMV for up to 4 tokens (default on GPUs; tests force it on PoCL too).
  void set_coop_gemv(bool on) { coop_gemv_ = on; }
  // The kernels a GPU runs, on whatever device this is: the GPU GEMVs, rope's and rmsnorm's GPU
  // launches and the GPU fusions (rope_pair, add_rmsnorm, the sibling GEMVs), with the integer
  // path off. On by default on GPUs only; tests turn it on on PoCL to run the discrete-GPU path
  // (GpuRunner::kernels(), before registering a program).
  void set_gpu_kernels(bool on);
  bool gpu_kernels() const { return gpu_kernels_; }
  // The shape of the fast GPU GEMV (packed Q4_0/Q8_0, aligned F16/F32): "l<lanes>r<rows>[p|x]",
  // or "" (the default) for the choice by shape measured on an H100 (bench/gpu/RESULTS.md).
  // kGemvVariants are the ones that choice makes, in every program; the others of
  // kGemvTuningVariants only in a device opened with DeviceOptions::gemv_tuning (gpu_bench
  // --gemv-variants). Throws invalid_argument for a name in neither list or one the device's
  // program lacks.
  void set_gemv_variant(const std::string& variant);
  static constexpr const char* kGemvVariants[] = {"l32r2", "l128r4", "l16r4x", "l64r4x"};
  static constexpr const char* kGemvTuningVariants[] = {
      "l32r2",  "l32r4",  "l32r8",  "l16r8",  "l64r4",  "l128r4", "l16r4p", "l16r8p",
      "l32r4p", "l32r8p", "l64r4p", "l16r4x", "l16r8x", "l32r4x", "l64r4x"};
  ClDevice& device() { return dev_; }
  // The integer matmul path (see above). Turning it on where the device has no such kernels
  // (not a CPU device, or not x86) throws unsupported; set_int8_vnni(true) likewise where the
  // host CPU lacks AVX-512 VNNI.
  void set_int8_matmul(bool on);
  bool int8_matmul() const { return int8_matmul_; }
  void set_int8_vnni(bool on);
  bool int8_vnni() const { return int8_vnni_; }
  // The integer kernels by instruction set, all with the same bits: portable (emulated
  // vpdpbusd), vnni (AVX-512 VNNI), amx (vnni, and AMX tiles for launches of more than 8
  // tokens). set_int8_isa throws unsupported where the host lacks the ISA (amx: also where the
  // kernel refused the tile state).
  enum class Int8Isa { portable, vnni, amx };
  void set_int8_isa(Int8Isa isa);
  static const char* int8_isa_name(Int8Isa isa);
  // Activation bits of the integer path, per matmul role (see above): 8 or 16, invalid_argument
  // otherwise. set_int8_act_bits(bits) sets every role; int8_act_bits() is the widest (what a
  // matmul without a role gets).
  void set_int8_act_bits(int bits);
  void set_int8_act_bits(MatmulRole role, int bits);
  // Comma-separated items applied in order: "8" or "16" (every role), "role=8" or "role=16"
  // (roles q k v o gate up down logits); e.g. "16,down=8". Roles not named keep their bits.
  // invalid_argument for anything else (and nothing changes then).
  void set_int8_act_bits(const std::string& spec);
  int int8_act_bits() const;
  int int8_act_bits(MatmulRole role) const { return int8_act_bits_[static_cast<int>(role)]; }

  // The integer path quantises a matmul's input once for consecutive matmuls of the same rows
  // (q/k/v, gate/up) when the caller vouches that only ops through these kernels write the
  // arena: from reuse_quantized_inputs() (the runner, at each step's start) until
  // forget_quantized_input() (the runner, before an op that waits for another device). Any
  // other op, and a matmul whose output overlaps the input, forgets it too. Off by default.
  void reuse_quantized_inputs();
  void forget_quantized_input() { quantized_.valid = false; }

  // Fused launches for the CPU integer path (gpu_kernels_fused.cpp; the runner's op_fusion.h
  // picks them): each writes exactly what the launches it replaces write, with the same bits,
  // and the *_quantize ones also `next`'s quantised input, so that matmul(next) skips its
  // quantisation. They need int8_matmul() (a CPU device) and, for the quantised input to be
  // reused, reuse_quantized_inputs(); `next` must read all of t's tokens.
  // [The residual add a + b into x when `add`;] out = rmsnorm(x) * w; next's input = out.
  struct ResidualAdd {
    uint64_t a_off = 0;
    uint32_t a_stride = 0;
    uint64_t b_off = 0;
    uint32_t b_stride = 0;
  };
  cl_event add_rmsnorm_quantize(cl_mem arena, const std::optional<ResidualAdd>& add, uint64_t x_off,
                                uint32_t x_stride, uint64_t out_off, uint32_t out_stride, cl_mem w,
                                uint64_t w_off, uint32_t dim, float eps, TokenRange t,
                                const MatmulArgs& next);
  // out = silu(g) * u (swiglu); next's input = out.
  cl_event swiglu_quantize(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                           uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                           TokenRange t, const MatmulArgs& next);
  // rope of x (x_heads heads) and y (y_heads heads, e.g. K) with the same parameters and tokens
  // in one launch, with rope()'s bits: rope_heads_pair where rope() runs rope_heads (CPU devices),
  // else rope_pair (elementwise.cl).
  cl_event rope_pair(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t x_heads,
                     uint64_t y_off, uint32_t y_stride, uint32_t y_heads, uint32_t head_dim,
                     const RopeArgs& r, uint64_t tok_off, TokenRange t);
  // The residual add x = a + b, then out = rmsnorm(x) * w, in one launch (add_rmsnorm in
  // elementwise.cl): the bits of add() then rmsnorm(), for any device (the GPU path's fusion;
  // the integer path has add_rmsnorm_quantize). out may be a or b (the same rows); null
  // (nothing enqueued) where it overlaps other rows of theirs, which another token's work-group
  // could read after it wrote them.
  cl_event add_rmsnorm(cl_mem arena, const ResidualAdd& add, uint64_t x_off, uint32_t x_stride,
                       uint64_t out_off, uint32_t out_stride, cl_mem w, uint64_t w_off,
                       uint32_t dim, float eps, TokenRange t);
  // Whether matmul(a) runs on the integer path (and so quantises its input): what the fused
  // *_quantize launches can feed.
  bool quantizes_input(const MatmulArgs& a) const;
  // Up to kMaxSiblings matmuls of the same input rows as one launch, outputs apart from the
  // input and from each other, rows from 0 (row_begin 0), no Logits rows. Either all on the
  // integer path (matmul_siblings_cpu.cl): one token, each from its tiled copy, the same
  // activation bits and weight zero point (Q4_0, Q8_0, or K types, which may mix); or all on the
  // GPU GEMV (matmul_siblings_gpu.cl): up to 4 tokens, each taking the same GEMV kernel, or K
  // types (which may mix) each the K-quant GEMV, and the variant chosen by shape (no
  // set_gemv_variant). Writes exactly what matmul() of each writes, with the same bits; null
  // (nothing enqueued) where siblings_fuse(mm) is false.
  static constexpr size_t kMaxSiblings = 3;
  bool siblings_fuse(std::span<const MatmulArgs> mm) const;
  cl_event matmul_siblings(cl_mem arena, std::span<const MatmulArgs> mm);
  // Kernels enqueued so far (empty ranges not counted): launches per step for tests and traces.
  uint64_t launches() const { return launches_; }

  // Step chains (gpu_kernels_chain.cpp, kernels/step_chain_cpu.cl): between begin_chain() and
  // end_chain(), the integer path's one-token launches (input quantisation, matmuls and sibling
  // matmuls, add_rmsnorm_quantize, swiglu_quantize) and rope_pair, kv_write and the CPU
  // attention kernels (split and merge) are recorded as stages of ONE kernel instead of
  // launched, and return null; any other launch first enqueues the stages recorded so far
  // (so the queue keeps the ops' order). The same bits as the launches apart. Only where
  // chain_available() (a CPU device with the integer path); a no-op elsewhere.
  bool chain_available() const { return int8_matmul_ && dev_.info().type == "cpu"; }
  void begin_chain();
  // Enqueues what is recorded and stops recording.
  void end_chain();
  // Stages recorded so far (all chains): whether a call recorded instead of launching.
  uint64_t chained_stages() const { return chain_recorded_; }
  // The event of the last chain enqueued since the previous call (the caller releases it), or
  // null: the end of every op recorded before it (the queue is in order).
  cl_event take_chain_event();

  // packed_rows: as MatmulArgs::packed_rows (a tied table the runner packed for Logits).
  cl_event embed(cl_mem arena, DType wtype, cl_mem w, uint64_t w_off, uint32_t cols,
                 uint64_t tok_off, uint64_t out_off, uint32_t out_stride, TokenRange t,
                 uint32_t packed_rows = 0);
  cl_event rmsnorm(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint64_t out_off,
                   uint32_t out_stride, cl_mem w, uint64_t w_off, uint32_t dim, float eps,
                   TokenRange t);
  // r.w must be a valid buffer even without factors (an unused kernel argument).
  cl_event rope(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t n_heads,
                uint32_t head_dim, const RopeArgs& r, uint64_t tok_off, TokenRange t);
  // x[t][i] += bias[i] for i < cols (bias: cols F32 at b_off in w).
  cl_event add_bias(cl_mem arena, uint64_t x_off, uint32_t x_stride, cl_mem w, uint64_t b_off,
                    uint32_t cols, TokenRange t);
  cl_event swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                  uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                  TokenRange t);
  cl_event add(cl_mem arena, uint64_t a_off, uint32_t a_stride, uint64_t b_off, uint32_t b_stride,
               uint64_t out_off, uint32_t out_stride, uint32_t cols, TokenRange t);
  // out = gelu(g) * u (GELU's tanh approximation): Gemma's GeGLU, swiglu's layout.
  cl_event geglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off, uint32_t u_stride,
                 uint64_t out_off, uint32_t out_stride, uint32_t cols, TokenRange t);
  // x[t][i] *= s for i < cols, in place (Gemma's embedding scale).
  cl_event scale(cl_mem arena, uint64_t x_off, uint32_t x_stride, float s, uint32_t cols,
                 TokenRange t);
  // The GEMV/GEMM choice: the cooperative GEMV on GPUs for a few tokens (matmul_gpu.cl: the
  // fast one for packed tensors and 16-byte aligned F16/F32 rows), the register-tiled kernel
  // otherwise (matmul.cl, or matmul_gpu.cl's for packed tensors).
  cl_event matmul(cl_mem arena, const MatmulArgs& a);
  cl_event kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                    uint32_t v_stride, const KvArgs& kv, uint64_t tok_off, TokenRange t);
  // Causal GQA attention, split over the context (kernels/attention.cl): the split kernel, then
  // the merge where a token has more than one chunk, by batches of tokens whose partials fit the
  // scratch (reserve_attention). max_keys: the step's largest position + 1 (sizes the launch).
  // *first (if given) gets the first kernel's event, retained, for the op's timing.
  cl_event attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                     uint32_t out_stride, const KvArgs& kv, uint64_t tok_off, uint32_t n_heads,
                     uint32_t n_kv_heads, uint32_t head_dim, TokenRange t, uint32_t max_keys,
                     cl_event* first = nullptr);
  // The partials' scratch for attention of this shape and up to max_tokens tokens a step, made
  // once when a program is registered (grown, never shrunk): no allocation in a step.
  void reserve_attention(uint32_t n_heads, uint32_t head_dim, uint32_t max_tokens);
  // How the context is split (attn_chunk_keys in attention.cl): a token with n_keys keys has
  // chunks of attention_chunk_keys(n_keys) keys: as many chunks of at least
  // attention_min_chunk_keys() as fit, at most kAttnMaxChunks, of equal size (a multiple of 16).
  // A function of the position alone, so a token's bits do not depend on the step around it.
  // The least chunk is kAttnMinChunkKeys on CPU devices (two threads share a decode token's
  // chunks) and kAttnMinChunkKeysGpu on GPUs (more chunks, more work-groups for the SMs).
  // bench/longctx/RESULTS.md and bench/gpu/RESULTS.md have the measurements behind the numbers.
  static constexpr uint32_t kAttnMinChunkKeys = 256;
  static constexpr uint32_t kAttnMinChunkKeysGpu = 64;
  static constexpr uint32_t kAttnMaxChunks = 64;
  static constexpr uint32_t kAttnWorkGroup = 64;  // attention.cl's ATTN_WG
  static_assert(kAttnMaxChunks <= kAttnWorkGroup, "attention_merge_wg: a chunk per work-item");
  uint32_t attention_chunk_keys(uint32_t n_keys) const;
  uint32_t attention_chunks(uint32_t n_keys) const;
  // The chunk slots a launch whose tokens hold at most max_keys keys has: at least the chunks of
  // every shorter context (attention_chunks is not monotonic: rounding chunks up to 16 keys can
  // leave a longer context fewer), at most one or two more than max_keys' own.
  uint32_t attention_chunk_slots(uint32_t max_keys) const;
  // Another least chunk size (a multiple of 16; bench/longctx/attention_bench measures them).
  void set_attention_min_chunk_keys(uint32_t keys);
  uint32_t attention_min_chunk_keys() const { return attn_min_chunk_keys_; }
  // Which split kernel runs: `shared` (CPU devices: a work-item serves the query heads that
  // share a KV head, where head_dim is 64 or 128 and the group divides; else `per_head`),
  // `per_head` (CPU devices: a work-item per query head), `work_group` (a work-group per head,
  // token and chunk: what GPUs run by default), `portable` (a work-item per head, token and
  // chunk, scalar). Tests and bench/longctx/attention_bench run each; serving uses the default,
  // `shared`, which on a GPU means `work_group`.
  enum class AttentionKernel { shared, per_head, portable, work_group };
  void set_attention_kernel(AttentionKernel kernel) { attention_kernel_ = kernel; }
  // The kernel attention() launches for this shape and KV type, by name.
  std::string attention_kernel_name(uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                                    DType kv_type) const;
  // The partials' scratch is at most this big; larger steps run in batches of tokens.
  static constexpr size_t kAttnScratchBytes = size_t{16} << 20;

  // dst = src, 64 bytes per work-item (bytes a multiple of 64): bench/gpu's bandwidth yardstick.
  cl_event copy(cl_mem src, cl_mem dst, size_t bytes);

  // The quantised input of the integer path by tiles of 16 tokens (MMI_TILE in matmul_int8.cl):
  // per 32-value block of a tile, 16 x (2 x 32 quants) + 16 scales + 3 x 16 sums, in 1280 bytes.
  // A VNNI GEMM item takes 8 tokens (half a tile), an AMX one 16.
  static constexpr uint32_t kInt8TileTokens = 16;
  static constexpr uint32_t kInt8GemmTokens = 8;
  static size_t int8_tile_bytes(uint32_t k) { return size_t{k} / 32 * 1280; }
  static constexpr uint32_t kMatmulTokensPerItem = 8;  // the prefill variant's MM_TN in matmul.cl
  static constexpr uint32_t kGemvLanes = 16;           // GEMV_LWS in matmul_gpu.cl
  static constexpr uint32_t kGemvRows = 16;            // GEMV_ROWS in matmul_gpu.cl
  static constexpr uint32_t kGemvLaneGroups = 8;       // PG_GROUPS in matmul_gpu.cl
  static constexpr uint32_t kMaxHeadDim = 256;         // ATTN_MAX_HEAD_DIM in attention.cl
  static constexpr uint32_t kRopeTokensPerItem = 8;    // ROPE_TOKENS in elementwise.cl

 private:
  // An elementwise kernel of two inputs (swiglu, geglu, add) over tokens t, columns cols.
  cl_event binary(const char* name, cl_mem arena, uint64_t a_off, uint32_t a_stride, uint64_t b_off,
                  uint32_t b_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                  TokenRange t);
  cl_event launch(const char* name, cl_kernel k, cl_uint dims, const size_t* global,
                  const size_t* local);
  // The GPU GEMV matmul(a) runs (none: it runs another kernel): the kernel, its work-group and
  // the sibling kernel that runs it beside others (matmul_siblings_gpu.cl; empty: none).
  struct GemvPick {
    std::string kernel, siblings;
    size_t group = 0;           // work-items per work-group
    size_t rows_per_group = 0;  // output rows per work-group
    bool takes_w_rows = false;  // the fast kernels' last argument: the tensor's rows
  };
  std::optional<GemvPick> gemv_pick(const MatmulArgs& a) const;
  cl_event gemv_gpu(cl_mem arena, const MatmulArgs& a, const GemvPick& g);
  // How matmul_siblings launches mm (none where siblings_fuse is false): on the integer path, or
  // as gemv's sibling kernel, picked once for both the check and the launch.
  struct SiblingPick {
    bool int8 = false;
    GemvPick gemv;
  };
  std::optional<SiblingPick> sibling_pick(std::span<const MatmulArgs> mm) const;
  cl_event gemv_siblings(cl_mem arena, std::span<const MatmulArgs> mm, const GemvPick& g);
  cl_event int8_siblings(cl_mem arena, std::span<const MatmulArgs> mm);
  // The group size rmsnorm() launches on this device (add_rmsnorm must match it).
  size_t rmsnorm_group(uint32_t dim) const;
  cl_event matmul_cpu(cl_mem arena, const MatmulArgs& a);   // CPU devices (PoCL)
  cl_event matmul_int8(cl_mem arena, const MatmulArgs& a);  // their (and K types') integer path
  // The integer path's first launch: the input rows' quantised blocks into int8_tiles_ (unless
  // they are there already), for weights whose zero point is 1 << zp_shift.
  void quantize_int8_input(cl_mem arena, const MatmulArgs& a, int bits, uint32_t zp_shift);
  // The activation bits and weight zero point's shift of the integer path for a.
  std::pair<int, uint32_t> int8_bits_zp(const MatmulArgs& a) const;
  // Grows int8_tiles_ for k-wide input rows of n tokens (forgetting what it held then).
  void reserve_int8_tiles(uint32_t k, uint32_t n);
  // K-quant weights (Q4_K, Q5_K, Q6_K; gpu_kernels_kq.cpp): the integer path on CPU devices
  // (matmul_kq_cpu.cl), else the fp32 kernels of matmul_kq_gpu.cl.
  cl_event matmul_kq(cl_mem arena, const MatmulArgs& a);
  bool int8_kernels_available();
  ClDevice& dev_;
  bool coop_gemv_;
  bool gpu_kernels_;               // set_gpu_kernels
  size_t cpu_group_multiple_ = 0;  // a CPU device's preferred group multiple; 0 elsewhere (launch)
  std::string gemv_variant_;       // "": by shape
  bool int8_matmul_ = false, int8_vnni_ = false, int8_amx_ = false;
  bool attention_cpu_available_ = false;  // a CPU device whose compiler built attention_split_cpu_*
  AttentionKernel attention_kernel_ = AttentionKernel::shared;
  uint32_t attn_min_chunk_keys_ = kAttnMinChunkKeys;
  cl_mem attn_partials_ = nullptr;  // attention's per-chunk partials (reserve_attention)
  size_t attn_partials_bytes_ = 0;
  std::array<int, kMatmulRoles> int8_act_bits_ = default_int8_act_bits();
  static std::array<int, kMatmulRoles> default_int8_act_bits();
  // The quantised input of the running matmul, by 8-token tiles (one at a time: the queue is in
  // order).
  cl_mem int8_tiles_ = nullptr;
  size_t int8_tiles_bytes_ = 0;
  struct QuantizedInput {  // what int8_tiles_ holds
    bool valid = false;
    cl_mem arena = nullptr;
    uint64_t x_off = 0;
    uint32_t x_stride = 0, k = 0, t_begin = 0, t_end = 0, bits = 0, zp_shift = 0;
    bool operator==(const QuantizedInput&) const = default;
  } quantized_;
  bool reuse_quantized_ = false;
  uint64_t launches_ = 0;
  // Step chains: the stages recorded and not yet enqueued (kChainWords words each), the buffers
  // they read (a stage names its slot), the tables' ring in host memory the device reads in
  // place, and the counters the kernel's groups synchronise on (zero between launches).
  static constexpr uint32_t kChainWords = 32, kChainMaxStages = 256, kChainMaxBuffers = 64;
  static constexpr uint32_t kChainRingSlots = 64;
  bool chain_recording() const { return chain_on_; }
  // The stage's words, appended (enqueuing first what is recorded where it, or `buffer`'s
  // slot, would not fit, or where it reads another arena or KV pool `kv` than the stages
  // before: one of each a chain); *slot gets buffer's slot.
  uint32_t* chain_stage(uint32_t kind, uint32_t chunks, uint32_t unit, cl_mem arena,
                        cl_mem buffer = nullptr, uint32_t* slot = nullptr, cl_mem kv = nullptr);
  // One-token stages (gpu_kernels_chain.cpp has their words): a's input quantisation, a matmul
  // (its input quantised before it), add_rmsnorm_quantize's and swiglu_quantize's work.
  void chain_quantize(cl_mem arena, const MatmulArgs& a, int bits, uint32_t zp_shift);
  void chain_matmul(cl_mem arena, const MatmulArgs& a, int bits, bool barrier);
  void chain_add_rmsnorm(cl_mem arena, const ResidualAdd& r, bool has_add, uint64_t x_off,
                         uint32_t x_stride, uint64_t out_off, uint32_t out_stride, cl_mem w,
                         uint64_t w_off, uint32_t dim, float eps, uint32_t t, int bits,
                         uint32_t zp_shift, uint32_t lsz);
  void chain_swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                    uint32_t u_stride, uint64_t out_off, uint32_t out_stride, uint32_t cols,
                    uint32_t t, int bits, uint32_t zp_shift);
  // rope_heads_pair, a KV write (`units`: values, or Q8_0 blocks, of a row) and attention's split
  // (`variant`: step_chain_cpu.cl's code of the CPU kernel; `items` of its work-items a key
  // chunk, `chunks` chunk slots) with, for more than one chunk, its merge: their one-token work.
  void chain_rope_pair(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t x_heads,
                       uint64_t y_off, uint32_t y_stride, uint32_t y_heads, uint32_t head_dim,
                       const RopeArgs& r, uint64_t tok_off, uint32_t t);
  void chain_kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                      uint32_t v_stride, const KvArgs& kv, uint32_t units, uint64_t tok_off,
                      uint32_t t);
  void chain_attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                       uint32_t out_stride, const KvArgs& kv, uint32_t units, uint64_t tok_off,
                       uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, float scale,
                       uint32_t t, uint32_t variant, uint32_t items, uint32_t chunks);
  void flush_chain();
  void release_chain();  // the ring, the counters and the last events (the destructor's)
  bool chain_on_ = false;
  std::vector<uint32_t> chain_words_;
  std::array<cl_mem, kChainMaxBuffers> chain_buffers_{};
  uint32_t chain_n_buffers_ = 0;
  cl_mem chain_arena_ = nullptr, chain_kv_ = nullptr;
  uint64_t chain_recorded_ = 0;
  uint32_t* chain_ring_host_ = nullptr;
  cl_mem chain_ring_ = nullptr, chain_sync_ = nullptr;
  std::array<cl_event, kChainRingSlots> chain_ring_events_{};
  uint32_t chain_ring_next_ = 0;
  cl_event chain_last_ = nullptr;  // take_chain_event's
};

// A kernel-name suffix per weight type ("q4_0", ...); throws unsupported for others.
const char* kernel_type_suffix(DType t);
// The segment type codes of matmul_siblings_cpu.cl (SIB_*: the sibling launch and the step
// chains' matmul stages) and, for the K types, matmul_siblings_gpu.cl (GEMV_SIB_*); -1 for other
// types.
int sibling_type_code(DType t);

}  // namespace duet::gpu
