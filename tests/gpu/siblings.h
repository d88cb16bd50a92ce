#pragma once
// Sibling matmuls for GpuKernels::matmul_siblings' tests (gpu_fusion_test: the CPU integer path
// over tiled copies; gpu_kernel_fusion_test: the GPU GEMVs over the packed or the file's layout).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "core/model/dtype.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/tiled_weights.h"
#include "services/gpu_svc/weight_pack.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kquant_test_util.h"

namespace duet::gpu::testing {

// How the weights are laid out: the file's, packed at upload (pack_weights: GPUs), or the file's
// beside a tiled copy (TiledTensor: the CPU integer path).
enum class SiblingLayout { file, packed, tiled };

// Each weight tensor in a buffer of its own at w_off, an arena with the input rows of tokens
// 0 .. tokens.end - 1 at kX and each matmul's outputs (those tokens' rows) at its own y_off; the
// launch is for `tokens`.
struct Siblings {
  static constexpr uint64_t kX = 4096;
  Siblings(ClDevice& dev, const std::vector<DType>& types, const std::vector<uint32_t>& rows,
           uint32_t cols, TokenRange tokens, SiblingLayout layout, uint64_t w_off = 0)
      : x(random_floats(size_t{tokens.end} * cols, 11 + cols, 2.0f)) {
    uint64_t y = kX + uint64_t{tokens.end} * cols * 4;
    for (size_t s = 0; s < types.size(); ++s) {
      const auto bytes = dtype_is_k_quant(types[s])
                             ? random_kq_weights(types[s], rows[s], cols, 3 + rows[s])
                             : random_weights(types[s], rows[s], cols, 3 + rows[s]);
      auto w = std::make_unique<HostBuffer>(dev, w_off + bytes.size());
      if (layout == SiblingLayout::packed)
        pack_weights(types[s], rows[s], cols, bytes.data(), w->at(w_off));
      else
        std::memcpy(w->at(w_off), bytes.data(), bytes.size());
      w->upload();
      MatmulArgs a = matmul_args(types[s], w->mem(), w_off, rows[s], cols, kX, y, tokens);
      if (layout == SiblingLayout::packed) a.packed_rows = rows[s];
      if (layout == SiblingLayout::tiled) {
        tiled.push_back(std::make_unique<TiledTensor>(dev, types[s], rows[s], cols, bytes.data()));
        a.tiled = tiled.back()->mem();
      }
      args.push_back(a);
      weights.push_back(std::move(w));
      y += uint64_t{tokens.end} * rows[s] * 4 + 64;  // a gap: writes past a tensor show there
    }
    arena = std::make_unique<HostBuffer>(dev, y);
  }
  // Every byte past the input after run(launch): the outputs (-7 where nothing was written) and
  // the gaps.
  std::vector<uint8_t> outputs(const std::function<void()>& launch) {
    std::memset(arena->at(0), 0, arena->bytes());
    std::memcpy(arena->at(kX), x.data(), x.size() * 4);
    for (const MatmulArgs& a : args) {
      float* y = arena->at<float>(a.y_off);
      std::fill(y, y + size_t{a.tokens.end} * a.y_stride, -7.0f);
    }
    arena->upload();
    launch();
    arena->download();
    return {arena->at(args.front().y_off), arena->at(0) + arena->bytes()};
  }
  std::vector<float> x;
  std::vector<std::unique_ptr<HostBuffer>> weights;
  std::vector<std::unique_ptr<TiledTensor>> tiled;
  std::vector<MatmulArgs> args;
  std::unique_ptr<HostBuffer> arena;
};

// Siblings that `change` makes one launch unable to serve: siblings_fuse refuses them and
// matmul_siblings enqueues nothing (returns no event), leaving them to the matmuls apart.
template <typename Change>
void expect_siblings_refused(GpuKernels& kernels, const Siblings& sib, const char* why,
                             Change change) {
  std::vector<MatmulArgs> a = sib.args;
  change(a);
  EXPECT_FALSE(kernels.siblings_fuse(a)) << why;
  const uint64_t before = kernels.launches();
  EXPECT_EQ(kernels.matmul_siblings(sib.arena->mem(), a), nullptr) << why;
  EXPECT_EQ(kernels.launches(), before) << why << ": something was enqueued";
}

}  // namespace duet::gpu::testing
