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
// 64-bit values are two words, low first.
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
constexpr uint32_t kBlocksPerChunk = 64;      // quantisation, swiglu: 32-value blocks a chunk
constexpr uint32_t kChSyncWords = 80;         // CH_SYNC
constexpr uint32_t kChMaxGroups = 8;          // CH_MAX_GROUPS
constexpr uint32_t kMatmulItemsPerChunk = 4;  // matmul_int8's work-group of 4 items
constexpr uint32_t kSibQ4_0 = 0, kSibQ8_0 = 1, kSibQ4_K = 2, kSibQ5_K = 3, kSibQ6_K = 4;

void put64(uint32_t* w, uint32_t at, uint64_t v) {
  w[at] = static_cast<uint32_t>(v);
  w[at + 1] = static_cast<uint32_t>(v >> 32);
}

uint32_t sib_code(DType t) {
  switch (t) {
    case DType::Q4_0:
      return kSibQ4_0;
    case DType::Q8_0:
      return kSibQ8_0;
    case DType::Q4_K:
      return kSibQ4_K;
    case DType::Q5_K:
      return kSibQ5_K;
    case DType::Q6_K:
      return kSibQ6_K;
    default:
      throw Error(Errc::internal, "gpu_svc: no chained matmul for this weight type");
  }
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
                                  cl_mem buffer, uint32_t* slot) {
  const auto used = std::span(chain_buffers_).first(chain_n_buffers_);
  const bool known = !buffer || std::find(used.begin(), used.end(), buffer) != used.end();
  if (chain_words_.size() >= size_t{kChainMaxStages} * kChainWords ||
      (chain_arena_ && arena != chain_arena_) || (!known && chain_n_buffers_ == kChainMaxBuffers))
    flush_chain();
  chain_arena_ = arena;
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
  set_args(k, table, cl_uint{n_stages}, chain_arena_, int8_tiles_, chain_sync_);
  for (uint32_t i = 0; i < kChainMaxBuffers; ++i)
    set_arg(k, 5 + i, chain_buffers_[i < chain_n_buffers_ ? i : 0]);
  chain_words_.clear();
  chain_n_buffers_ = 0;
  chain_arena_ = nullptr;
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
