#include "services/gpu_svc/tiled_weights.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "core/base/error.h"
#include "core/model/quant.h"

namespace duet::gpu {
namespace {

constexpr uint32_t row_of_lane(uint32_t lane) {
  return 4 * (lane % 4) + lane / 4;
}

void CL_CALLBACK free_host_memory(cl_mem, void* host) {
  std::free(host);
}

}  // namespace

bool has_tiled_layout(DType type) {
  return type == DType::Q4_0 || type == DType::Q8_0 || dtype_is_k_quant(type);
}

uint32_t tiled_block_bytes(DType type) {
  if (dtype_is_k_quant(type))
    return static_cast<uint32_t>((dtype_block_bytes(type) + 3) / 4 * 4 * kTiledRows);
  switch (type) {
    case DType::Q4_0:
      return 32 + kTiledRows * sizeof(BlockQ4_0::qs);
    case DType::Q8_0:
      return 32 + kTiledRows * sizeof(BlockQ8_0::qs);
    default:
      throw Error(Errc::invalid_argument,
                  "gpu_svc: weight type " + std::string(dtype_name(type)) + " has no tiled layout");
  }
}

uint64_t tiled_bytes(DType type, uint64_t rows, uint32_t cols) {
  return (rows + kTiledRows - 1) / kTiledRows * (cols / dtype_block_elems(type)) *
         tiled_block_bytes(type);
}

namespace {

// K types: each super-block's bytes transposed dword by dword (tiled_weights.h).
void tile_k_weights(DType type, uint64_t rows, uint32_t cols, const uint8_t* src, uint8_t* dst) {
  if (cols == 0 || cols % kQK_K != 0)
    throw Error(Errc::invalid_argument, "gpu_svc: cannot tile a " + std::string(dtype_name(type)) +
                                            " weight of width " + std::to_string(cols));
  const uint64_t nb = cols / kQK_K, in_bytes = dtype_block_bytes(type);
  const uint32_t out_bytes = tiled_block_bytes(type), dwords = out_bytes / 64;
  for (uint64_t g = 0; g < (rows + kTiledRows - 1) / kTiledRows; ++g)
    for (uint64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + (g * nb + b) * out_bytes;
      std::memset(out, 0, out_bytes);
      for (uint32_t lane = 0; lane < kTiledRows; ++lane) {
        const uint64_t row = g * kTiledRows + row_of_lane(lane);
        if (row >= rows) continue;
        const uint8_t* in = src + (row * nb + b) * in_bytes;
        for (uint32_t v = 0; v < dwords; ++v)
          std::memcpy(out + v * 64 + lane * 4, in + 4 * v, std::min<uint64_t>(4, in_bytes - 4 * v));
      }
    }
}

}  // namespace

void tile_weights(DType type, uint64_t rows, uint32_t cols, const uint8_t* src, uint8_t* dst) {
  if (dtype_is_k_quant(type)) return tile_k_weights(type, rows, cols, src, dst);
  if (cols == 0 || cols % kQK != 0)
    throw Error(Errc::invalid_argument,
                "gpu_svc: cannot tile a weight of width " + std::to_string(cols));
  const uint32_t out_bytes = tiled_block_bytes(type);
  const uint32_t quant_bytes = (out_bytes - 32) / kTiledRows;  // qs bytes of one block
  const uint32_t in_bytes = quant_bytes + 2;                   // ggml: fp16 d, then qs
  const uint64_t nb = cols / kQK;
  const uint32_t flip = type == DType::Q8_0 ? 0x80808080u : 0u;
  for (uint64_t g = 0; g < (rows + kTiledRows - 1) / kTiledRows; ++g)
    for (uint64_t b = 0; b < nb; ++b) {
      uint8_t* out = dst + (g * nb + b) * out_bytes;
      std::memset(out, 0, out_bytes);
      for (uint32_t lane = 0; lane < kTiledRows; ++lane) {
        const uint64_t row = g * kTiledRows + row_of_lane(lane);
        if (row >= rows) continue;
        const uint8_t* in = src + (row * nb + b) * in_bytes;
        std::memcpy(out + 2 * lane, in, 2);
        for (uint32_t v = 0; v < quant_bytes / 4; ++v) {
          uint32_t dword;
          std::memcpy(&dword, in + 2 + 4 * v, 4);
          dword ^= flip;
          std::memcpy(out + 32 + v * 64 + lane * 4, &dword, 4);
        }
      }
    }
}

TiledTensor::TiledTensor(ClDevice& dev, DType type, uint64_t rows, uint32_t cols,
                         const uint8_t* src) {
  const uint64_t bytes = tiled_bytes(type, rows, cols);
  // Owned here until the buffer's destructor callback takes it: a width tile_weights refuses
  // or a failed clCreateBuffer frees it on the way out.
  std::unique_ptr<void, decltype(&std::free)> host(std::aligned_alloc(64, (bytes + 63) / 64 * 64),
                                                   &std::free);
  if (!host)
    throw Error(Errc::out_of_range, "gpu_svc: no memory for a tiled weight copy of " +
                                        std::to_string(bytes) + " bytes");
  tile_weights(type, rows, cols, src, static_cast<uint8_t*>(host.get()));
  cl_int err = CL_SUCCESS;
  mem_ = clCreateBuffer(dev.context(), CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, bytes, host.get(),
                        &err);
  check_cl(err, "clCreateBuffer(tiled weights)");
  if (const cl_int e = clSetMemObjectDestructorCallback(mem_, free_host_memory, host.get());
      e != CL_SUCCESS) {
    clReleaseMemObject(mem_);
    check_cl(e, "clSetMemObjectDestructorCallback");
  }
  host.release();  // the callback frees it now
}

TiledTensor::~TiledTensor() {
  clReleaseMemObject(mem_);
}

std::shared_ptr<const TiledTensor> TiledWeights::get(ClDevice& dev, DType type, uint64_t rows,
                                                     uint32_t cols, const uint8_t* src) {
  std::erase_if(by_source_, [](const auto& entry) { return entry.second.expired(); });
  const Source key{src, type, rows, cols};
  if (auto it = by_source_.find(key); it != by_source_.end()) return it->second.lock();
  auto tensor = std::make_shared<const TiledTensor>(dev, type, rows, cols, src);
  by_source_[key] = tensor;
  return tensor;
}

}  // namespace duet::gpu
