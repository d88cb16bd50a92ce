// Step chains (gpu_kernels.h): a decode step's integer-path launches recorded as the stages of
// one kernel (kernels/step_chain_cpu.cl), so that PoCL's worker threads do not sleep and wake
// between them (12-19 us a launch in this KVM guest; bench/kquant/RESULTS.md).
//
// A stage is kChainWords uint32 words, laid out as step_chain_cpu.cl reads them:
//   [0] kind (CH_*), [1] barrier (1: the next stage waits until this and every stage since the
//   last barrier are done), [2] chunks, [3] items (blocks) a chunk, [26] the token;
//   CH_QUANTIZE       [4,5] x_off, [6] x_stride, [7] k, [9] bits, [10] zp_shift
//   CH_MATMUL         [4] type (SIB_*), [5] bits, [6] weight buffer slot, [7,8] w_off, [9] k,
//                     [10] row_begin, [11] row_end, [12,13] y_off, [14] y_stride, [16,17]
//                     tok_off, [18] rows_from_table, [19] tiled, [20] items
//   CH_ADD_RMSNORM_Q8 [4,5] a_off, [6] a_stride, [7,8] b_off, [9] b_stride, [10] has_add, [11,12]
//                     x_off, [13] x_stride, [14,15] out_off, [16] out_stride, [17,18] w_off,
//                     [19] weight slot, [20] dim, [21] eps bits, [23] bits, [24] zp_shift, [25] lsz
//   CH_SWIGLU_Q8      [4,5] g_off, [6] g_stride, [7,8] u_off, [9] u_stride, [10,11] out_off,
//                     [12] out_stride, [13] k, [15] bits, [16] zp_shift
//   CH_ROPE_PAIR      [4,5] x_off, [6] x_stride, [7] x_heads, [8,9] y_off, [10] y_stride, [11]
//                     y_heads, [12] head_dim, [13] freq_base bits, [14,15] tok_off, [16]
//                     freq_scale bits, [17] mode, [18] factors' weight slot, [19,20] factors_off,
//                     [21] has_factors, [22] pairs (head_dim / 2)
//   CH_KV_WRITE       [4] value type (0 f32, 1 f16, 2 q8_0), [5,6] k_off, [7] k_stride, [8,9]
//                     v_off, [10] v_stride, [11,12] pages_offset, [13,14] page_bytes, [15]
//                     page_tokens, [16] units a row, [17] layer, [18,19] tok_off, [20,21]
//                     page table offset, [22] its columns
//   CH_ATTENTION      [4] variant (value type x 3 + kernel: 0 split_cpu, 1 gqa 4x4, 2 gqa 8x2),
//                     [5,6] q_off, [7] q_stride, [8,9] out_off, [10] out_stride, [11..22] as
//                     CH_KV_WRITE's, [23] n_heads, [24] n_kv_heads, [25] head_dim, [27] scale
//                     bits, [28] least chunk keys, [29] chunk slots, [30] work-items a key
//                     chunk, [31] work-items in all
//   CH_ATTN_MERGE     [8,9] out_off, [10] out_stride, [18,19] tok_off, [23] n_heads, [25]
//                     head_dim, [28] least chunk keys, [29] chunk slots
// 64-bit values are two words, low first. The KV pool and attention's partials are kernel
// arguments of their own (one pool a chain).
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <span>
#include <string>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/kernel_args.h"

