// KV writes and the split (flash-decoding) attention of gpu_svc against ops::attention over the
// same K/V gathered into one contiguous cache, through scattered pages, for every KV value type
// (F32, F16, Q8_0), both kernel families (CPU-vectorised and portable) and the lengths where the
// chunking changes: 1, 15, 16, 17 keys, the first split (257), 1000+, past the largest chunk
// count (20000 keys), and a prefill larger than the partials' scratch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/model/ops.h"
#include "core/model/quant.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

constexpr uint32_t kHeads = 8, kKvHeads = 2, kHeadDim = 64, kKvDim = kKvHeads * kHeadDim,
                   kQDim = kHeads * kHeadDim;
constexpr uint32_t kPageTokens = 16, kLayers = 2, kLayer = 1;
constexpr uint64_t kPagesOffset = 256;

uint32_t row_bytes(DType t) {
  return static_cast<uint32_t>(dtype_row_bytes(t, kKvDim));
}

// The pages of two sequences in a scrambled order, so contiguous addressing reads wrong rows.
struct Pages {
  Pages(ClDevice& dev, DType type, uint32_t ctx)
      : type(type),
        cols((ctx + kPageTokens - 1) / kPageTokens),
        n_pages(2 * cols),
        page_bytes(uint64_t{kLayers} * 2 * kPageTokens * row_bytes(type)),
        buf(dev, kPagesOffset + n_pages * page_bytes) {}
  int32_t page(const int32_t* table, uint32_t seq, uint32_t pos) const {
    return table[seq * cols + pos / kPageTokens];
  }
  void fill_table(int32_t* table) const {
    for (uint32_t i = 0; i < n_pages; ++i)
      table[i] = static_cast<int32_t>((uint64_t{i} * 7919 + 3) % n_pages);
  }
  uint64_t row(const int32_t* table, uint32_t seq, uint32_t pos, uint32_t which) const {
    return kPagesOffset + uint64_t(page(table, seq, pos)) * page_bytes +
           ((kLayer * 2 + which) * kPageTokens + pos % kPageTokens) * row_bytes(type);
  }
  KvArgs args(uint64_t pt) const {
    return KvArgs{buf.mem(), kPagesOffset, page_bytes, kPageTokens, kKvDim, kLayer, pt, cols, type};
  }
  DType type;
  uint32_t cols, n_pages;
  uint64_t page_bytes;
  HostBuffer buf;
};

// What a KV page holds for these values: stored in `type` and read back.
std::vector<float> stored(DType type, const std::vector<float>& x) {
  std::vector<float> out(x.size());
  std::vector<uint8_t> row(row_bytes(type));
  for (size_t r = 0; r < x.size() / kKvDim; ++r) {
    quantize_row(type, &x[r * kKvDim], row.data(), kKvDim);
    dequantize_row(type, row.data(), &out[r * kKvDim], kKvDim);
  }
  return out;
}

struct Case {
  DType type;
  GpuKernels::AttentionKernel kernel;
};

const char* kernel_name(GpuKernels::AttentionKernel k) {
  switch (k) {
    case GpuKernels::AttentionKernel::shared:
      return "shared";
    case GpuKernels::AttentionKernel::per_head:
      return "per_head";
    case GpuKernels::AttentionKernel::portable:
      return "portable";
    case GpuKernels::AttentionKernel::work_group:
      return "work_group";
  }
  return "?";
}

class GpuAttentionTest : public ::testing::TestWithParam<Case> {
 protected:
  ClDevice& dev = shared_device();
  GpuKernels k{dev};
  void SetUp() override { k.set_attention_kernel(GetParam().kernel); }

