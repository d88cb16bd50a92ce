// The runner's fused launches (services/gpu_svc/op_fusion.h): which ops of a program form a group,
// that no group spans a wait on the other device or hides a published flag, and that a step run
// with fused launches gives the very bits of the same step run op by op (DUET_GPU_FUSE=0), for
// prefill and decode, Q8_0, Q4_0 and a K-quant mix, gpu-only and with the reference interpreter
// as the NPU taking half of every matmul.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/model/shapes.h"
#include "core/program/program.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/op_fusion.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet::gpu {
namespace {

using test_support::tiny_fortune_path;

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
}

TEST(OpFusion, NoGroupSpansAWaitOrHidesAFlag) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  const BuiltPrograms b = build(*m, weight_split_plan(*m));
  const std::vector<FusedGroup> plan = plan_fusion(b.gpu);
  int groups = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (plan[i].kind == Fusion::none) continue;
    ++groups;
    const bool quantize = plan[i].kind != Fusion::rope_pair;
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

// A prefill of 11 tokens and 3 decode steps of `plan`, fused or not: every step's logits, and
// how many ops of the last step a fused launch did (no span of their own).
struct Run {
  std::vector<float> logits;
  size_t ops_folded = 0;
};

Run run_steps(const LlamaModel& m, const Plan& plan, bool fuse) {
  ClDevice& dev = shared_device();
  const BuiltPrograms built = build(m, plan);
  testing::HostBuffer arena(dev, built.arena.bytes), kv(dev, built.kv.bytes());
  const ProgramMemory mem{arena.at(0),      built.arena.bytes, kv.at(0),
                          built.kv.bytes(), m.file().data(),   m.file().size()};
  test_support::fill_page_table(mem.arena, built, test_support::PageOrder::reversed);
  test_support::LocalFlags flags(4096, std::chrono::seconds(30));
  GpuRunner runner(dev, nullptr);
  runner.set_fusion(fuse);
  runner.register_program(1, built.gpu, mem);
  Run out;
  uint64_t seq = 0;
  auto step = [&](const std::vector<int32_t>& tokens, int pos) {
    test_support::write_token_rows(mem.arena, built, tokens, pos,
                                   test_support::LogitsRows::every_token);
    const StepArgs args =
        test_support::step_args(built, ++seq, static_cast<uint32_t>(tokens.size()));
    StepReport report;
    test_support::run_both_halves(
        [&] {
          if (!built.npu.ops.empty()) interpret_program(built.npu, mem, args, flags);
        },
        [&] { report = runner.run_step(1, args, std::chrono::seconds(60), &flags); });
    const float* l = reinterpret_cast<const float*>(mem.arena + built.arena.logits);
    out.logits.insert(out.logits.end(), l, l + tokens.size() * m.hp().n_vocab);
    out.ops_folded = 0;
    for (const OpTiming& op : report.ops) out.ops_folded += op.start_ns == 0 && op.end_ns == 0;
  };
  step({1, 703, 1975, 310, 263, 1243, 322, 42, 17, 5, 900}, 0);
  int pos = 11;
  for (int32_t tok : {100, 7, 1500}) step({tok}, pos++);
  return out;
}

void expect_same_bits(const LlamaModel& m, const Plan& plan) {
  SCOPED_TRACE(plan.name);
  const Run apart = run_steps(m, plan, false);
  const Run fused = run_steps(m, plan, true);
  EXPECT_EQ(apart.ops_folded, 0u);
  if (GpuKernels(shared_device()).int8_matmul()) {
    EXPECT_GT(fused.ops_folded, 0u);
  }
  ASSERT_EQ(apart.logits.size(), fused.logits.size());
  size_t differ = 0;
  for (size_t i = 0; i < apart.logits.size(); ++i)
    differ += std::memcmp(&apart.logits[i], &fused.logits[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << apart.logits.size() << " logits";
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

}  // namespace
}  // namespace duet::gpu
