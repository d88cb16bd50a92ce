// The runner's fused launches (services/gpu_svc/op_fusion.h): which ops of a program form a group,
// that no group spans a wait on the other device or hides a published flag, and that a step run
// with fused launches gives the very bits of the same step run op by op (DUET_GPU_FUSE=0), for
// prefill and decode, Q8_0, Q4_0 and a K-quant mix, gpu-only and with the reference interpreter
// as the NPU taking half of every matmul, with one kernel launch fewer per op folded. And
// GpuKernels::matmul_siblings alone: sibling matmuls of odd row counts (31, 33, 257), every type
// and type mix it takes, both ISAs and activation widths, write the bits of the matmuls apart,
// and nothing else; what it must refuse, it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/model/shapes.h"
#include "core/program/program.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/op_fusion.h"
#include "tests/gpu/fusion_run.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/kquant_test_util.h"
#include "tests/gpu/siblings.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet::gpu {
namespace {

using test_support::tiny_fortune_path;
using testing::SiblingLayout;
using testing::Siblings;

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
  return build_programs(test_support::program_spec(m, std::move(plan), 16, 128, "fusion-test"));
}

TEST(OpFusion, ALlamaLayerFusesItsNormsSwigluAndRopes) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  const BuiltPrograms b = build(*m, Plan::gpu_only());
  const std::vector<FusedGroup> plan = plan_fusion(b.gpu);
  ASSERT_EQ(plan.size(), b.gpu.ops.size());
  std::map<Fusion, int> count;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == Fusion::none) continue;
    ++count[plan[i].kind];
    const auto kind = [&](size_t j) { return b.gpu.ops[j]->kind; };
    switch (plan[i].kind) {
      case Fusion::add_norm_quantize:  // Add, RmsNorm, then the matmul reading the norm
        EXPECT_EQ(kind(i), fb::OpKind::Add);
        EXPECT_EQ(kind(i + 1), fb::OpKind::RmsNorm);
        EXPECT_TRUE(kind(i + 2) == fb::OpKind::MatMul || kind(i + 2) == fb::OpKind::Logits);
        break;
      case Fusion::norm_quantize:
        EXPECT_EQ(kind(i), fb::OpKind::RmsNorm);
        EXPECT_EQ(kind(i + 1), fb::OpKind::MatMul);
        break;
      case Fusion::swiglu_quantize:
        EXPECT_EQ(kind(i), fb::OpKind::SwiGlu);
        EXPECT_EQ(kind(i + 1), fb::OpKind::MatMul);
        break;
      case Fusion::rope_pair:
        EXPECT_EQ(kind(i), fb::OpKind::Rope);
        EXPECT_EQ(kind(i + 1), fb::OpKind::Rope);
        break;
      case Fusion::sibling_matmuls:  // Q, K, V or gate, up: matmuls of the same input
        for (size_t j = i; j < i + plan[i].ops; ++j) {
          EXPECT_EQ(kind(j), fb::OpKind::MatMul);
          EXPECT_EQ(b.gpu.ops[j]->in0->offset(), b.gpu.ops[i]->in0->offset());
        }
        EXPECT_TRUE(plan[i].ops == 3 || plan[i].ops == 2) << plan[i].ops;
        break;
      case Fusion::none:
        break;
    }
  }
  const int layers = m->hp().n_layer;
  // Layer 0's attention norm follows the embedding (no add); every later norm follows a
  // residual add, and so does the output norm.
  EXPECT_EQ(count[Fusion::norm_quantize], 1);
  EXPECT_EQ(count[Fusion::add_norm_quantize], 2 * layers);
  EXPECT_EQ(count[Fusion::swiglu_quantize], layers);
  EXPECT_EQ(count[Fusion::rope_pair], layers);
  EXPECT_EQ(count[Fusion::sibling_matmuls], 2 * layers);  // q k v, gate up
}

