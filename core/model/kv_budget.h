#pragma once
// How big a stack's KV page pool is: sized by a memory budget (`duet stack up --kv-memory SIZE`),
// not by max sequences x max context (issue 20). Pages are handed out as sequences grow and
// returned when they end (services/frontend/program_engine.h), so the pool only has to hold what
// is live at once; a sequence of the full context must fit in it, or the stack cannot serve that
// context and is refused up front.
//
// `duet stack up` plans the pool before it starts anything (a setting the stack cannot serve is
// refused there, with the reason) and hands the frontend the same budget in bytes
// (DUET_KV_MEMORY), so a restarted frontend makes the same pool.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/dtype.h"

namespace duet {

struct LlamaHparams;

// The default budget's share of the memory available when the stack comes up. A quarter: the KV
// pool lives in RAM beside the model's weights (mmapped once, plus gpu_svc's tiled copy of the
// quantised matmuls: the weights' size again), the activations and whatever else the host runs
// (several stacks, the tests). On the 24 GiB CI host that is ~5.8 GiB: a whole 131072-token
// sequence of Llama 3.2 1B at f16 (4 GiB) plus room for others.
constexpr double kDefaultKvMemoryFraction = 0.25;

// The largest region of one layer's KV in the pool. gpu_svc maps the pool's segment as one
// OpenCL buffer per group of whole layers (a segment may be larger than a device's largest
// buffer, a layer's region may not); 1 GiB is under PoCL's 2 GiB and under a quarter of any GPU
// this targets. A budget that would make a layer's region larger is trimmed to it.
constexpr uint64_t kMaxKvLayerBytes = uint64_t{1} << 30;

struct KvPoolRequest {
  int n_layer = 0;
  int kv_dim = 0;                 // n_head_kv * head_dim
  int model_ctx = 0;              // the model's trained context
  int max_ctx = 0;                // positions per sequence asked for (0: the model's)
  int max_seqs = 16;              // sequences that may be live at once (bounds the pool's use)
  int sharers = 1;                // engines stepping one pool (the Agent's two lanes)
  uint32_t page_tokens = 16;      // positions per page
  uint32_t bytes_per_value = 4;   // bytes of a block of values_per_block values: 4 (f32), 2 (f16),
  uint32_t values_per_block = 1;  // 34 per 32 values (q8_0: dtype_block_bytes / _elems)
  uint64_t budget_bytes = 0;      // the KV memory budget (must be > 0)
};

struct KvPoolPlan {
  uint32_t ctx = 0;              // positions per sequence served
  uint32_t page_tokens = 0;      //
  uint32_t n_pages = 0;          // pages in the pool
  uint32_t pages_per_seq = 0;    // pages a sequence of ctx positions holds
  uint64_t page_bytes = 0;       // one page: every layer's K and V of page_tokens positions
  uint64_t bytes_per_token = 0;  // 2 x layers x kv_dim / values_per_block x bytes_per_value
  uint64_t pool_bytes = 0;       // n_pages * page_bytes (the allocator's header comes on top)
  uint64_t budget_bytes = 0;     // what was asked
  std::string summary() const;   // "8192 pages of 16 tokens (1.0 GiB, 65536 B/token) ..."
};

// The pool for a budget: as many pages as the budget holds, but no more than `max_seqs x
// sharers` sequences of the full context could use, and no layer region past kMaxKvLayerBytes.
// Throws Error(invalid_argument) naming the numbers when one sequence of the context does not
// fit (the budget is too small, or a context past what one layer's region can hold).
KvPoolPlan plan_kv_pool(const KvPoolRequest& request);
KvPoolRequest kv_pool_request(const LlamaHparams& hp, int max_ctx, int max_seqs, int sharers,
                              uint64_t budget_bytes);

// Several models in one stack (issue 25), one budget: each model's pool is a segment of its own
// (its page layout, layers x kv_dim, is its own; a page table indexes only its model's segment,
// so no model can read another's KV), and the budget is divided when the stack comes up, in
// proportion to one full-context sequence of each model, so that every model holds the same
// number of sequences; a model whose pool is capped lower (max_seqs x sharers sequences, a
// layer's region) leaves the rest to the others. `requests[i].budget_bytes` is ignored. One
// request gets the whole budget (exactly plan_kv_pool). Throws as plan_kv_pool does, the message
// starting with "model i: " when there are several.
std::vector<KvPoolPlan> plan_kv_pools(std::vector<KvPoolRequest> requests, uint64_t budget_bytes);

// "4G", "512MiB", "1.5GB", "1073741824" -> bytes (K/M/G/T are powers of 1024, with or without
// "i"/"B"). Error(invalid_argument) naming the text otherwise.
uint64_t parse_memory_size(std::string_view text);
std::string format_bytes(uint64_t bytes);  // "5.8 GiB"

// `--kv-type` / DUET_KV_TYPE: "q8_0" (ggml's blocks of 32 along the head dim: 34/32 bytes a
// value), "f16" (the default: llama.cpp's cache type, half of f32's bytes with
// the f16 accuracy gate in tests) or "f32". Error(invalid_argument) naming anything else.
DType parse_kv_type(std::string_view text);

// MemAvailable from /proc/meminfo, and the free space of /dev/shm (where the pool lives).
uint64_t available_memory_bytes();
uint64_t shm_free_bytes();
// kDefaultKvMemoryFraction of available_memory_bytes(), at most shm_free_bytes().
uint64_t default_kv_memory_bytes();

}  // namespace duet
