// Programs built for every plan shape, run by the reference interpreter on two threads (one
// per device) with real cross-thread flag waits, give the oracle's logits.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/program/program.h"
#include "tests/support/arch_models.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet {
namespace {

using test_support::LocalFlags;
using test_support::tiny_fortune_path;

// Runs prompt (all logits) then `decode` greedy-forced steps of the given ids through the
// programs of `plan`, returning every logits row produced.
class ProgramRun {
 public:
  ProgramRun(const LlamaModel& m, Plan plan, uint32_t max_tokens)
      : m_(m),
        built_(build_programs(
            test_support::program_spec(m, std::move(plan), max_tokens, 128, "test"))),
        host_(built_, m) {
    validate_program(built_.gpu, host_.mem);
    validate_program(built_.npu, host_.mem);
    test_support::fill_page_table(host_.arena.data(), built_);
  }

  // Appends tokens at pos; returns logits for every token.
  std::vector<float> step(const std::vector<int32_t>& tokens, int pos) {
    return test_support::interpret_step(built_, host_, flags_, ++seq_, tokens, pos,
                                        m_.hp().n_vocab);
  }

  const BuiltPrograms& built() const { return built_; }

 private:
  const LlamaModel& m_;
  BuiltPrograms built_;
  test_support::HostProgramMemory host_;
  LocalFlags flags_{4096};
  uint64_t seq_ = 0;
};

Plan split_plan(const LlamaModel& m, Strategy s) {
  Plan p;
  p.name = std::string(strategy_name(s));
  for (int r = 0; r < kMatmulRoles; ++r) {
    Placement& pl = p.matmul[r];
    pl.strategy = s;
    pl.gpu_rows = (r == 7 ? m.hp().n_vocab : m.hp().n_embd) / 2 + 3;  // deliberately ragged
    pl.npu_tokens = 4;
  }
  return p;
}

void expect_matches_reference(const LlamaModel& m, Plan plan) {
  const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 1892, 322, 42};
  const std::vector<int32_t> decode = {100, 7, 1500};
  ProgramRun run(m, plan, 16);
  ReferenceForward ref(m, 128);
  const int V = m.hp().n_vocab;

  std::vector<float> got = run.step(prompt, 0);
  std::vector<float> want = ref.forward(prompt, true);
  ASSERT_EQ(got.size(), want.size());
  float max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i)
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
  EXPECT_LT(max_diff, 1e-3) << plan.name << " prefill";

  int pos = static_cast<int>(prompt.size());
  for (int32_t tok : decode) {
    got = run.step({tok}, pos++);
    want = ref.forward(std::vector<int32_t>{tok}, false);
    max_diff = 0;
    for (int i = 0; i < V; ++i) max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    EXPECT_LT(max_diff, 1e-3) << plan.name << " decode at " << pos;
  }
}

TEST(ProgramBuilder, GpuOnlyHasNoNpuOpsAndNoFlagWaits) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  ProgramSpec spec;
  spec.model = m.get();
  spec.max_tokens = 8;
  BuiltPrograms b = build_programs(spec);
  EXPECT_TRUE(b.npu.ops.empty());
  // 1 embed + per layer 16 ops (2 norms, q k v, 2 ropes, kv write, attention, o, add, gate, up,
  // swiglu, down, add) + final norm + logits
  EXPECT_EQ(b.gpu.ops.size(), 1u + 16u * m->hp().n_layer + 2u);
  for (const auto& op : b.gpu.ops) EXPECT_TRUE(op->wait_flags.empty());
  EXPECT_EQ(b.done_flags.size(), 1u);
}

TEST(ProgramBuilder, SplitPlansInsertCrossDeviceWaitsBothWays) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  ProgramSpec spec;
  spec.model = m.get();
  spec.max_tokens = 8;
  spec.plan = Plan::npu_only();
  BuiltPrograms b = build_programs(spec);
  ASSERT_FALSE(b.npu.ops.empty());
  size_t gpu_waits = 0, npu_waits = 0;
  for (const auto& op : b.gpu.ops) gpu_waits += op->wait_flags.size();
  for (const auto& op : b.npu.ops) npu_waits += op->wait_flags.size();
  EXPECT_GT(gpu_waits, 0u);  // GPU reads NPU matmul outputs
  EXPECT_GT(npu_waits, 0u);  // NPU reads GPU norms, and must not overwrite what the GPU still reads
  EXPECT_EQ(b.done_flags.size(), 2u);
  for (const auto& op : b.npu.ops)
    EXPECT_TRUE(op->kind == fb::OpKind::MatMul || op->kind == fb::OpKind::Logits);
}

