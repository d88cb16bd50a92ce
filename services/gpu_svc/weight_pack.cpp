#include "services/gpu_svc/weight_pack.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/quant.h"

namespace duet::gpu {

bool has_packed_layout(DType type) {
  return type == DType::Q4_0 || type == DType::Q8_0;
}

uint32_t packed_quant_bytes(DType type) {
  switch (type) {
    case DType::Q4_0:
      return sizeof(BlockQ4_0::qs);
    case DType::Q8_0:
      return sizeof(BlockQ8_0::qs);
    default:
      throw Error(Errc::invalid_argument, "gpu_svc: weight type " + std::string(dtype_name(type)) +
                                              " has no packed layout");
  }
}

void pack_weights(DType type, uint64_t rows, uint32_t cols, const uint8_t* src, uint8_t* dst) {
  const uint64_t quant_bytes = packed_quant_bytes(type);
  if (cols == 0 || cols % kQK != 0)
    throw Error(Errc::invalid_argument,
                "gpu_svc: cannot pack a weight of width " + std::to_string(cols));
  const uint64_t blocks = rows * (cols / kQK);
  const uint64_t block_bytes = quant_bytes + 2;  // fp16 d first, then the quants (ggml)
  uint8_t* scales = dst + blocks * quant_bytes;
  for (uint64_t i = 0; i < blocks; ++i) {
    const uint8_t* block = src + i * block_bytes;
    std::memcpy(scales + i * 2, block, 2);
    std::memcpy(dst + i * quant_bytes, block + 2, quant_bytes);
  }
}

void PackedWeights::pack_program(ClDevice& dev, cl_mem weights, const uint8_t* host_weights,
                                 const fb::ProgramT& program) {
  for (const auto& op : program.ops) {
    if ((op->kind != fb::OpKind::MatMul && op->kind != fb::OpKind::Logits) || !op->weight) continue;
    const fb::TensorRef& t = *op->weight;
    const auto type = static_cast<DType>(t.dtype());
    if (!has_packed_layout(type) || t.offset() % 16 != 0) continue;
    const Tensor want{uint64_t{t.rows()} * dtype_row_bytes(type, t.cols()), type, t.rows(),
                      t.cols()};
    const uint64_t begin = t.offset(), end = begin + want.bytes;
    // The packed neighbours: the last tensor starting at or before `begin`, and the next one.
    auto next = tensors_.upper_bound({weights, begin});
    if (next != tensors_.begin()) {
      auto prev = std::prev(next);
      if (prev->first.first == weights && prev->first.second + prev->second.bytes > begin) {
        const Tensor& have = prev->second;
        if (prev->first.second == begin && have.bytes == want.bytes && have.type == want.type &&
            have.rows == want.rows && have.cols == want.cols)
          continue;  // packed for an earlier op or program
        throw Error(Errc::invalid_argument, "gpu_svc: weight at offset " + std::to_string(begin) +
                                                " overlaps a different packed weight at offset " +
                                                std::to_string(prev->first.second));
      }
    }
    if (next != tensors_.end() && next->first.first == weights && next->first.second < end)
      throw Error(Errc::invalid_argument, "gpu_svc: weight at offset " + std::to_string(begin) +
                                              " overlaps a packed weight at offset " +
                                              std::to_string(next->first.second));
    std::vector<uint8_t> packed(want.bytes);
    pack_weights(type, t.rows(), t.cols(), host_weights + begin, packed.data());
    // Blocking: `packed` is freed on return, and the first step must read the packed bytes.
    check_cl(clEnqueueWriteBuffer(dev.queue(), weights, CL_TRUE, begin, want.bytes, packed.data(),
                                  0, nullptr, nullptr),
             "clEnqueueWriteBuffer(packed weights)");
    tensors_.emplace(std::make_pair(weights, begin), want);
  }
}

uint32_t PackedWeights::rows(cl_mem weights, uint64_t offset) const {
  auto it = tensors_.find({weights, offset});
  return it == tensors_.end() ? 0 : it->second.rows;
}

}  // namespace duet::gpu