  // A step of n tokens of sequence 0 at positions first_pos.. whose earlier K/V are in the pages:
  // kv_write, then attention; checks the pages and the output against the reference.
  void check_step(int32_t first_pos, uint32_t n) {
    const DType type = GetParam().type;
    const uint32_t ctx = static_cast<uint32_t>(first_pos) + n;
    Pages pages(dev, type, ctx);
    const uint64_t tok = 0, pt = uint64_t{n} * 16, q_off = pt + uint64_t{pages.n_pages} * 4,
                   k_off = q_off + uint64_t{n} * kQDim * 4,
                   v_off = k_off + uint64_t{n} * kKvDim * 4,
                   out_off = v_off + uint64_t{n} * kKvDim * 4;
    HostBuffer arena(dev, out_off + uint64_t{n} * kQDim * 4);
    auto* rows = arena.at<int32_t>(tok);
    for (uint32_t t = 0; t < n; ++t) {
      rows[4 * t + 0] = 0;
      rows[4 * t + 1] = first_pos + static_cast<int32_t>(t);
      rows[4 * t + 2] = 0;
      rows[4 * t + 3] = -1;
    }
    pages.fill_table(arena.at<int32_t>(pt));
    const auto k_all = random_floats(size_t{ctx} * kKvDim, ctx + 1),
               v_all = random_floats(size_t{ctx} * kKvDim, ctx + 2);
    for (uint32_t p = 0; p < static_cast<uint32_t>(first_pos); ++p) {
      quantize_row(type, &k_all[size_t{p} * kKvDim],
                   pages.buf.at(pages.row(arena.at<int32_t>(pt), 0, p, 0)), kKvDim);
      quantize_row(type, &v_all[size_t{p} * kKvDim],
                   pages.buf.at(pages.row(arena.at<int32_t>(pt), 0, p, 1)), kKvDim);
    }
    std::memcpy(arena.at(k_off), &k_all[size_t(first_pos) * kKvDim], size_t{n} * kKvDim * 4);
    std::memcpy(arena.at(v_off), &v_all[size_t(first_pos) * kKvDim], size_t{n} * kKvDim * 4);
    const auto q = random_floats(size_t{n} * kQDim, n + 5);
    std::memcpy(arena.at(q_off), q.data(), q.size() * 4);
    arena.upload();
    pages.buf.upload();
    const KvArgs kv = pages.args(pt);
    run(k.kv_write(arena.mem(), k_off, kKvDim, v_off, kKvDim, kv, tok, {0, n}));
    run(k.attention(arena.mem(), q_off, kQDim, out_off, kQDim, kv, tok, kHeads, kKvHeads, kHeadDim,
                    {0, n}, ctx));
    arena.download();
    pages.buf.download();
    // The pages hold this step's rows as the reference stores them.
    std::vector<uint8_t> want_row(row_bytes(type));
    for (uint32_t p = static_cast<uint32_t>(first_pos); p < ctx; ++p)
      for (uint32_t which = 0; which < 2; ++which) {
        quantize_row(type, &(which ? v_all : k_all)[size_t{p} * kKvDim], want_row.data(), kKvDim);
        ASSERT_EQ(std::memcmp(pages.buf.at(pages.row(arena.at<int32_t>(pt), 0, p, which)),
                              want_row.data(), want_row.size()),
                  0)
            << (which ? "V" : "K") << " at " << p;
      }
    std::vector<int32_t> pos(n);
    for (uint32_t t = 0; t < n; ++t) pos[t] = first_pos + static_cast<int32_t>(t);
    std::vector<float> want(size_t{n} * kQDim);
    ops::attention(q.data(), stored(type, k_all).data(), stored(type, v_all).data(),
                   static_cast<int>(n), pos.data(), kHeads, kKvHeads, kHeadDim, want.data());
    float worst = 0;
    for (size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::fabs(arena.at<float>(out_off)[i] - want[i]));
    EXPECT_LT(worst, 2e-5f) << "first_pos=" << first_pos << " n=" << n
                            << " chunks of the last: " << k.attention_chunks(ctx);
  }
};

TEST_P(GpuAttentionTest, DecodeMatchesReferenceAtEveryChunkingLength) {
  for (int32_t len : {1, 15, 16, 17, 256, 257, 1000, 1037}) check_step(len - 1, 1);
}

TEST_P(GpuAttentionTest, DecodePastTheLargestChunkCountMatchesReference) {
  ASSERT_EQ(k.attention_chunks(20000), GpuKernels::kAttnMaxChunks - 1);
  check_step(19999, 1);
}

// Rounding chunks up to 16 keys can leave a longer context fewer chunks than a shorter one (with
// 64-key chunks: 448 keys go in 7, 464 in 6 of 80): every token of the step keeps all of its.
TEST_P(GpuAttentionTest, PrefillWhoseEarlierTokensHaveMoreChunksMatchesReference) {
  k.set_attention_min_chunk_keys(64);
  ASSERT_GT(k.attention_chunks(448), k.attention_chunks(470));
  check_step(440, 30);
}

TEST_P(GpuAttentionTest, PrefillMatchesReference) {
  check_step(0, 33);
  check_step(240, 40);  // tokens with one and with two chunks in one step
}

// More tokens than the partials' scratch holds at once: the launches go by batches.
TEST_P(GpuAttentionTest, PrefillLargerThanTheScratchMatchesReference) {
  const size_t per_token = size_t{kHeads} * GpuKernels::kAttnMaxChunks * (kHeadDim + 2) * 4;
  const uint32_t n = static_cast<uint32_t>(GpuKernels::kAttnScratchBytes / per_token) + 40;
  check_step(300, n);
}