namespace duet::gpu {
namespace {

constexpr uint32_t kChQuantize = 1, kChMatmul = 2, kChAddRmsnormQ8 = 3, kChSwigluQ8 = 4;  // CH_*
constexpr uint32_t kChRopePair = 5, kChKvWrite = 6, kChAttention = 7, kChAttnMerge = 8;
constexpr uint32_t kRopePairsPerChunk = 8, kKvUnitsPerChunk = 256, kMergeHeadsPerChunk = 4;
constexpr uint32_t kBlocksPerChunk = 64;      // quantisation, swiglu: 32-value blocks a chunk
constexpr uint32_t kChSyncWords = 128;        // CH_SYNC
constexpr uint32_t kChMaxGroups = 8;          // CH_MAX_GROUPS
constexpr uint32_t kMatmulItemsPerChunk = 4;  // matmul_int8's work-group of 4 items

void put64(uint32_t* w, uint32_t at, uint64_t v) {
  w[at] = static_cast<uint32_t>(v);
  w[at + 1] = static_cast<uint32_t>(v >> 32);
}

uint32_t sib_code(DType t) {
  const int code = sibling_type_code(t);
  if (code < 0) throw Error(Errc::internal, "gpu_svc: no chained matmul for this weight type");
  return static_cast<uint32_t>(code);
}

}  // namespace

void GpuKernels::begin_chain() {
  if (!chain_available()) return;
  if (!chain_ring_) {
    const size_t ring_bytes = size_t{kChainRingSlots} * kChainMaxStages * kChainWords * 4;
    chain_ring_host_ = static_cast<uint32_t*>(std::aligned_alloc(4096, ring_bytes));
    if (!chain_ring_host_) throw Error(Errc::out_of_range, "gpu_svc: no memory for step chains");
    cl_int err = CL_SUCCESS;
    chain_ring_ = clCreateBuffer(dev_.context(), CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, ring_bytes,
                                 chain_ring_host_, &err);
    check_cl(err, "clCreateBuffer(step chain tables)");
    std::vector<uint32_t> zeros(size_t{kChainMaxStages} * kChSyncWords + 16, 0);
    chain_sync_ = clCreateBuffer(dev_.context(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                 zeros.size() * 4, zeros.data(), &err);
    check_cl(err, "clCreateBuffer(step chain counters)");
  }
  chain_on_ = true;
}

void GpuKernels::end_chain() {
  if (!chain_words_.empty()) flush_chain();
  chain_on_ = false;
}

cl_event GpuKernels::take_chain_event() {
  cl_event e = chain_last_;
  chain_last_ = nullptr;
  return e;
}

uint32_t* GpuKernels::chain_stage(uint32_t kind, uint32_t chunks, uint32_t unit, cl_mem arena,
                                  cl_mem buffer, uint32_t* slot, cl_mem kv) {
  const auto used = std::span(chain_buffers_).first(chain_n_buffers_);
  const bool known = !buffer || std::find(used.begin(), used.end(), buffer) != used.end();
  if (chain_words_.size() >= size_t{kChainMaxStages} * kChainWords ||
      (chain_arena_ && arena != chain_arena_) || (kv && chain_kv_ && kv != chain_kv_) ||
      (!known && chain_n_buffers_ == kChainMaxBuffers))
    flush_chain();
  chain_arena_ = arena;
  if (kv) chain_kv_ = kv;
  if (buffer) {
    uint32_t i = 0;
    while (i < chain_n_buffers_ && chain_buffers_[i] != buffer) ++i;
    if (i == chain_n_buffers_) chain_buffers_[chain_n_buffers_++] = buffer;
    *slot = i;
  }
  chain_words_.resize(chain_words_.size() + kChainWords, 0);
  uint32_t* w = chain_words_.data() + chain_words_.size() - kChainWords;
  w[0] = kind;
  w[1] = 1;
  w[2] = chunks;
  w[3] = unit;
  ++chain_recorded_;
  return w;
}

void GpuKernels::chain_quantize(cl_mem arena, const MatmulArgs& a, int bits, uint32_t zp_shift) {
  uint32_t* w = chain_stage(kChQuantize, (a.k / 32 + kBlocksPerChunk - 1) / kBlocksPerChunk,
                            kBlocksPerChunk, arena);
  put64(w, 4, a.x_off);
  w[6] = a.x_stride;
  w[7] = a.k;
  w[9] = static_cast<uint32_t>(bits);
  w[10] = zp_shift;
  w[26] = a.tokens.begin;
}

void GpuKernels::chain_add_rmsnorm(cl_mem arena, const ResidualAdd& r, bool has_add, uint64_t x_off,
                                   uint32_t x_stride, uint64_t out_off, uint32_t out_stride,
                                   cl_mem w, uint64_t w_off, uint32_t dim, float eps, uint32_t t,
                                   int bits, uint32_t zp_shift, uint32_t lsz) {
  uint32_t slot = 0;
  uint32_t* s = chain_stage(kChAddRmsnormQ8, 1, 1, arena, w, &slot);
  put64(s, 4, r.a_off);
  s[6] = r.a_stride;
  put64(s, 7, r.b_off);
  s[9] = r.b_stride;
  s[10] = has_add ? 1u : 0u;
  put64(s, 11, x_off);
  s[13] = x_stride;
  put64(s, 14, out_off);
  s[16] = out_stride;
  put64(s, 17, w_off);
  s[19] = slot;
  s[20] = dim;
  s[21] = std::bit_cast<uint32_t>(eps);
  s[23] = static_cast<uint32_t>(bits);
  s[24] = zp_shift;
  s[25] = lsz;
  s[26] = t;
}

void GpuKernels::chain_swiglu(cl_mem arena, uint64_t g_off, uint32_t g_stride, uint64_t u_off,
                              uint32_t u_stride, uint64_t out_off, uint32_t out_stride,
                              uint32_t cols, uint32_t t, int bits, uint32_t zp_shift) {
  uint32_t* s = chain_stage(kChSwigluQ8, (cols / 32 + kBlocksPerChunk - 1) / kBlocksPerChunk,
                            kBlocksPerChunk, arena);
  put64(s, 4, g_off);
  s[6] = g_stride;
  put64(s, 7, u_off);
  s[9] = u_stride;
  put64(s, 10, out_off);
  s[12] = out_stride;
  s[13] = cols;
  s[15] = static_cast<uint32_t>(bits);
  s[16] = zp_shift;
  s[26] = t;
}

void GpuKernels::chain_matmul(cl_mem arena, const MatmulArgs& a, int bits, bool barrier) {
  const uint32_t first_row = a.tiled ? a.row_begin / 16 * 16 : a.row_begin;
  const uint32_t items = (a.row_end - first_row + 15) / 16;
  uint32_t slot = 0;
  uint32_t* w = chain_stage(kChMatmul, (items + kMatmulItemsPerChunk - 1) / kMatmulItemsPerChunk,
                            kMatmulItemsPerChunk, arena, a.tiled ? a.tiled : a.w, &slot);
  w[1] = barrier ? 1 : 0;
  w[4] = sib_code(a.wtype);
  w[5] = static_cast<uint32_t>(bits);
  w[6] = slot;
  put64(w, 7, a.tiled ? 0 : a.w_off);
  w[9] = a.k;
  w[10] = a.row_begin;
  w[11] = a.row_end;
  put64(w, 12, a.y_off);
  w[14] = a.y_stride;
  put64(w, 16, a.tok_off);
  w[18] = a.rows_from_table ? 1 : 0;
  w[19] = a.tiled ? 1 : 0;
  w[20] = items;
  w[26] = a.tokens.begin;
}

void GpuKernels::chain_rope_pair(cl_mem arena, uint64_t x_off, uint32_t x_stride, uint32_t x_heads,
                                 uint64_t y_off, uint32_t y_stride, uint32_t y_heads,
                                 uint32_t head_dim, const RopeArgs& r, uint64_t tok_off,
                                 uint32_t t) {
  const uint32_t pairs = head_dim / 2;
  uint32_t slot = 0;
  uint32_t* s = chain_stage(kChRopePair, (pairs + kRopePairsPerChunk - 1) / kRopePairsPerChunk,
                            kRopePairsPerChunk, arena, r.w, &slot);
  put64(s, 4, x_off);
  s[6] = x_stride;
  s[7] = x_heads;
  put64(s, 8, y_off);
  s[10] = y_stride;
  s[11] = y_heads;
  s[12] = head_dim;
  s[13] = std::bit_cast<uint32_t>(r.freq_base);
  put64(s, 14, tok_off);
  s[16] = std::bit_cast<uint32_t>(r.freq_scale);
  s[17] = r.mode;
  s[18] = slot;
  put64(s, 19, r.factors_off);
  s[21] = r.has_factors ? 1u : 0u;
  s[22] = pairs;
  s[26] = t;
}

namespace {

uint32_t kv_type_code(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::Q8_0:
      return 2;
    default:
      throw Error(Errc::internal, "gpu_svc: no chained KV stage for this value type");
  }
}

// Words [11, 22] of a KV write's or attention's stage: where token rows live.
void put_kv(uint32_t* s, const KvArgs& kv, uint32_t units, uint64_t tok_off) {
  put64(s, 11, kv.pages_offset);
  put64(s, 13, kv.page_bytes);
  s[15] = kv.page_tokens;
  s[16] = units;
  s[17] = kv.layer;
  put64(s, 18, tok_off);
  put64(s, 20, kv.page_table_off);
  s[22] = kv.page_table_cols;
}

}  // namespace

void GpuKernels::chain_kv_write(cl_mem arena, uint64_t k_off, uint32_t k_stride, uint64_t v_off,
                                uint32_t v_stride, const KvArgs& kv, uint32_t units,
                                uint64_t tok_off, uint32_t t) {
  uint32_t* s = chain_stage(kChKvWrite, (units + kKvUnitsPerChunk - 1) / kKvUnitsPerChunk,
                            kKvUnitsPerChunk, arena, nullptr, nullptr, kv.kv);
  s[4] = kv_type_code(kv.value_type);
  put64(s, 5, k_off);
  s[7] = k_stride;
  put64(s, 8, v_off);
  s[10] = v_stride;
  put_kv(s, kv, units, tok_off);
  s[26] = t;
}

void GpuKernels::chain_attention(cl_mem arena, uint64_t q_off, uint32_t q_stride, uint64_t out_off,
                                 uint32_t out_stride, const KvArgs& kv, uint32_t units,
                                 uint64_t tok_off, uint32_t n_heads, uint32_t n_kv_heads,
                                 uint32_t head_dim, float scale, uint32_t t, uint32_t variant,
                                 uint32_t items, uint32_t chunks) {
  uint32_t* s = chain_stage(kChAttention, items * chunks, 1, arena, nullptr, nullptr, kv.kv);
  s[4] = kv_type_code(kv.value_type) * 3 + variant;
  put64(s, 5, q_off);
  s[7] = q_stride;
  put64(s, 8, out_off);
  s[10] = out_stride;
  put_kv(s, kv, units, tok_off);
  s[23] = n_heads;
  s[24] = n_kv_heads;
  s[25] = head_dim;
  s[26] = t;
  s[27] = std::bit_cast<uint32_t>(scale);
  s[28] = attn_min_chunk_keys_;
  s[29] = kAttnMaxChunks;
  s[30] = items;
  s[31] = items * chunks;
  if (chunks == 1) return;  // the split writes the output (attention.cl)
  uint32_t* m = chain_stage(kChAttnMerge, (n_heads + kMergeHeadsPerChunk - 1) / kMergeHeadsPerChunk,
                            kMergeHeadsPerChunk, arena);
  put64(m, 8, out_off);
  m[10] = out_stride;
  put64(m, 18, tok_off);
  m[23] = n_heads;
  m[25] = head_dim;
  m[26] = t;
  m[28] = attn_min_chunk_keys_;
  m[29] = kAttnMaxChunks;
}

void GpuKernels::flush_chain() {
  if (chain_words_.empty()) return;
  const uint32_t n_stages = static_cast<uint32_t>(chain_words_.size() / kChainWords);
  // The ring slot's previous table must have been read: its chain done (long ago, normally).
  const uint32_t slot = chain_ring_next_;
  chain_ring_next_ = (slot + 1) % kChainRingSlots;
  if (cl_event& old = chain_ring_events_[slot]) {
    dev_.wait(old, std::chrono::steady_clock::now() + std::chrono::seconds(30),
              "an earlier step chain");
    clReleaseEvent(old);
    old = nullptr;
  }
  const size_t slot_words = size_t{kChainMaxStages} * kChainWords;
  std::copy(chain_words_.begin(), chain_words_.end(), chain_ring_host_ + slot * slot_words);
  const std::string name = std::string("step_chain_t1_") + (int8_vnni_ ? "vnni" : "portable");
  cl_kernel k = dev_.kernel(name);
  cl_buffer_region region{slot * slot_words * 4, slot_words * 4};
  cl_int err = CL_SUCCESS;
  cl_mem table =
      clCreateSubBuffer(chain_ring_, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &region, &err);
  check_cl(err, "clCreateSubBuffer(step chain table)");
  // Buffers no stage reads are bound to the arena (a kernel argument must be a buffer).
  set_args(k, table, cl_uint{n_stages}, chain_arena_, int8_tiles_, chain_sync_,
           chain_kv_ ? chain_kv_ : chain_arena_, attn_partials_ ? attn_partials_ : chain_arena_);
  for (uint32_t i = 0; i < kChainMaxBuffers; ++i)
    set_arg(k, 7 + i, i < chain_n_buffers_ ? chain_buffers_[i] : chain_arena_);
  chain_words_.clear();
  chain_n_buffers_ = 0;
  chain_arena_ = nullptr;
  chain_kv_ = nullptr;
  // A group per compute unit, of one work-item: the groups spin on each other between stages.
  const size_t groups = static_cast<size_t>(
      std::clamp<int>(dev_.info().compute_units, 1, static_cast<int>(kChMaxGroups)));
  const size_t global[1] = {groups}, local[1] = {1};
  cl_event e = nullptr;
  err = clEnqueueNDRangeKernel(dev_.queue(), k, 1, nullptr, global, local, 0, nullptr, &e);
  clReleaseMemObject(table);  // queued kernels keep it alive
  if (err != CL_SUCCESS)
    throw Error(Errc::internal, "enqueue of kernel " + name + " failed: " + cl_error_name(err));
  ++launches_;
  clRetainEvent(e);
  chain_ring_events_[slot] = e;
  if (chain_last_) clReleaseEvent(chain_last_);
  chain_last_ = e;
}

void GpuKernels::release_chain() {
  for (cl_event& e : chain_ring_events_)
    if (e) clReleaseEvent(e);
  if (chain_last_) clReleaseEvent(chain_last_);
  if (chain_ring_ || chain_sync_) clFinish(dev_.queue());  // before the tables' memory goes
  if (chain_sync_) clReleaseMemObject(chain_sync_);
  if (chain_ring_) clReleaseMemObject(chain_ring_);
  std::free(chain_ring_host_);
}

}  // namespace duet::gpu