TEST(ProgramInterpreter, EveryPlanShapeMatchesTheReferenceForward) {
  for (const char* variant : {"f16", "q8_0", "q4_0"}) {
    auto m = LlamaModel::load(tiny_fortune_path(variant));
    SCOPED_TRACE(variant);
    expect_matches_reference(*m, Plan::gpu_only());
    expect_matches_reference(*m, Plan::npu_only());
    for (Strategy s : {Strategy::weight_split, Strategy::activation_split, Strategy::hybrid})
      expect_matches_reference(*m, split_plan(*m, s));
  }
}

const test_support::ArchModelDirCleanup arch_model_cleanup;

TEST(ProgramInterpreter, EveryArchitectureInEveryPlanShapeMatchesTheReferenceForward) {
  for (const auto& am : test_support::arch_models()) {
    for (DType type : {DType::F16, DType::Q8_0, DType::Q4_0}) {
      auto m = LlamaModel::load(test_support::arch_model_path(am, type));
      SCOPED_TRACE(am.name + " " + std::string(dtype_name(type)));
      expect_matches_reference(*m, Plan::gpu_only());
      expect_matches_reference(*m, Plan::npu_only());
      for (Strategy s : {Strategy::weight_split, Strategy::activation_split, Strategy::hybrid})
        expect_matches_reference(*m, split_plan(*m, s));
    }
  }
}

TEST(ProgramBuilder, BiasesFollowTheirMatmulOnTheGpuAndRopeCarriesTheModelsScaling) {
  auto qwen2 =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[0], DType::Q8_0));
  ProgramSpec spec;
  spec.model = qwen2.get();
  spec.max_tokens = 8;
  spec.plan = Plan::npu_only();
  BuiltPrograms b = build_programs(spec);
  size_t biases = 0;
  for (const auto& op : b.gpu.ops) {
    if (op->kind == fb::OpKind::AddBias) {
      ++biases;
      EXPECT_FALSE(op->wait_flags.empty());  // after the NPU's q/k/v matmul
    }
    if (op->kind == fb::OpKind::Rope) {
      EXPECT_EQ(op->rope_mode, static_cast<uint8_t>(ops::RopeMode::neox));
      EXPECT_EQ(op->freq_factors, nullptr);
    }
  }
  EXPECT_EQ(biases, 3u * qwen2->hp().n_layer);
  for (const auto& op : b.npu.ops) EXPECT_NE(op->kind, fb::OpKind::AddBias);

  auto llama3 =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[2], DType::Q8_0));
  spec.model = llama3.get();
  b = build_programs(spec);
  int ropes = 0;
  for (const auto& op : b.gpu.ops) {
    EXPECT_NE(op->kind, fb::OpKind::AddBias);
    if (op->kind != fb::OpKind::Rope) continue;
    ++ropes;
    EXPECT_EQ(op->rope_mode, static_cast<uint8_t>(ops::RopeMode::normal));
    ASSERT_NE(op->freq_factors, nullptr);
    EXPECT_EQ(op->freq_factors->offset(), llama3->offset_of(llama3->rope_freqs));
    EXPECT_EQ(op->freq_factors->cols(), 16u);
  }
  EXPECT_EQ(ropes, 2 * llama3->hp().n_layer);

  auto linear =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[3], DType::Q8_0));
  spec.model = linear.get();
  b = build_programs(spec);
  for (const auto& op : b.gpu.ops) {
    if (op->kind == fb::OpKind::Rope) {
      EXPECT_EQ(op->freq_scale, 0.25f);
    }
  }
}