using AK = GpuKernels::AttentionKernel;
INSTANTIATE_TEST_SUITE_P(
    KvTypes, GpuAttentionTest,
    ::testing::Values(Case{DType::F32, AK::shared}, Case{DType::F16, AK::shared},
                      Case{DType::Q8_0, AK::shared}, Case{DType::F32, AK::per_head},
                      Case{DType::F16, AK::per_head}, Case{DType::Q8_0, AK::per_head},
                      Case{DType::F32, AK::portable}, Case{DType::F16, AK::portable},
                      Case{DType::Q8_0, AK::portable}, Case{DType::F32, AK::work_group},
                      Case{DType::F16, AK::work_group}, Case{DType::Q8_0, AK::work_group}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return std::string(dtype_name(i.param.type)) + "_" + kernel_name(i.param.kernel);
    });

// The chunks of a token are the work-groups the device's threads share, so they are as equal
// as multiples of 16 allow: 513 keys as 272 + 241, not 256 + 256 + 1 (two chunks of work on one
// thread while the other got one key).
TEST(GpuAttention, AContextIsSplitIntoChunksOfEqualSize) {
  GpuKernels k{shared_device()};
  for (uint32_t least : {k.attention_min_chunk_keys(), GpuKernels::kAttnMinChunkKeys,
                         GpuKernels::kAttnMinChunkKeysGpu}) {
    k.set_attention_min_chunk_keys(least);
    uint32_t most = 0;  // the most chunks of any context so far
    for (uint32_t keys = 1; keys <= 20000; keys += keys < 600 ? 1 : 37) {
      const uint32_t per = k.attention_chunk_keys(keys), chunks = k.attention_chunks(keys);
      ASSERT_EQ(per % 16, 0u) << keys;
      ASSERT_LE(chunks, GpuKernels::kAttnMaxChunks) << keys;
      if (chunks > 1) {
        ASSERT_GE(per, least) << keys;
      }
      // the last chunk is short by less than 16 keys a chunk
      ASSERT_LT(chunks * per - keys, 16 * chunks) << keys;
      // a step's launch has a chunk slot for every chunk of its tokens, the longest or not
      most = std::max(most, chunks);
      ASSERT_GE(k.attention_chunk_slots(keys), most) << keys;
    }
  }
  k.set_attention_min_chunk_keys(GpuKernels::kAttnMinChunkKeys);  // the CPU devices' least chunk
  EXPECT_EQ(k.attention_chunks(513), 2u);
  EXPECT_EQ(k.attention_chunk_keys(513), 272u);
  EXPECT_EQ(k.attention_chunks(255), 1u);
}

// A token's output bits depend on its position alone: the same decode token alone in a step and
// behind another sequence's prefill of 31 tokens.
TEST(GpuAttention, ATokensBitsDoNotDependOnTheOtherTokensOfTheStep) {
  ClDevice& dev = shared_device();
  GpuKernels k{dev};
  const DType type = DType::F16;
  const uint32_t ctx = 1200, n = 32;
  Pages pages(dev, type, ctx);
  const uint64_t tok = 0, pt = 1024, q_off = pt + uint64_t{pages.n_pages} * 4,
                 out_off = q_off + uint64_t{n} * kQDim * 4;
  HostBuffer arena(dev, out_off + uint64_t{n} * kQDim * 4);
  pages.fill_table(arena.at<int32_t>(pt));
  const auto kv_values = random_floats(size_t{ctx} * kKvDim, 9);
  for (uint32_t seq = 0; seq < 2; ++seq)
    for (uint32_t p = 0; p < ctx; ++p)
      for (uint32_t which = 0; which < 2; ++which)
        quantize_row(type, &kv_values[size_t{p} * kKvDim],
                     pages.buf.at(pages.row(arena.at<int32_t>(pt), seq, p, which)), kKvDim);
  const auto q = random_floats(size_t{n} * kQDim, 10);
  std::memcpy(arena.at(q_off), q.data(), q.size() * 4);
  auto* rows = arena.at<int32_t>(tok);
  // Step 1: sequence 1 at positions 0..30, then sequence 0 at 1199 (its q row is the last).
  for (uint32_t t = 0; t < n; ++t) {
    rows[4 * t + 1] = t + 1 < n ? static_cast<int32_t>(t) : static_cast<int32_t>(ctx - 1);
    rows[4 * t + 2] = t + 1 < n ? 1 : 0;
  }
  arena.upload();
  pages.buf.upload();
  run(k.attention(arena.mem(), q_off, kQDim, out_off, kQDim, pages.args(pt), tok, kHeads, kKvHeads,
                  kHeadDim, {0, n}, ctx));
  arena.download();
  std::vector<float> batched(arena.at<float>(out_off) + size_t{n - 1} * kQDim,
                             arena.at<float>(out_off) + size_t{n} * kQDim);
  // Step 2: that token alone.
  run(k.attention(arena.mem(), q_off, kQDim, out_off, kQDim, pages.args(pt), tok, kHeads, kKvHeads,
                  kHeadDim, {n - 1, n}, ctx));
  arena.download();
  EXPECT_EQ(std::memcmp(batched.data(), arena.at<float>(out_off) + size_t{n - 1} * kQDim,
                        size_t{kQDim} * 4),
            0);
}

