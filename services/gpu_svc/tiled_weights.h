#pragma once
// The weight layout of the integer matmul path on CPU devices (matmul_int8.cl, the "_tiled"
// kernels). The file's layout stores a row's blocks one after another, so a work-item that owns
// 16 rows reads 16 streams and transposes each block's quants into registers (lane = row) and
// gathers 16 scattered fp16 scales, per block: ~20% of a prefill GEMM's time (measured with the
// unpacking hoisted out of the loop). Tiled, those registers are stored as they are used:
//
//   tensor of `rows` rows and nb = cols / 32 blocks per row, groups of 16 rows (the last padded
//   with zero rows); group g, block b at ((g * nb) + b) * S:
//     [0, 32)    the 16 rows' fp16 scales d, lane L = row 16 g + row_of_lane(L)
//     [32, S)    the quants as 64-byte lane vectors: vector v, lane L = bytes 4v..4v+3 of that
//                row's qs (Q4_0: v = 0..3, ggml's nibbles unchanged, S = 288; Q8_0: v = 0..7,
//                each byte XOR 0x80, i.e. w + 128 as the unsigned operand of vpdpbusd, S = 544)
//
// row_of_lane(L) = 4 (L % 4) + L / 4 is the file kernels' transpose order, so both layouts give
// the same lanes and the same bits. Same size as the file's blocks (plus the padding rows).
//
// K types (Q4_K, Q5_K, Q6_K; matmul_kq_cpu.cl): the unit is a super-block of 256 weights (nb =
// cols / 256), its B ggml bytes (144, 176, 210) as ceil(B / 4) lane vectors: vector v, lane L =
// bytes 4v..4v+3 of row 16 g + row_of_lane(L)'s super-block (bytes past B zero; S = 64 ceil(B/4):
// 2304, 2816, 3392), i.e. the super-block's bytes unchanged, transposed dword by dword.
// gpu_svc keeps one tiled copy per tensor in its own memory (the file's pages stay shared with
// npu_svc); a copy lives while a registered program uses it.
#include <CL/cl.h>

#include <compare>
#include <cstdint>
#include <map>
#include <memory>

#include "core/model/dtype.h"
#include "services/gpu_svc/cl_device.h"

namespace duet::gpu {

inline constexpr uint32_t kTiledRows = 16;
// Types with a tiled layout: Q4_0, Q8_0 and the K types.
bool has_tiled_layout(DType type);
// S above: bytes of one group's block or super-block (throws invalid_argument for other types).
uint32_t tiled_block_bytes(DType type);
uint64_t tiled_bytes(DType type, uint64_t rows, uint32_t cols);
// dst (tiled_bytes) from `rows` x `cols` weights stored as ggml blocks at src.
void tile_weights(DType type, uint64_t rows, uint32_t cols, const uint8_t* src, uint8_t* dst);

// One tensor's tiled copy, in host memory the device uses in place (CL_MEM_USE_HOST_PTR). The
// memory is freed by the buffer's destructor callback, after the last queued kernel using it.
class TiledTensor {
 public:
  TiledTensor(ClDevice& dev, DType type, uint64_t rows, uint32_t cols, const uint8_t* src);
  ~TiledTensor();
  TiledTensor(const TiledTensor&) = delete;
  TiledTensor& operator=(const TiledTensor&) = delete;
  cl_mem mem() const { return mem_; }

 private:
  cl_mem mem_ = nullptr;
};

// The tiled copies by source address: the prefill and decode programs of a model share them.
class TiledWeights {
 public:
  std::shared_ptr<const TiledTensor> get(ClDevice& dev, DType type, uint64_t rows, uint32_t cols,
                                         const uint8_t* src);

 private:
  struct Source {
    const uint8_t* bytes;
    DType type;
    uint64_t rows;
    uint32_t cols;
    auto operator<=>(const Source&) const = default;
  };
  std::map<Source, std::weak_ptr<const TiledTensor>> by_source_;
};

}  // namespace duet::gpu