TEST(OpFusion, NoGroupSpansAWaitOrHidesAFlag) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  const BuiltPrograms b = build(*m, weight_split_plan(*m));
  const std::vector<FusedGroup> plan = plan_fusion(b.gpu);
  int groups = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == Fusion::none) continue;
    ++groups;
    const bool quantize =
        plan[i].kind != Fusion::rope_pair && plan[i].kind != Fusion::sibling_matmuls;
    // A tensor plan's split matmuls (row ranges) are never siblings; the matmuls it leaves
    // wholly on the GPU (here K and V: fewer rows than the split's) may be.
    if (plan[i].kind == Fusion::sibling_matmuls)
      for (size_t j = i; j < i + plan[i].ops; ++j) {
        const fb::OpT& mm = *b.gpu.ops[j];
        EXPECT_TRUE(mm.row_begin == 0 && (mm.row_end == 0 || mm.row_end == mm.weight->rows()))
            << "op " << j << " is a row range of its tensor";
      }
    const size_t end = i + plan[i].ops + (quantize ? 1 : 0);  // the matmul fed, included
    ASSERT_LE(end, b.gpu.ops.size());
    for (size_t j = i + 1; j < end; ++j)
      EXPECT_TRUE(b.gpu.ops[j]->wait_flags.empty()) << "op " << j << " waits inside a group";
    for (size_t j = i; j + 1 < i + plan[i].ops; ++j)
      EXPECT_LT(b.gpu.ops[j]->publish_flag, 0) << "op " << j << "'s flag would be hidden";
  }
  EXPECT_GT(groups, 0);  // the ropes and the norms still fuse between the split matmuls
}

TEST(OpFusion, TheSwitchIsZeroOrOne) {
  {
    const testing::ScopedEnv off("DUET_GPU_FUSE", "0");
    EXPECT_FALSE(fusion_from_env());
  }
  {
    const testing::ScopedEnv on("DUET_GPU_FUSE", "1");
    EXPECT_TRUE(fusion_from_env());
  }
  const testing::ScopedEnv bad("DUET_GPU_FUSE", "yes");
  try {
    fusion_from_env();
    FAIL() << "DUET_GPU_FUSE=yes was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("DUET_GPU_FUSE"), std::string::npos) << e.what();
  }
}

// A prefill of 11 tokens and 3 decode steps of `plan` on the CPU integer path (fusion_run.h).
testing::FusionRun run_steps(const LlamaModel& m, const Plan& plan, bool fuse,
                             bool chains = false) {
  return testing::run_fusion_steps(shared_device(), m, build(m, plan), fuse,
                                   FusionTarget::cpu_integer, std::chrono::seconds(60), chains);
}

size_t logits_differing(const testing::FusionRun& a, const testing::FusionRun& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.logits.size(); ++i)
    differ += std::memcmp(&a.logits[i], &b.logits[i], sizeof(float)) != 0;
  return differ;
}

void expect_same_bits(const LlamaModel& m, const Plan& plan) {
  SCOPED_TRACE(plan.name);
  const testing::FusionRun apart = run_steps(m, plan, false);
  const testing::FusionRun fused = run_steps(m, plan, true);
  EXPECT_EQ(apart.ops_folded, 0u);
  if (GpuKernels(shared_device()).int8_matmul()) {
    EXPECT_GT(fused.ops_folded, 0u);
    // A decode step: every op folded into another's launch, and every input quantisation folded
    // into its producer, is one kernel launch fewer.
    EXPECT_EQ(apart.launches - fused.launches, fused.ops_folded + fused.quantize_groups);
    // Every sibling group of the decode step ran as one launch.
    EXPECT_EQ(fused.matmuls_folded, fused.sibling_ops);
    EXPECT_GT(fused.sibling_ops, 0u);
  }
  ASSERT_EQ(apart.logits.size(), fused.logits.size());
  EXPECT_EQ(logits_differing(apart, fused), 0u) << "of " << apart.logits.size() << " logits";
  // Step chains (the default in serving): a decode step's ops as one kernel (or a few),
  // spinning between stages; a plan whose programs wait for the other device keeps its launches.
  const testing::FusionRun chained = run_steps(m, plan, true, /*chains=*/true);
  ASSERT_EQ(apart.logits.size(), chained.logits.size());
  EXPECT_EQ(logits_differing(apart, chained), 0u) << "of " << apart.logits.size() << " logits";
  if (GpuKernels(shared_device()).int8_matmul() && plan.name == Plan::gpu_only().name) {
    // The embedding, one chain, the output projection (StepChains below has the detail).
    EXPECT_LE(chained.launches, 3u) << chained.launches << " vs " << fused.launches;
  }
}

TEST(OpFusion, FusedStepsGiveTheBitsOfTheOpsApart) {
  for (const char* variant : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(variant);
    auto m = LlamaModel::load(tiny_fortune_path(variant));
    expect_same_bits(*m, Plan::gpu_only());
    expect_same_bits(*m, weight_split_plan(*m));
  }
}