// On a CPU device (PoCL) the default kernel serves a KV head's query heads together where the
// shape has a kernel for it (the suites above run it at 8 heads on 2 KV heads), and falls back
// to a work-item per head where it has none.
TEST(GpuAttention, TheSharedKernelServesTheHeadsOfAKvHeadTogether) {
  ClDevice& dev = shared_device();
  GpuKernels k{dev};
  if (k.attention_kernel_name(4, 2, 64, DType::F16) != "attention_split_cpu_f16")
    GTEST_SKIP() << "no CPU-vectorised attention on " << dev.info().name;
  EXPECT_EQ(k.attention_kernel_name(32, 8, 64, DType::F16), "attention_gqa_cpu_f16_4x4");
  EXPECT_EQ(k.attention_kernel_name(8, 2, 64, DType::Q8_0), "attention_gqa_cpu_q8_0_4x4");
  EXPECT_EQ(k.attention_kernel_name(16, 8, 128, DType::F32), "attention_gqa_cpu_f32_8x2");
  EXPECT_EQ(k.attention_kernel_name(4, 2, 64, DType::F16), "attention_split_cpu_f16");
  EXPECT_EQ(k.attention_kernel_name(8, 8, 128, DType::F16), "attention_split_cpu_f16");
  EXPECT_EQ(k.attention_kernel_name(8, 2, 72, DType::F16), "attention_split_f16");
  k.set_attention_kernel(GpuKernels::AttentionKernel::per_head);
  EXPECT_EQ(k.attention_kernel_name(32, 8, 64, DType::F16), "attention_split_cpu_f16");
  k.set_attention_kernel(GpuKernels::AttentionKernel::work_group);  // a GPU's default
  EXPECT_EQ(k.attention_kernel_name(32, 8, 64, DType::F16), "attention_split_wg_f16");
  EXPECT_EQ(k.attention_kernel_name(8, 2, 36, DType::F16), "attention_split_f16");
}

// The shared kernel does each head's arithmetic in the per-head kernel's order: the same bits,
// decode and a prefill step with one- and many-chunk tokens.
TEST(GpuAttention, SharedAndPerHeadKernelsGiveTheSameBits) {
  ClDevice& dev = shared_device();
  GpuKernels k{dev};
  if (k.attention_kernel_name(kHeads, kKvHeads, kHeadDim, DType::F16) !=
      "attention_gqa_cpu_f16_4x4")
    GTEST_SKIP() << "no shared attention kernel on " << dev.info().name;
  const uint32_t ctx = 1200, n = 24;
  Pages pages(dev, DType::F16, ctx);
  const uint64_t tok = 0, pt = 1024, q_off = pt + uint64_t{pages.n_pages} * 4,
                 out_off = q_off + uint64_t{n} * kQDim * 4;
  HostBuffer arena(dev, out_off + uint64_t{n} * kQDim * 4);
  pages.fill_table(arena.at<int32_t>(pt));
  const auto kv_values = random_floats(size_t{ctx} * kKvDim, 11);
  for (uint32_t p = 0; p < ctx; ++p)
    for (uint32_t which = 0; which < 2; ++which)
      quantize_row(DType::F16, &kv_values[size_t{p} * kKvDim],
                   pages.buf.at(pages.row(arena.at<int32_t>(pt), 0, p, which)), kKvDim);
  const auto q = random_floats(size_t{n} * kQDim, 12);
  std::memcpy(arena.at(q_off), q.data(), q.size() * 4);
  auto* rows = arena.at<int32_t>(tok);
  for (uint32_t t = 0; t < n; ++t) {  // positions 0..11 (one chunk) and 1188..1199 (five)
    rows[4 * t + 1] = static_cast<int32_t>(t < 12 ? t : ctx - n + t);
    rows[4 * t + 2] = 0;
  }
  arena.upload();
  pages.buf.upload();
  std::vector<std::vector<float>> outs;
  for (auto kernel : {GpuKernels::AttentionKernel::shared, GpuKernels::AttentionKernel::per_head}) {
    k.set_attention_kernel(kernel);
    run(k.attention(arena.mem(), q_off, kQDim, out_off, kQDim, pages.args(pt), tok, kHeads,
                    kKvHeads, kHeadDim, {0, n}, ctx));
    arena.download();
    outs.emplace_back(arena.at<float>(out_off), arena.at<float>(out_off) + size_t{n} * kQDim);
  }
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * 4), 0);
}

}  // namespace
}  // namespace duet::gpu
