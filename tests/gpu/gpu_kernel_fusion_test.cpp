// The GPU kernels' fused launches (services/gpu_svc/op_fusion.h, FusionTarget::gpu_kernels), run
// here on PoCL with GpuKernels::set_gpu_kernels (the kernels a discrete GPU runs, in copies mode
// with the packed layout and zero-copy with the file's):
// - GpuKernels::matmul_siblings over the GPU GEMVs (matmul_siblings_gpu.cl): sibling GEMVs of odd
//   row counts (31, 33, 257; and past 16384, the tall variants), 1 and 3 tokens, packed Q4_0 and
//   Q8_0, the file layout's Q4_0, Q8_0, F16 and F32, aligned F16 and F32, K-quant mixes, write the
//   bits of the GEMVs apart and nothing else, in one launch; what it must refuse, it refuses;
// - rope_pair and add_rmsnorm write the bits of rope, rope and add, rmsnorm;
// - through GpuRunner, prefill and decode steps with fusion give the logits of the same steps
//   with DUET_GPU_FUSE=0's ops apart, bit for bit, one launch fewer per op folded (Q8_0, Q4_0,
//   F16, a K-quant mix; gpu-only and, in copies mode, with the interpreter as the NPU taking half
//   of every matmul).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/model/shapes.h"
#include "core/program/program.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/op_fusion.h"
#include "tests/gpu/fusion_run.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kquant_test_util.h"
#include "tests/gpu/siblings.h"
#include "tests/support/arch_models.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"
#include "tests/support/temp_dir.h"

