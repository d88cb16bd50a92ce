#pragma once
// The packed weight layout gpu_svc uses on discrete GPUs (copies mode). The runner uploads
// weights there anyway, so it rewrites each Q4_0/Q8_0 matmul weight in place, within the
// tensor's own byte range (same size: still 4.5 / 8.5 bits per weight, nothing dequantised),
// into a structure of arrays the GPU reads with aligned, coalesced 16-byte loads:
//
//   tensor of `rows` rows, nb = cols / 32 blocks per row, at byte offset o (16-byte aligned):
//     quants at o                    rows * nb blocks of Q bytes, row-major (block (r, b) at
//                                    o + (r * nb + b) * Q); Q = 16 for Q4_0, 32 for Q8_0; a
//                                    block's bytes are ggml's qs[] unchanged (core/model/quant.h)
//     scales at o + rows * nb * Q    rows * nb fp16 d, row-major (block (r, b) at + (r*nb+b)*2)
//
// Zero-copy devices (PoCL, phones) keep the file's layout: nothing is copied there. The kernels
// reading this layout are in kernels/matmul_gpu.cl (GEMV, GEMM, embedding lookup).
#include <CL/cl.h>

#include <cstdint>
#include <map>
#include <utility>

#include "core/model/dtype.h"
#include "core/program/program.h"
#include "services/gpu_svc/cl_device.h"

namespace duet::gpu {

// Types with a packed layout (Q4_0, Q8_0). F16/F32 rows are already plain arrays.
bool has_packed_layout(DType type);
// Bytes of quants per 32-weight block in the packed layout (16 or 32); throws for other types.
uint32_t packed_quant_bytes(DType type);
// The packed bytes of `rows` x `cols` weights stored as ggml blocks: `dst` (the same size as
// `src`, not overlapping it). Throws invalid_argument for a type without a packed layout or
// cols not a multiple of 32.
void pack_weights(DType type, uint64_t rows, uint32_t cols, const uint8_t* src, uint8_t* dst);

// The runner's record of which tensors of which device weight buffers it has packed (copies
// mode). A tensor is packed once, whichever programs (prefill, decode) name it.
class PackedWeights {
 public:
  // Packs, in `weights` (the device's copy of `host_weights`), every Q4_0/Q8_0 weight of a
  // MatMul/Logits op of `program` whose offset is 16-byte aligned (GGUF aligns tensors to 32;
  // others keep the file's layout and the file-layout kernels). Throws invalid_argument when a
  // tensor overlaps an already packed one without being it.
  void pack_program(ClDevice& dev, cl_mem weights, const uint8_t* host_weights,
                    const fb::ProgramT& program);
  // The tensor's row count when the tensor at `offset` of `weights` is packed, else 0.
  uint32_t rows(cl_mem weights, uint64_t offset) const;

 private:
  struct Tensor {
    uint64_t bytes;
    DType type;
    uint32_t rows, cols;
  };
  std::map<std::pair<cl_mem, uint64_t>, Tensor> tensors_;
};

}  // namespace duet::gpu
