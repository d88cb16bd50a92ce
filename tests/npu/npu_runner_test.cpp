// NpuRunner runs the NPU half of real programs (tiny-fortune, plan npu-only) next to the
// reference interpreter running the GPU half on another thread, with real cross-thread flag
// waits: logits match the reference forward within fp16 tolerance. Bad programs and steps get
// clear errors; graph modes (exact, padding, online preparation, pipe) charge modelled time.
#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <thread>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/shapes.h"
#include "core/planner/npu_timing.h"
#include "core/program/program.h"
#include "services/npu_svc/npu_runner.h"
#include "tests/support/arch_models.h"
#include "tests/support/error_code.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::error_code_of;
using test_support::expect_error;
using test_support::LocalFlags;
using test_support::LogitsRows;
using test_support::step_args;
using test_support::tiny_fortune_path;

// A copy of a TensorRef with one field changed (flatbuffers structs are immutable here).
fb::TensorRef with(const fb::TensorRef& r, uint64_t offset, uint32_t rows, uint32_t cols) {
  return fb::TensorRef(r.segment(), r.dtype(), offset, rows, cols, r.slot());
}

// The two programs of a plan over one arena and KV cache: GPU half interpreted, NPU half on
// the NpuRunner.
class TwoDeviceRun {
 public:
  TwoDeviceRun(const LlamaModel& m, Plan plan, uint32_t max_tokens)
      : m_(m),
        graphs_(load_soc_profile("sd8gen3")),
        gemm_(2),
        runner_(graphs_, gemm_),
        built_(build_programs(
            test_support::program_spec(m, std::move(plan), max_tokens, 64, "npu-test"))),
        host_(built_, m) {
    runner_.register_program(1, built_.npu, host_.mem);
    test_support::fill_page_table(host_.arena.data(), built_);
  }

  // Appends tokens at pos; returns logits for every token (all_logits) or the last.
  std::vector<float> step(const std::vector<int32_t>& tokens, int pos, bool all_logits,
                          bool online = false) {
    test_support::write_token_rows(host_.arena.data(), built_, tokens, pos,
                                   all_logits ? LogitsRows::every_token : LogitsRows::last_token);
    const StepArgs args = step_args(built_, ++seq_, static_cast<uint32_t>(tokens.size()));
    test_support::run_both_halves(
        [&] {
          try {
            last_ = runner_.run_step(1, args, flags_, online);
          } catch (...) {
            // Unblock the GPU half: publish this step on every flag the NPU would have.
            for (const auto& op : built_.npu.ops)
              if (op->publish_flag >= 0)
                flags_.publish(static_cast<uint32_t>(op->publish_flag), args.seq);
            throw;
          }
        },
        [&] { interpret_program(built_.gpu, host_.mem, args, flags_); });
    const float* logits = reinterpret_cast<const float*>(host_.arena.data() + built_.arena.logits);
    const size_t n_rows = all_logits ? tokens.size() : 1;
    return {logits, logits + n_rows * m_.hp().n_vocab};
  }

  void compile_for(uint32_t n_tokens, uint32_t n_logits) {
    for (const OpShape& s : runner_.graph_shapes(1, n_tokens, n_logits)) graphs_.compile(s);
  }

  npu::GraphCache& graphs() { return graphs_; }
  npu::NpuRunner& runner() { return runner_; }
  const BuiltPrograms& built() const { return built_; }
  const ProgramMemory& mem() const { return host_.mem; }
  const npu::StepReport& last() const { return last_; }

 private:
  const LlamaModel& m_;
  npu::GraphCache graphs_;
  npu::NpuGemm gemm_;
  npu::NpuRunner runner_;
  BuiltPrograms built_;
  test_support::HostProgramMemory host_;
  LocalFlags flags_{4096};
  uint64_t seq_ = 0;
  npu::StepReport last_;
};

// fp16 agreement: close logits, and the same top-1 token wherever the reference's margin
// between its best two logits exceeds 0.05.
void expect_fp16_agreement(const std::vector<float>& got, const std::vector<float>& want,
                           int n_vocab, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t row = 0; row * n_vocab < want.size(); ++row) {
    const float* g = got.data() + row * n_vocab;
    const float* w = want.data() + row * n_vocab;
    int best = 0, second = -1;
    float max_diff = 0, scale = 0;
    for (int i = 0; i < n_vocab; ++i) {
      max_diff = std::max(max_diff, std::fabs(g[i] - w[i]));
      scale = std::max(scale, std::fabs(w[i]));
      if (w[i] > w[best]) best = i;
    }
    for (int i = 0; i < n_vocab; ++i)
      if (i != best && (second < 0 || w[i] > w[second])) second = i;
    EXPECT_LT(max_diff, 0.02f * scale + 0.02f) << what << " row " << row;
    if (w[best] - w[second] > 0.05f) {
      const int got_best = static_cast<int>(std::max_element(g, g + n_vocab) - g);
      EXPECT_EQ(got_best, best) << what << " row " << row;
    }
  }
}

