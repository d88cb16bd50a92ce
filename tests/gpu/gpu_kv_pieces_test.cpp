// gpu_svc maps a KV pool larger than its largest buffer as one buffer per group of whole layers
// (services/gpu_svc/kv_pieces.h): the pieces' kernel arguments address exactly the bytes the
// layout (core kv_row_offset) names, no piece is past the limit, and a layer that alone exceeds
// it is refused by name.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/program/program.h"
#include "services/gpu_svc/kv_pieces.h"

namespace duet::gpu {
namespace {

fb::KvLayoutT layout(fb::DTypeCode dtype) {
  fb::KvLayoutT kv;
  kv.page_tokens = 16;
  kv.n_layers = 5;
  kv.kv_dim = 64;
  kv.n_pages = 37;
  kv.dtype = dtype;
  kv.page_bytes = kv.n_layers * kv_layer_page_bytes(kv);
  kv.pages_offset = 4096;
  return kv;
}

TEST(KvPieces, LayersGroupUnderTheLargestBufferAndAddressTheLayoutsBytes) {
  for (fb::DTypeCode dtype : {fb::DTypeCode::F16, fb::DTypeCode::F32, fb::DTypeCode::Q8_0}) {
    const fb::KvLayoutT kv = layout(dtype);
    const uint64_t total = kv_layer_offset(kv, kv.n_layers);
    std::vector<uint8_t> seg(total);
    const uint64_t limit = 2 * kv_layer_stride(kv) + 4096;  // two layers per piece, at most
    std::vector<std::pair<const void*, uint64_t>> wrapped;
    const KvPieces pieces =
        map_kv_pieces(kv, seg.data(), seg.size(), limit, [&](const void* host, uint64_t bytes) {
          wrapped.emplace_back(host, bytes);
          return reinterpret_cast<cl_mem>(wrapped.size());
        });
    ASSERT_EQ(pieces.pieces.size(), 3u);  // layers {0,1} {2,3} {4}
    for (const KvPiece& p : pieces.pieces) {
      EXPECT_LE(p.bytes, limit);
      EXPECT_EQ(p.base % 4096, 0u);
    }
    for (uint32_t layer = 0; layer < kv.n_layers; ++layer)
      for (uint32_t page : {0u, 17u, 36u})
        for (uint32_t which : {0u, 1u})
          for (uint32_t row : {0u, 15u}) {
            const KvArgs a = pieces.args(kv, layer, 0, 1);
            const KvPiece& p = pieces.of_layer(layer);
            EXPECT_EQ(a.kv, p.mem);
            EXPECT_EQ(a.layer, 0u);
            EXPECT_EQ(a.value_type, static_cast<DType>(dtype));
            // What kernels/kv_write.cl and _common.cl compute, relative to the buffer.
            const uint64_t in_buffer = a.pages_offset + uint64_t{page} * a.page_bytes +
                                       (uint64_t{which} * a.page_tokens + row) * kv_row_bytes(kv);
            EXPECT_EQ(p.base + in_buffer, kv_row_offset(kv, layer, which, page, row));
            EXPECT_LT(in_buffer + kv_row_bytes(kv), p.bytes + 1);
          }
  }
}

TEST(KvPieces, ALayerLargerThanTheLargestBufferIsRefused) {
  const fb::KvLayoutT kv = layout(fb::DTypeCode::F16);
  std::vector<uint8_t> seg(kv_layer_offset(kv, kv.n_layers));
  try {
    map_kv_pieces(kv, seg.data(), seg.size(), kv_layer_stride(kv) / 2,
                  [](const void*, uint64_t) { return cl_mem{}; });
    FAIL() << "a layer past the limit was mapped";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
    EXPECT_NE(std::string(e.what()).find("largest buffer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(map_kv_pieces(kv, seg.data(), seg.size() - 1, uint64_t{1} << 30,
                             [](const void*, uint64_t) { return cl_mem{}; }),
               Error);
}

}  // namespace
}  // namespace duet::gpu