namespace duet::gpu {
namespace {

using test_support::tiny_fortune_path;
using testing::SiblingLayout;
using testing::Siblings;

// A PoCL device that copies in and out as a discrete GPU does (DeviceOptions::force_copies).
ClDevice& copying_device() {
  static std::unique_ptr<ClDevice> dev = [] {
    DeviceOptions o;
    o.force_copies = true;
    return ClDevice::open(o);
  }();
  return *dev;
}

// Floats of two byte ranges that differ.
size_t floats_differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t differ = 0;
  for (size_t i = 0; i + 4 <= std::min(a.size(), b.size()); i += 4)
    differ += std::memcmp(&a[i], &b[i], 4) != 0;
  return differ;
}

class GpuSiblingGemvs : public ::testing::Test {
 protected:
  void SetUp() override { kernels.set_gpu_kernels(true); }
  ClDevice& dev = shared_device();
  GpuKernels kernels{dev};
};

TEST_F(GpuSiblingGemvs, OneLaunchWritesTheBitsOfTheGemvsApartOnOddRowCounts) {
  struct Case {
    const char* what;
    std::vector<DType> types;
    std::vector<uint32_t> rows;
    uint32_t cols;
    bool packed;
    uint64_t w_off;
  };
  const Case cases[] = {
      {"packed Q4_0", {DType::Q4_0, DType::Q4_0, DType::Q4_0}, {31, 33, 257}, 96, true, 0},
      {"packed Q8_0", {DType::Q8_0, DType::Q8_0, DType::Q8_0}, {257, 31, 33}, 64, true, 0},
      {"packed Q8_0, tall", {DType::Q8_0, DType::Q8_0}, {16385, 16417}, 64, true, 0},
      {"file Q4_0", {DType::Q4_0, DType::Q4_0, DType::Q4_0}, {33, 257, 31}, 96, false, 2},
      {"file Q8_0", {DType::Q8_0, DType::Q8_0}, {31, 33}, 64, false, 2},
      {"aligned F16", {DType::F16, DType::F16, DType::F16}, {31, 33, 257}, 64, false, 0},
      {"aligned F16, tall", {DType::F16, DType::F16}, {16385, 16400}, 32, false, 0},
      {"file F16", {DType::F16, DType::F16}, {257, 31}, 64, false, 2},
      {"aligned F32", {DType::F32, DType::F32, DType::F32}, {33, 31, 257}, 32, false, 0},
      {"Q4_K_M's q, k, v", {DType::Q4_K, DType::Q4_K, DType::Q6_K}, {31, 257, 33}, 512, false, 0},
      {"Q5_K, Q6_K", {DType::Q5_K, DType::Q6_K}, {33, 31}, 256, false, 0},
      {"Q6_K, Q4_K", {DType::Q6_K, DType::Q4_K}, {1, 16}, 256, false, 0},
  };
  for (const Case& c : cases)
    for (const uint32_t tokens : {1u, 3u}) {
      SCOPED_TRACE(std::string(c.what) + ", " + std::to_string(tokens) + " tokens");
      Siblings sib(dev, c.types, c.rows, c.cols, {0, tokens},
                   c.packed ? SiblingLayout::packed : SiblingLayout::file, c.w_off);
      ASSERT_TRUE(kernels.siblings_fuse(sib.args));
      const auto apart = sib.outputs([&] {
        for (const MatmulArgs& a : sib.args) testing::run(kernels.matmul(sib.arena->mem(), a));
      });
      const uint64_t before = kernels.launches();
      const auto fused =
          sib.outputs([&] { testing::run(kernels.matmul_siblings(sib.arena->mem(), sib.args)); });
      EXPECT_EQ(kernels.launches() - before, 1u);
      EXPECT_EQ(floats_differing(apart, fused), 0u) << "of " << apart.size() / 4 << " floats";
      // Every segment wrote every token's rows.
      for (const MatmulArgs& a : sib.args)
        for (uint32_t t = 0; t < tokens; ++t)
          for (const uint32_t r : {0u, a.row_end - 1}) {
            float v;
            std::memcpy(&v, sib.arena->at(a.y_off + (uint64_t{t} * a.y_stride + r) * 4), 4);
            EXPECT_NE(v, -7.0f) << "row " << r << " token " << t;
          }
    }
}

TEST_F(GpuSiblingGemvs, WhatOneLaunchCannotDoIsLeftToTheGemvsApart) {
  Siblings sib(dev, {DType::Q8_0, DType::Q8_0, DType::Q8_0}, {31, 33, 16}, 64, {0, 1},
               SiblingLayout::packed);
  ASSERT_TRUE(kernels.siblings_fuse(sib.args));
  const auto refused = [&](const char* why, auto change) {
    testing::expect_siblings_refused(kernels, sib, why, change);
  };
  using Args = std::vector<MatmulArgs>;
  refused("one GEMV", [](Args& a) { a.resize(1); });
  refused("four GEMVs", [](Args& a) { a.push_back(a[0]); });
  refused("five tokens (no GEMV)", [](Args& a) {
    for (MatmulArgs& m : a) m.tokens = {0, 5};
  });
  refused("a row range", [](Args& a) { a[1].row_begin = 16; });
  refused("another input", [](Args& a) { a[1].x_off += 4 * a[1].k; });
  refused("an output over the input", [](Args& a) { a[2].y_off = a[2].x_off; });
  refused("two outputs over each other", [](Args& a) { a[1].y_off = a[0].y_off + 8; });
  refused("Logits rows", [](Args& a) { a[0].rows_from_table = true; });
  refused("the file layout beside the packed one", [](Args& a) { a[2].packed_rows = 0; });
  refused("another variant (a tall tensor)", [](Args& a) {
    a[1].row_end = a[1].packed_rows = 16385;  // the arguments only: never launched
  });
  Siblings mixed(dev, {DType::Q4_0, DType::Q8_0}, {31, 33}, 64, {0, 1}, SiblingLayout::packed);
  EXPECT_FALSE(kernels.siblings_fuse(mixed.args)) << "two GEMV kernels";
  Siblings q4k_q4_0(dev, {DType::Q4_K, DType::Q4_0}, {31, 33}, 256, {0, 1}, SiblingLayout::file);
  EXPECT_FALSE(kernels.siblings_fuse(q4k_q4_0.args)) << "the K-quant GEMV and gemv_coop4";
  // A group whose last GEMV differs: its first two still fuse (launch_fused tries them).
  Args three = sib.args;
  three[2].packed_rows = 0;
  EXPECT_FALSE(kernels.siblings_fuse(three));
  EXPECT_TRUE(kernels.siblings_fuse(std::span<const MatmulArgs>(three).first(2)));
  // A variant set by hand (gpu_bench's tuning) has no sibling kernel.
  kernels.set_gemv_variant("l64r4x");
  EXPECT_FALSE(kernels.siblings_fuse(sib.args));
  kernels.set_gemv_variant("");
  EXPECT_TRUE(kernels.siblings_fuse(sib.args));
}

// rope of Q and of K as one launch, and the residual add with the norm reading it, against the
// ops apart: the same bytes everywhere in the arena.
TEST_F(GpuSiblingGemvs, RopePairAndAddRmsnormWriteTheBitsOfTheOpsApart) {
  constexpr uint32_t kTokens = 3, kHeadDim = 64, kQHeads = 8, kKHeads = 2;
  testing::HostBuffer arena(dev, 1 << 20);
  auto* tok = arena.at<int32_t>(0);  // token table: id, position, sequence, logits row
  for (uint32_t t = 0; t < kTokens; ++t) {
    tok[4 * t] = 1;
    tok[4 * t + 1] = static_cast<int32_t>(7 + 1000 * t);
  }
  const auto factors = testing::random_floats(kHeadDim / 2, 5, 0.5f);
  std::vector<uint8_t> wbytes(4096);
  for (size_t i = 0; i < factors.size(); ++i) {
    const float f = 1.0f + factors[i];
    std::memcpy(&wbytes[i * 4], &f, 4);
  }
  const auto norm_w = testing::random_floats(2048, 9);
  std::memcpy(&wbytes[1024], norm_w.data(), 512 * 4);
  testing::HostBuffer w(dev, wbytes);
  const uint64_t q_off = 4096, k_off = q_off + kTokens * kQHeads * kHeadDim * 4;
  const auto fill = [&] {
    const auto v = testing::random_floats(65536, 17, 3.0f);
    std::memcpy(arena.at(4096), v.data(), v.size() * 4);
    arena.upload();
  };
  const auto snapshot = [&] {
    arena.download();
    return std::vector<uint8_t>(arena.at(0), arena.at(0) + arena.bytes());
  };
  for (const uint32_t mode : {0u, 2u})
    for (const bool with_factors : {false, true}) {
      SCOPED_TRACE("rope mode " + std::to_string(mode) + (with_factors ? ", factors" : ""));
      RopeArgs r;
      r.freq_base = 500000.0f;
      r.mode = mode;
      r.w = w.mem();
      r.has_factors = with_factors;
      fill();
      testing::run(kernels.rope(arena.mem(), q_off, kQHeads * kHeadDim, kQHeads, kHeadDim, r, 0,
                                {0, kTokens}));
      testing::run(kernels.rope(arena.mem(), k_off, kKHeads * kHeadDim, kKHeads, kHeadDim, r, 0,
                                {0, kTokens}));
      const auto apart = snapshot();
      fill();
      const uint64_t before = kernels.launches();
      testing::run(kernels.rope_pair(arena.mem(), q_off, kQHeads * kHeadDim, kQHeads, k_off,
                                     kKHeads * kHeadDim, kKHeads, kHeadDim, r, 0, {0, kTokens}));
      EXPECT_EQ(kernels.launches() - before, 1u);
      EXPECT_EQ(floats_differing(apart, snapshot()), 0u);
    }
  for (const uint32_t dim : {96u, 512u})
    for (const bool in_place : {true, false}) {
      // In place: the residual x = a + b over a, the norm's output over b (an arena slot reused).
      SCOPED_TRACE("add + rmsnorm of " + std::to_string(dim) + (in_place ? ", in place" : ""));
      const uint64_t a_off = 8192, b_off = a_off + 65536;
      const uint64_t x_off = in_place ? a_off : b_off + 65536;
      const uint64_t out_off = in_place ? b_off : x_off + 65536;
      const GpuKernels::ResidualAdd add{a_off, dim, b_off, dim};
      fill();
      testing::run(kernels.add(arena.mem(), a_off, dim, b_off, dim, x_off, dim, dim, {0, kTokens}));
      testing::run(kernels.rmsnorm(arena.mem(), x_off, dim, out_off, dim, w.mem(), 1024, dim, 1e-5f,
                                   {0, kTokens}));
      const auto apart = snapshot();
      fill();
      const uint64_t before = kernels.launches();
      testing::run(kernels.add_rmsnorm(arena.mem(), add, x_off, dim, out_off, dim, w.mem(), 1024,
                                       dim, 1e-5f, {0, kTokens}));
      EXPECT_EQ(kernels.launches() - before, 1u);
      EXPECT_EQ(floats_differing(apart, snapshot()), 0u);
    }
  // A norm writing over another token's add inputs would change what that token's add reads:
  // refused.
  const GpuKernels::ResidualAdd add{8192, 96, 8192 + 65536, 96};
  EXPECT_EQ(kernels.add_rmsnorm(arena.mem(), add, 8192, 96, 8192 + 65536 + 4, 96, w.mem(), 1024, 96,
                                1e-5f, {0, kTokens}),
            nullptr);
}

Plan weight_split_plan(const LlamaModel& m) {
  Plan p;
  p.name = "weight_split";
  for (int r = 0; r < kMatmulRoles; ++r) {
    p.matmul[r].strategy = Strategy::weight_split;
    p.matmul[r].gpu_rows = (r == 7 ? m.hp().n_vocab : m.hp().n_embd) / 2 + 3;
  }
  return p;
}

BuiltPrograms build(const LlamaModel& m, Plan plan) {
  return build_programs(test_support::program_spec(m, std::move(plan), 16, 128, "gpu-fusion-test"));
}

TEST(GpuKernelFusionPlan, ALlamaLayerFusesItsAddNormsRopesAndSiblings) {
  for (const char* variant : {"q4_0", "f16"}) {
    SCOPED_TRACE(variant);
    auto m = LlamaModel::load(tiny_fortune_path(variant));
    const BuiltPrograms b = build(*m, Plan::gpu_only());
    std::map<Fusion, int> count;
    for (const FusedGroup& g : plan_fusion(b.gpu, FusionTarget::gpu_kernels))
      if (g.kind != Fusion::none) ++count[g.kind];
    const int layers = m->hp().n_layer;
    EXPECT_EQ(count[Fusion::add_norm_quantize], 2 * layers);  // every norm after a residual add
    EXPECT_EQ(count[Fusion::rope_pair], layers);
    EXPECT_EQ(count[Fusion::sibling_matmuls], 2 * layers);  // q k v, gate up: F16 too
  }
}

// A prefill of 11 tokens and 3 decode steps of `plan` on `dev`'s GPU kernels (fusion_run.h).
testing::FusionRun run_steps(ClDevice& dev, const LlamaModel& m, const Plan& plan, bool fuse) {
  return testing::run_fusion_steps(dev, m, build(m, plan), fuse, FusionTarget::gpu_kernels,
                                   std::chrono::seconds(120));
}

void expect_same_bits(ClDevice& dev, const LlamaModel& m, const Plan& plan) {
  SCOPED_TRACE(plan.name + (dev.zero_copy() ? ", zero-copy" : ", copies"));
  const testing::FusionRun apart = run_steps(dev, m, plan, false);
  const testing::FusionRun fused = run_steps(dev, m, plan, true);
  EXPECT_EQ(apart.ops_folded, 0u);
  EXPECT_GT(fused.ops_folded, 0u);
  // A decode step: every op folded into another's launch is one kernel launch fewer...
  EXPECT_EQ(apart.launches - fused.launches, fused.ops_folded);
  // ... and every sibling group ran as one launch (their GEMVs are alike in these models).
  EXPECT_EQ(fused.matmuls_folded, fused.sibling_ops);
  EXPECT_GT(fused.sibling_ops, 0u);
  std::printf("%s, %s: a decode step's launches %u apart, %u fused\n", plan.name.c_str(),
              dev.zero_copy() ? "zero-copy" : "copies", apart.launches, fused.launches);
  ASSERT_EQ(apart.logits.size(), fused.logits.size());
  size_t differ = 0;
  for (size_t i = 0; i < apart.logits.size(); ++i)
    differ += std::memcmp(&apart.logits[i], &fused.logits[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << apart.logits.size() << " logits";
}

// Copies mode packs Q4_0/Q8_0 (the fast GEMVs, as on the H100); zero-copy keeps the file's
// layout (the cooperative GEMVs).
TEST(GpuKernelFusion, FusedStepsGiveTheBitsOfTheOpsApart) {
  for (const char* variant : {"q8_0", "q4_0", "f16"}) {
    SCOPED_TRACE(variant);
    auto m = LlamaModel::load(tiny_fortune_path(variant));
    expect_same_bits(copying_device(), *m, Plan::gpu_only());
    expect_same_bits(shared_device(), *m, Plan::gpu_only());
  }
  // The NPU (the interpreter) takes half of every matmul: a program that waits, whose fused
  // launches bring back every op's output in copies mode.
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  expect_same_bits(copying_device(), *m, weight_split_plan(*m));
}

TEST(GpuKernelFusion, FusedStepsGiveTheBitsOfTheOpsApartForAKQuantMix) {
  const test_support::TempDir dir("duet-gpu-kernel-fusion");
  auto m = LlamaModel::load(test_support::write_kquant_mix_model(dir.path(), "q4_k_m"));
  ASSERT_TRUE(dtype_is_k_quant(m->layers[0].wq.type));
  expect_same_bits(copying_device(), *m, Plan::gpu_only());
}

}  // namespace
}  // namespace duet::gpu