TEST(NpuRunner, NpuOnlyPlanMatchesTheReferenceForwardInFp16) {
  for (const char* variant : {"q4_0", "q8_0", "f16"}) {
    SCOPED_TRACE(variant);
    auto m = LlamaModel::load(tiny_fortune_path(variant));
    Plan plan = Plan::npu_only();
    plan.npu_mode = NpuGraphMode::padding;
    TwoDeviceRun run(*m, plan, 16);
    run.compile_for(16, 16);  // a standard-size prefill graph set, padded into
    run.compile_for(1, 1);    // decode
    ReferenceForward ref(*m, 64);
    const int V = m->hp().n_vocab;

    const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 292, 322, 42};
    expect_fp16_agreement(run.step(prompt, 0, true), ref.forward(prompt, true), V, "prefill");
    // Padding: 9 tokens ran on the 16-token graphs, and are timed as such.
    const npu::StepReport& prefill = run.last();
    ASSERT_FALSE(prefill.ops.empty());
    for (const npu::OpTiming& op : prefill.ops) {
      EXPECT_GT(op.measured_us, 0.0);
      EXPECT_EQ(op.compile_us, 0.0);
      EXPECT_EQ(op.graphs_run, 1u);
    }
    OpShape padded = prefill.ops[0].shape;
    padded.n = 16;
    EXPECT_NEAR(prefill.ops[0].modeled_us, npu_modeled_us(run.graphs().soc(), padded), 1e-6);

    int pos = static_cast<int>(prompt.size());
    for (int32_t tok : {100, 7, 1500}) {
      const std::vector<int32_t> one = {tok};
      expect_fp16_agreement(run.step(one, pos++, false), ref.forward(one, false), V, "decode");
    }
    EXPECT_GT(run.last().modeled_us, 0.0);
  }
}

// The K-quant mixes (Q4_K/Q5_K matrices with Q6_K attn_v, ffn_down and tied embeddings) on the
// NPU: every matmul dequantises its format on the fly and equals the reference forward in fp16.
TEST(NpuRunner, NpuOnlyPlanOnKQuantMixesMatchesTheReferenceForward) {
  const test_support::TempDir dir("duet-npu-kquant");
  for (const char* preset : {"q4_k_m", "q5_k_m", "q6_k"}) {
    SCOPED_TRACE(preset);
    auto m = LlamaModel::load(test_support::write_kquant_mix_model(dir.path(), preset, 0.08f));
    ASSERT_EQ(m->layers[1].w_down.type, DType::Q6_K);
    Plan plan = Plan::npu_only();
    plan.npu_mode = NpuGraphMode::padding;
    TwoDeviceRun run(*m, plan, 16);
    run.compile_for(16, 16);
    run.compile_for(1, 1);
    ReferenceForward ref(*m, 64);
    const int V = m->hp().n_vocab;
    const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 292, 322, 42};
    expect_fp16_agreement(run.step(prompt, 0, true), ref.forward(prompt, true), V, "prefill");
    int pos = static_cast<int>(prompt.size());
    for (int32_t tok : {100, 7, 1500}) {
      const std::vector<int32_t> one = {tok};
      expect_fp16_agreement(run.step(one, pos++, false), ref.forward(one, false), V, "decode");
    }
  }
}

TEST(NpuRunner, MissingGraphsFailTheStepUnlessOnlinePreparationPaysForThem) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  Plan plan = Plan::npu_only();
  plan.npu_mode = NpuGraphMode::exact;
  TwoDeviceRun run(*m, plan, 8);
  std::string msg;
  EXPECT_EQ(error_code_of([&] { run.step({1, 703, 1975}, 0, true); }, &msg), Errc::not_found);
  EXPECT_NE(msg.find("no NPU graph for MatMul"), std::string::npos) << msg;
  EXPECT_NE(msg.find("n=3"), std::string::npos) << msg;
  EXPECT_EQ(run.graphs().size(), 0u);

  // Online preparation compiles each distinct shape once and charges it to that step.
  run.step({1, 703, 1975}, 0, true, /*online=*/true);
  const double first_compile = run.last().compile_us;
  EXPECT_GT(first_compile, 0.0);
  EXPECT_DOUBLE_EQ(first_compile, run.graphs().total_compile_us());
  EXPECT_EQ(run.graphs().size(), run.runner().graph_shapes(1, 3, 3).size());
  EXPECT_GT(run.last().modeled_us, first_compile);
  // The same shapes again: cached, nothing to pay, and exact mode now finds them.
  run.step({1, 703, 1975}, 0, true);
  EXPECT_EQ(run.last().compile_us, 0.0);
}