TEST(OpFusion, FusedStepsGiveTheBitsOfTheOpsApartForAKQuantMix) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("duet-gpu-fusion-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  SyntheticModelOptions o;
  o.preset = "q4_k_m";
  o.n_vocab = 2048;
  o.n_ctx = 128;
  const std::string path = (dir / "q4_k_m.gguf").string();
  write_synthetic_model(model_shape("tiny-llama3-256"), o, path);
  {
    auto m = LlamaModel::load(path);
    expect_same_bits(*m, Plan::gpu_only());
    // 8-bit activations for some roles: the fused quantisation follows the matmul's role.
    const testing::ScopedEnv mixed("DUET_GPU_INT8_ACT_BITS", "16,o=8,gate=8,up=8,logits=8");
    expect_same_bits(*m, Plan::gpu_only());
  }
  std::filesystem::remove_all(dir);
}

// Step chains hold a decode step's rope, KV writes and attention too: every CPU attention kernel
// (per head: head_dim 32; GQA of 4 heads at head_dim 64, of 2 at 128), every KV value type, the
// keys in one chunk and in two (the merge as a stage of its own) give the bits of the kernels
// apart, and a gpu-only decode step is a few launches.
TEST(StepChains, RopeKvWriteAndAttentionAsStagesGiveTheBitsOfTheKernelsApart) {
  if (!GpuKernels(shared_device()).int8_matmul()) GTEST_SKIP() << "no integer path here";
  const auto dir =
      std::filesystem::temp_directory_path() / ("duet-gpu-chains-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const ModelShape gqa4{"tiny-gqa4", 2048, 512, 2, 512, 8, 2, 128, 10000.0f};
  const ModelShape gqa2{"tiny-gqa2", 2048, 512, 2, 512, 4, 2, 128, 10000.0f};
  std::vector<std::pair<std::string, std::string>> models = {
      {"split_cpu (head_dim 32)", tiny_fortune_path("q8_0")}};
  for (const ModelShape* shape : {&gqa4, &gqa2}) {
    SyntheticModelOptions o;
    const std::string path = (dir / (shape->name + ".gguf")).string();
    write_synthetic_model(*shape, o, path);
    models.emplace_back(shape->name, path);
  }
  for (const auto& [name, path] : models) {
    auto m = LlamaModel::load(path);
    const uint32_t heads = m->hp().n_head, kv_heads = m->hp().n_head_kv;
    const uint32_t head_dim = m->hp().n_embd / heads;
    for (DType kv : {DType::F32, DType::F16, DType::Q8_0}) {
      const std::string kernel =
          GpuKernels(shared_device()).attention_kernel_name(heads, kv_heads, head_dim, kv);
      ProgramSpec spec = test_support::program_spec(*m, Plan::gpu_only(), 40, 128, "chain-test");
      spec.kv_type = kv;
      const BuiltPrograms built = build_programs(spec);
      for (uint32_t min_keys : {0u, 16u}) {
        SCOPED_TRACE(name + ", " + kernel + ", least chunk keys " + std::to_string(min_keys));
        const auto run = [&](bool chains) {
          return testing::run_fusion_steps(shared_device(), *m, built, true,
                                           FusionTarget::cpu_integer, std::chrono::seconds(60),
                                           chains, min_keys);
        };
        const testing::FusionRun apart = run(false), chained = run(true);
        ASSERT_EQ(apart.logits.size(), chained.logits.size());
        EXPECT_EQ(logits_differing(apart, chained), 0u) << "of " << apart.logits.size();
        // The embedding, one chain of every layer's ops, the output projection (it publishes
        // the logits): not one launch or more a layer.
        EXPECT_LE(chained.launches, 3u);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

// The sibling matmuls' launch: one token, the third row of the arena's input (rows 0 and 1 unused).
constexpr uint32_t kToken = 2;
constexpr TokenRange kLaunch{kToken, kToken + 1};

TEST(SiblingMatmuls, OneLaunchWritesTheBitsOfTheMatmulsApartOnOddRowCounts) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  if (!testing::int8_path_available(kernels)) GTEST_SKIP() << "no integer path here";
  const std::vector<GpuKernels::Int8Isa> isas = testing::integer_isas(kernels);
  struct Case {
    std::vector<DType> types;
    std::vector<uint32_t> rows;
    uint32_t cols;
  };
  const Case cases[] = {
      {{DType::Q4_0, DType::Q4_0, DType::Q4_0}, {31, 33, 257}, 96},
      {{DType::Q8_0, DType::Q8_0, DType::Q8_0}, {257, 31, 33}, 64},
      {{DType::Q4_K, DType::Q4_K, DType::Q6_K}, {31, 257, 33}, 512},  // Q4_K_M's q, k, v
      {{DType::Q5_K, DType::Q6_K}, {33, 31}, 256},
      {{DType::Q6_K, DType::Q4_K}, {1, 16}, 256},
  };
  for (const Case& c : cases) {
    Siblings sib(dev, c.types, c.rows, c.cols, kLaunch, SiblingLayout::tiled);
    for (const GpuKernels::Int8Isa isa : isas)
      for (const int bits : {8, 16}) {
        SCOPED_TRACE(std::string(dtype_name(c.types.front())) + " then " +
                     std::string(dtype_name(c.types.back())) + " " +
                     GpuKernels::int8_isa_name(isa) + " a" + std::to_string(bits));
        kernels.set_int8_isa(isa);
        kernels.set_int8_act_bits(bits);
        ASSERT_TRUE(kernels.siblings_fuse(sib.args));
        const auto apart = sib.outputs([&] {
          for (const MatmulArgs& a : sib.args) testing::run(kernels.matmul(sib.arena->mem(), a));
        });
        const uint64_t before = kernels.launches();
        const auto fused =
            sib.outputs([&] { testing::run(kernels.matmul_siblings(sib.arena->mem(), sib.args)); });
        EXPECT_EQ(kernels.launches() - before, 2u);  // the quantisation, then the one matmul
        ASSERT_EQ(apart.size(), fused.size());
        size_t differ = 0;
        for (size_t i = 0; i < apart.size(); i += 4)
          differ += std::memcmp(&apart[i], &fused[i], 4) != 0;
        EXPECT_EQ(differ, 0u) << "of " << apart.size() / 4 << " floats";
        const float* y0 = reinterpret_cast<const float*>(fused.data());
        EXPECT_NE(y0[size_t{kToken} * sib.args[0].y_stride], -7.0f);  // it wrote
      }
  }
}

TEST(SiblingMatmuls, WhatOneLaunchCannotDoIsLeftToTheMatmulsApart) {
  ClDevice& dev = shared_device();
  GpuKernels kernels(dev);
  if (!testing::int8_path_available(kernels)) GTEST_SKIP() << "no integer path here";
  Siblings sib(dev, {DType::Q4_K, DType::Q6_K, DType::Q4_K}, {31, 33, 16}, 256, kLaunch,
               SiblingLayout::tiled);
  ASSERT_TRUE(kernels.siblings_fuse(sib.args));
  const auto refused = [&](const char* why, auto change) {
    testing::expect_siblings_refused(kernels, sib, why, change);
  };
  using Args = std::vector<MatmulArgs>;
  refused("one matmul", [](Args& a) { a.resize(1); });
  refused("four matmuls", [](Args& a) { a.push_back(a[0]); });
  refused("two tokens (a prefill)", [](Args& a) {
    for (MatmulArgs& m : a) m.tokens = {1, 3};
  });
  refused("a row range", [](Args& a) { a[1].row_begin = 16; });
  refused("no tiled copy", [](Args& a) { a[2].tiled = nullptr; });
  refused("another input", [](Args& a) { a[1].x_off += 4 * a[1].k; });
  refused("an output over the input", [](Args& a) {  // the token's output row at its input row
    a[2].y_off = a[2].x_off + uint64_t{kToken} * (a[2].k - a[2].y_stride) * 4;
  });
  refused("two outputs over each other", [](Args& a) { a[1].y_off = a[0].y_off + 8; });
  refused("Logits rows", [](Args& a) { a[0].rows_from_table = true; });
  kernels.set_int8_act_bits(MatmulRole::o, 8);  // the others keep 16
  refused("another activation width", [](Args& a) { a[1].role = MatmulRole::o; });
  Siblings mixed(dev, {DType::Q4_0, DType::Q8_0}, {31, 33}, 64, kLaunch, SiblingLayout::tiled);
  EXPECT_FALSE(kernels.siblings_fuse(mixed.args)) << "Q4_0 and Q8_0 quantise their input apart";
}

}  // namespace
}  // namespace duet::gpu
