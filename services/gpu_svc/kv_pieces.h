#pragma once
// gpu_svc's view of a program's KV segment: one OpenCL buffer per group of whole layers (issue 20).
// A KV pool sized by memory can be larger than the device's largest buffer (PoCL: a quarter of
// its memory, 2 GiB on some hosts); the pages are laid out layer-major (schemas/program.fbs
// KvLayout), so each layer's KV is one contiguous region and an op, which touches one layer,
// needs only the buffer holding it. Each buffer wraps its range of the shm mapping in place
// (zero copy where the device shares host memory).
#include <CL/cl.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "schemas/program_generated.h"
#include "services/gpu_svc/gpu_kernels.h"

namespace duet::gpu {

struct KvPiece {
  cl_mem mem = nullptr;
  uint64_t base = 0;   // segment offset where the buffer starts
  uint64_t bytes = 0;  // its size
};

struct KvPieces {
  std::vector<KvPiece> pieces;
  std::vector<uint32_t> piece_of_layer;
  // The kernels' arguments for `layer`: its buffer, and offsets relative to that buffer such that
  // the kernels' page arithmetic (pages_offset + page * page_bytes + (which * page_tokens + row)
  // * kv_dim * value bytes, layer 0) lands in the layer's region.
  KvArgs args(const fb::KvLayoutT& kv, uint32_t layer, uint64_t page_table_off,
              uint32_t page_table_cols) const;
  const KvPiece& of_layer(uint32_t layer) const;
  // Calls f(l0, l1, piece) for each run of layers [l0, l1] that one buffer holds, in order (a
  // transfer over every layer is one rectangle per run); nothing without layers.
  template <class F>
  void for_each_layer_run(F&& f) const {
    const auto n = static_cast<uint32_t>(piece_of_layer.size());
    for (uint32_t l0 = 0; l0 < n;) {
      uint32_t l1 = l0;
      while (l1 + 1 < n && piece_of_layer[l1 + 1] == piece_of_layer[l0]) ++l1;
      f(l0, l1, of_layer(l0));
      l0 = l1 + 1;
    }
  }
};

// Groups consecutive layers into pieces of at most max_buffer_bytes, each starting at a multiple
// of 4096 bytes of the segment (base must be page-aligned), and wraps each with `wrap`.
// Error(out_of_range) when one layer's region alone exceeds max_buffer_bytes or the layout does
// not fit kv_bytes.
// The largest KV buffer to make: the device's largest buffer, or less where the environment says
// so (DUET_GPU_KV_MAX_BUFFER, bytes: runs the pieces path on a host whose buffers are large; a
// value that is not a positive whole number is refused by name).
uint64_t kv_buffer_limit(uint64_t device_max_bytes);

KvPieces map_kv_pieces(const fb::KvLayoutT& kv, const uint8_t* base, uint64_t kv_bytes,
                       uint64_t max_buffer_bytes,
                       const std::function<cl_mem(const void* host, uint64_t bytes)>& wrap);

}  // namespace duet::gpu
