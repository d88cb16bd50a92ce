#include "services/gpu_svc/kv_pieces.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/program/program.h"

namespace duet::gpu {

namespace {
constexpr uint64_t kPieceAlignment = 4096;
}

KvPieces map_kv_pieces(const fb::KvLayoutT& kv, const uint8_t* base, uint64_t kv_bytes,
                       uint64_t max_buffer_bytes,
                       const std::function<cl_mem(const void* host, uint64_t bytes)>& wrap) {
  KvPieces out;
  const uint64_t stride = kv_layer_stride(kv);
  if (kv.n_layers == 0 || kv_layer_offset(kv, kv.n_layers) > kv_bytes)
    throw Error(Errc::out_of_range, "gpu_svc: the KV layout (" + std::to_string(kv.n_layers) +
                                        " layers of " + std::to_string(stride) +
                                        " bytes) does not fit the " + std::to_string(kv_bytes) +
                                        "-byte KV segment");
  uint32_t first = 0;
  while (first < kv.n_layers) {
    const uint64_t start = kv_layer_offset(kv, first) / kPieceAlignment * kPieceAlignment;
    uint32_t end = first;
    while (end < kv.n_layers && kv_layer_offset(kv, end + 1) - start <= max_buffer_bytes) ++end;
    if (end == first)
      throw Error(Errc::out_of_range, "gpu_svc: one layer's KV (" + std::to_string(stride) +
                                          " bytes) exceeds the device's largest buffer (" +
                                          std::to_string(max_buffer_bytes) +
                                          " bytes): give the stack a smaller "
                                          "--kv-memory");
    const uint64_t bytes = kv_layer_offset(kv, end) - start;
    out.pieces.push_back({wrap(base + start, bytes), start, bytes});
    for (uint32_t l = first; l < end; ++l)
      out.piece_of_layer.push_back(static_cast<uint32_t>(out.pieces.size() - 1));
    first = end;
  }
  return out;
}

uint64_t kv_buffer_limit(uint64_t device_max_bytes) {
  const auto v = setting_override("DUET_GPU_KV_MAX_BUFFER");  // checked: bytes >= 1
  if (!v) return device_max_bytes;
  return std::min<uint64_t>(device_max_bytes, std::stoull(*v));
}

const KvPiece& KvPieces::of_layer(uint32_t layer) const {
  if (layer >= piece_of_layer.size())
    throw Error(Errc::out_of_range, "gpu_svc: KV of layer " + std::to_string(layer) + " of " +
                                        std::to_string(piece_of_layer.size()));
  return pieces[piece_of_layer[layer]];
}

KvArgs KvPieces::args(const fb::KvLayoutT& kv, uint32_t layer, uint64_t page_table_off,
                      uint32_t page_table_cols) const {
  const KvPiece& piece = of_layer(layer);
  KvArgs a;
  a.kv = piece.mem;
  a.pages_offset = kv_layer_offset(kv, layer) - piece.base;
  a.page_bytes = kv_layer_page_bytes(kv);
  a.page_tokens = kv.page_tokens;
  a.kv_dim = kv.kv_dim;
  a.layer = 0;  // the offsets above are the layer's own
  a.page_table_off = page_table_off;
  a.page_table_cols = page_table_cols;
  a.value_type = static_cast<DType>(kv.dtype);
  return a;
}

}  // namespace duet::gpu
