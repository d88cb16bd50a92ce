// HeteroInfer's end-to-end figures (SOSP'25, Snapdragon 8 Gen 3, W4A16), modelled: the solver's
// tensor plan from the SoC timing models, composed on the sd8gen3 timeline (issue 23). Every
// headline within +-25% of the paper, and the fast-sync gain of Figure 17 (Llama-8B's a known gap).
// The solver's inputs stay Table 3's isolated latencies (tests/core/planner/solver_table3_test.cpp
// checks its strategies and tests/gpu/gpu_timing_test.cpp the latencies); the timeline runs the
// GPU's kernels pipelined (core/planner/gpu_timing.h, gpu_pipelined_us).
#include <gtest/gtest.h>

#include <string>

#include "core/model/shapes.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/profiler.h"
#include "core/planner/solver.h"
#include "core/planner/timeline.h"
#include "tests/support/soc_profiles.h"

namespace duet {
namespace {

using test_support::sd8gen3;

// Tokens per second of the solver's tensor plan for one step: decode (one token at context
// 256, Figure 15's prompt length) or a prefill of n tokens from an empty cache.
double tensor_tok_s(const std::string& shape_name, Phase phase, int64_t n,
                    SyncMode sync = SyncMode::fast) {
  const SocProfile& soc = sd8gen3();
  const ModelShape& shape = model_shape(shape_name);
  const SolverOptions o = solver_options_for(soc);
  const SocModeledLatency lat(soc);
  const PlanResult p = solve_plan(model_weight_shapes(shape), shape.n_layer, phase, n, lat, o);
  TimelineOptions t;
  t.n_tokens = n;
  t.context = phase == Phase::decode ? 256 : 0;
  t.sync = sync;
  const Timeline tl = compose_timeline(schedule_from_shape(shape, {}, p.plan), soc, o, t);
  return static_cast<double>(phase == Phase::decode ? 1 : n) / (tl.step_us * 1e-6);
}

void expect_within(double modelled, double paper, double tolerance, const std::string& what) {
  EXPECT_GT(modelled, paper * (1 - tolerance))
      << what << ": modelled " << modelled << ", paper " << paper;
  EXPECT_LT(modelled, paper * (1 + tolerance))
      << what << ": modelled " << modelled << ", paper " << paper;
}

TEST(PaperHeadlines, DecodeOfTheThreeModelsIsWithin25PercentOfFigure15) {
  expect_within(tensor_tok_s("llama3-8b", Phase::decode, 1), 14.01, 0.25, "Llama-8B decode");
  expect_within(tensor_tok_s("llama3.2-3b", Phase::decode, 1), 29.9, 0.25, "Llama-3B decode");
  expect_within(tensor_tok_s("internlm-1.8b", Phase::decode, 1), 51.12, 0.25,
                "InternLM-1.8B decode");
}

TEST(PaperHeadlines, PrefillAt256IsWithin25PercentOfThePaperOnLlama8b) {
  expect_within(tensor_tok_s("llama3-8b", Phase::prefill, 256), 247.9, 0.25, "Llama-8B prefill");
}

TEST(PaperHeadlines, InternLmPrefillAt256IsWithin25PercentOfThePaper) {
  // The NPU's activation I/O per graph (core/planner/npu_timing.h) is what keeps InternLM's
  // 2048-wide graphs from running ~1.3x more efficiently per FLOP than Llama-8B's.
  expect_within(tensor_tok_s("internlm-1.8b", Phase::prefill, 256), 1092.0, 0.25,
                "InternLM-1.8B prefill");
}

double fast_sync_decode_gain(const std::string& shape_name) {
  return tensor_tok_s(shape_name, Phase::decode, 1, SyncMode::fast) /
         tensor_tok_s(shape_name, Phase::decode, 1, SyncMode::blocking);
}

TEST(PaperHeadlines, FastSyncSpeedsLlama8bDecodeUpAboutFourTimes) {
  // Figure 17: 4.01x on Llama-8B against clFinish-style synchronisation; prefill @256 1.21x
  // (section 5.5: 196.44 -> 236.92 tok/s).
  expect_within(fast_sync_decode_gain("llama3-8b"), 4.01, 0.25, "fast-sync decode gain");
  expect_within(tensor_tok_s("llama3-8b", Phase::prefill, 256, SyncMode::fast) /
                    tensor_tok_s("llama3-8b", Phase::prefill, 256, SyncMode::blocking),
                1.21, 0.25, "fast-sync prefill gain");
}

TEST(PaperHeadlines, FastSyncGainOnTheSmallerModelsIsAKnownGapHeldBelow8) {
  // Known gap (core/planner/timeline.h, SyncMode; bench/modeled/RESULTS.md): section 5.5's
  // "comparable improvements of 2.2x" on Llama-7B, -3B and InternLM-1.8B, where the fixed
  // ~400 us clFinish that gives the 8B its 4.01x gives them ~4-7x. Held so it cannot drift.
  for (const char* name : {"llama2-7b", "llama3.2-3b", "internlm-1.8b"}) {
    const double gain = fast_sync_decode_gain(name);
    EXPECT_GT(gain, 1.5) << name;
    EXPECT_LT(gain, 8.0) << name;
  }
}

TEST(PaperHeadlines, APipelinedGemvStreamsAtOneProcessorsBandwidthAnIsolatedOneDoesNot) {
  // Table 3's [4096,4096] x1 row (511 us, isolated) against the same GEMV in a pipelined decode:
  // the pipelined one draws memory.single_gbps, the isolated one well under it.
  const SocProfile& soc = sd8gen3();
  const OpShape gemv{OpKind::MatMul, DType::Q4_0, 4096, 4096, 1, true};
  const double bytes = 4096.0 * 4096 * 18 / 32;
  const double pipelined_gbps = bytes / gpu_pipelined_us(soc, gemv) / 1e3;
  const double isolated_gbps = bytes / gpu_modeled_us(soc, gemv) / 1e3;
  EXPECT_GT(pipelined_gbps, 0.9 * soc.mem.single_gbps);
  EXPECT_LE(pipelined_gbps, soc.mem.single_gbps);
  EXPECT_LT(isolated_gbps, 0.5 * soc.mem.single_gbps);
  // The GEMM (prefill) hardly changes: its per-kernel costs are small beside its compute.
  const OpShape gemm{OpKind::MatMul, DType::Q4_0, 4096, 4096, 256, true};
  EXPECT_GT(gpu_pipelined_us(soc, gemm), 0.97 * gpu_modeled_us(soc, gemm));
}

}  // namespace
}  // namespace duet