TEST(NpuRunner, PipeModeRunsSeveralStandardGraphsInARow) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  Plan plan = Plan::npu_only();
  plan.npu_mode = NpuGraphMode::pipe;
  TwoDeviceRun run(*m, plan, 16);
  run.compile_for(4, 1);
  run.compile_for(1, 1);
  run.step({1, 703, 1975, 310, 263, 1243}, 0, false);  // 6 tokens = 4 + 1 + 1
  const npu::OpTiming& first = run.last().ops.at(0);
  EXPECT_EQ(first.graphs_run, 3u);
  OpShape four = first.shape, one = first.shape;
  four.n = 4;
  one.n = 1;
  const SocProfile& soc = run.graphs().soc();
  EXPECT_NEAR(first.modeled_us, npu_modeled_us(soc, four) + 2 * npu_modeled_us(soc, one), 1e-6);
}

TEST(NpuRunner, RejectsBadProgramsWithClearErrors) {
  auto m = LlamaModel::load(tiny_fortune_path("q4_0"));
  TwoDeviceRun run(*m, Plan::npu_only(), 8);
  const BuiltPrograms& b = run.built();
  npu::GraphCache graphs(load_soc_profile("sd8gen3"));
  npu::NpuGemm gemm(1);
  npu::NpuRunner runner(graphs, gemm);
  // Registering b.npu as changed by `mutate` is refused with `code`, naming `needle`.
  auto expect_refused = [&](auto&& mutate, Errc code, const std::string& needle) {
    expect_error(
        [&] {
          fb::ProgramT p = b.npu;  // deep copy (object API)
          mutate(p);
          runner.register_program(7, std::move(p), run.mem());
        },
        code, needle);
  };
  // Shape mismatch: the input width disagrees with the weight (narrower: a wider one would not
  // fit its arena slot, refused before).
  expect_refused(
      [](fb::ProgramT& p) {
        auto& r = *p.ops[0]->in0;
        r = with(r, r.offset(), r.rows(), r.cols() - 32);
      },
      Errc::invalid_argument, "shapes disagree");
  expect_refused(
      [](fb::ProgramT& p) {
        auto& r = *p.ops[0]->weight;
        r = with(r, r.offset(), r.rows(), r.cols() - 32);
      },
      Errc::invalid_argument, "op 0");
  // Oversized tensor and offsets outside the arena.
  expect_refused(
      [](fb::ProgramT& p) {
        auto& r = *p.ops[1]->out;
        r = with(r, r.offset(), 1u << 30, r.cols());
      },
      Errc::out_of_range, "outside its segment");
  const uint64_t arena_bytes = run.mem().arena_bytes;
  expect_refused(
      [&](fb::ProgramT& p) {
        auto& r = *p.ops[2]->in0;
        r = with(r, arena_bytes - 8, r.rows(), r.cols());
      },
      Errc::out_of_range, "");
  // Ops the NPU does not run, unknown graph modes, bad row ranges.
  expect_refused([](fb::ProgramT& p) { p.ops[0]->kind = fb::OpKind::RmsNorm; }, Errc::unsupported,
                 "not an NPU op");
  expect_refused([](fb::ProgramT& p) { p.ops[0]->npu_mode = 9; }, Errc::invalid_argument, "");
  expect_refused([](fb::ProgramT& p) { p.ops[0]->row_end = p.ops[0]->weight->rows() + 1; },
                 Errc::out_of_range, "");
  EXPECT_FALSE(runner.has_program(7));

  // A good program registers; bad steps are refused before anything runs.
  runner.register_program(7, fb::ProgramT(b.npu), run.mem());
  LocalFlags flags(4096);
  const StepArgs too_many = step_args(b, 1, 9);
  EXPECT_EQ(error_code_of([&] { runner.run_step(7, too_many, flags); }), Errc::out_of_range);
  StepArgs table_outside = step_args(b, 1, 1);
  table_outside.tokens_offset = arena_bytes - 8;
  EXPECT_EQ(error_code_of([&] { runner.run_step(7, table_outside, flags); }), Errc::out_of_range);
  const StepArgs ok = step_args(b, 1, 1);
  EXPECT_EQ(error_code_of([&] { runner.run_step(8, ok, flags); }), Errc::not_found);
}

}  // namespace
}  // namespace duet