TEST(ProgramValidation, RejectsBadRopeFieldsAndBiases) {
  auto m =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[2], DType::Q8_0));
  ProgramSpec spec;
  spec.model = m.get();
  spec.max_tokens = 4;
  auto expect_rejected = [&](const std::function<void(fb::ProgramT&)>& corrupt,
                             const std::string& message) {
    BuiltPrograms b = build_programs(spec);
    test_support::HostProgramMemory host(b, *m);
    validate_program(b.gpu, host.mem);
    corrupt(b.gpu);
    try {
      validate_program(b.gpu, host.mem);
      ADD_FAILURE() << "accepted: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  auto first = [](fb::ProgramT& p, fb::OpKind kind) -> fb::OpT& {
    for (auto& op : p.ops)
      if (op->kind == kind) return *op;
    throw Error(Errc::not_found, "no such op");
  };
  expect_rejected([&](fb::ProgramT& p) { first(p, fb::OpKind::Rope).rope_mode = 1; },
                  "unknown rope mode 1");
  expect_rejected([&](fb::ProgramT& p) { first(p, fb::OpKind::Rope).freq_scale = 0.0f; },
                  "freq_scale must be positive");
  expect_rejected(
      [&](fb::ProgramT& p) {
        fb::OpT& op = first(p, fb::OpKind::Rope);
        const fb::TensorRef f = *op.freq_factors;
        op.freq_factors =
            std::make_unique<fb::TensorRef>(f.segment(), f.dtype(), f.offset(), f.rows(), 8, 0);
      },
      "rope freq_factors must be one F32 weights row of head_dim/2 = 16 values");
  expect_rejected(
      [&](fb::ProgramT& p) {
        fb::OpT& op = first(p, fb::OpKind::Rope);
        const fb::TensorRef f = *op.freq_factors;
        op.freq_factors = std::make_unique<fb::TensorRef>(fb::SegmentKind::Arena, f.dtype(), 0,
                                                          f.rows(), f.cols(), 0);
      },
      "rope freq_factors must be one F32 weights row");
  expect_rejected(
      [&](fb::ProgramT& p) {
        fb::OpT& norm = first(p, fb::OpKind::RmsNorm);
        norm.freq_factors =
            std::make_unique<fb::TensorRef>(*first(p, fb::OpKind::Rope).freq_factors);
      },
      "freq_factors on an op that is not Rope");
  expect_rejected(
      [&](fb::ProgramT& p) {
        // A bias narrower than the tensor it is added to.
        fb::OpT& mm = first(p, fb::OpKind::MatMul);
        auto op = std::make_unique<fb::OpT>();
        op->kind = fb::OpKind::AddBias;
        op->in0 = std::make_unique<fb::TensorRef>(*mm.out);
        op->out = std::make_unique<fb::TensorRef>(*mm.out);
        op->weight = std::make_unique<fb::TensorRef>(fb::SegmentKind::Weights, fb::DTypeCode::F32,
                                                     m->offset_of(m->rope_freqs), 1, 16, 0);
        p.ops.push_back(std::move(op));
      },
      "bias must be one F32 row as wide as its input");
  expect_rejected([&](fb::ProgramT& p) { first(p, fb::OpKind::SwiGlu).ffn_act = 2; },
                  "unknown ffn activation 2");
  expect_rejected([&](fb::ProgramT& p) { first(p, fb::OpKind::RmsNorm).scale = 2.0f; },
                  "scale on an op that is not Embed");
  expect_rejected([&](fb::ProgramT& p) { first(p, fb::OpKind::Embed).scale = INFINITY; },
                  "scale is not finite");
}

// Gemma's program: the embedding lookup carries sqrt(n_embd), every gated FFN op GELU; the other
// architectures' keep 1 and SiLU.
TEST(ProgramBuilder, GemmasEmbedScalesAndItsFfnIsGeGlu) {
  auto gemma =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[4], DType::Q8_0));
  ASSERT_EQ(gemma->hp().arch, Arch::gemma);
  ProgramSpec spec;
  spec.model = gemma.get();
  spec.max_tokens = 8;
  spec.plan = Plan::npu_only();
  BuiltPrograms b = build_programs(spec);
  int embeds = 0, ffns = 0;
  for (const auto& op : b.gpu.ops) {
    if (op->kind == fb::OpKind::Embed) {
      ++embeds;
      EXPECT_EQ(op->scale, std::sqrt(512.0f));
    }
    if (op->kind == fb::OpKind::SwiGlu) {
      ++ffns;
      EXPECT_EQ(op->ffn_act, static_cast<uint8_t>(ops::FfnAct::gelu_tanh));
    }
  }
  EXPECT_EQ(embeds, 1);
  EXPECT_EQ(ffns, gemma->hp().n_layer);
  auto qwen2 =
      LlamaModel::load(test_support::arch_model_path(test_support::arch_models()[0], DType::Q8_0));
  spec.model = qwen2.get();
  b = build_programs(spec);
  for (const auto& op : b.gpu.ops) {
    EXPECT_EQ(op->scale, 1.0f);
    EXPECT_EQ(op->ffn_act, static_cast<uint8_t>(ops::FfnAct::silu));
  }
}

TEST(ProgramValidation, RejectsOffsetsOutsideTheArena) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  ProgramSpec spec;
  spec.model = m.get();
  spec.max_tokens = 4;
  BuiltPrograms b = build_programs(spec);
  test_support::HostProgramMemory host(b, *m);
  ProgramMemory& mem = host.mem;
  validate_program(b.gpu, mem);
  const fb::TensorRef& out = *b.gpu.ops[3]->out;
  *b.gpu.ops[3]->out = fb::TensorRef(out.segment(), out.dtype(), b.arena.bytes - 8, out.rows(),
                                     out.cols(), out.slot());
  try {
    validate_program(b.gpu, mem);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
    // An Arena offset is within the tensor's slot (core/program/symbolic.h): past the slot.
    EXPECT_NE(std::string(e.what()).find("does not fit its slot"), std::string::npos) << e.what();
  }
  mem.kv_bytes = 10;
  EXPECT_THROW(validate_program(b.gpu, mem), Error);
}

}  // namespace
}  // namespace duet
