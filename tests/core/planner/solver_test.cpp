// The solver (core/planner/solver) on latencies given as plain functions, so each test can say
// exactly which placement the paper's objective must pick; plans to JSON and back; the plan cache.
#include "core/planner/solver.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "core/base/error.h"
#include "core/planner/npu_timing.h"
#include "core/planner/plan_store.h"

namespace duet {
namespace {

// Latencies as closed forms: GPU linear in rows x tokens plus a fixed cost; NPU steps of 32
// tokens, cheap per row.
class FormulaLatency : public LatencySource {
 public:
  std::function<double(const OpShape&)> gpu, npu;
  double gpu_us(const OpShape& s) const override { return gpu(s); }
  double npu_us(const OpShape& s) const override { return npu(s); }
};

FormulaLatency paperlike() {
  FormulaLatency f;
  f.gpu = [](const OpShape& s) {
    return 50.0 + 0.1 * static_cast<double>(s.m) * static_cast<double>(s.n);
  };
  f.npu = [](const OpShape& s) {
    return 100.0 + 0.2 * static_cast<double>(s.m) * static_cast<double>((s.n + 31) / 32);
  };
  return f;
}

const WeightShape kSquare{"q", OpKind::MatMul, DType::Q4_0, 4096, 4096, {MatmulRole::q}};

SolverOptions options() {
  SolverOptions o;
  o.sync_us = 30;
  o.copy_gbps = 40;
  return o;
}

TEST(NpuGraphs, PaddingPipeAndExact) {
  const SolverOptions o = options();
  EXPECT_EQ(npu_graphs_for(200, NpuGraphMode::padding, o), (std::vector<int64_t>{256}));
  EXPECT_EQ(npu_graphs_for(1, NpuGraphMode::padding, o), (std::vector<int64_t>{1}));
  EXPECT_EQ(npu_graphs_for(5, NpuGraphMode::padding, o), (std::vector<int64_t>{32}));
  EXPECT_EQ(npu_graphs_for(2100, NpuGraphMode::padding, o), (std::vector<int64_t>{1024, 1024, 64}));
  EXPECT_EQ(npu_graphs_for(300, NpuGraphMode::pipe, o), (std::vector<int64_t>{256, 32, 32}));
  EXPECT_EQ(npu_graphs_for(320, NpuGraphMode::pipe, o), (std::vector<int64_t>{256, 64}));
  EXPECT_EQ(npu_graphs_for(300, NpuGraphMode::online_prepare, o), (std::vector<int64_t>{300}));
  EXPECT_THROW(npu_graphs_for(0, NpuGraphMode::pipe, o), Error);
}

TEST(Objective, IsMaxOfTheTwoPartsPlusSyncAndCopy) {
  const FormulaLatency f = paperlike();
  const SolverOptions o = options();
  // Weight split 1:1 of 4096 rows at 64 tokens: GPU 50 + 0.1*2048*64, NPU 100 + 0.2*2048*2.
  const OpDecision d = evaluate_placement(kSquare, 64, {Strategy::weight_split, 2048, 0}, 1, 1,
                                          NpuGraphMode::padding, f, o);
  EXPECT_DOUBLE_EQ(d.gpu_part_us, 50 + 0.1 * 2048 * 64);
  EXPECT_DOUBLE_EQ(d.npu_part_us, 100 + 0.2 * 2048 * 2);
  EXPECT_DOUBLE_EQ(d.chosen_us, d.gpu_part_us + 30);
  EXPECT_EQ(d.ratio, "1:1");
  // GPU-only pays no sync; NPU-only does, and padding 200 -> 256 also zero-fills 56 rows.
  const OpDecision g = evaluate_placement(kSquare, 200, {Strategy::gpu_only, 0, 0}, 0, 0,
                                          NpuGraphMode::padding, f, o);
  EXPECT_DOUBLE_EQ(g.chosen_us, 50 + 0.1 * 4096 * 200);
  const OpDecision p = evaluate_placement(kSquare, 200, {Strategy::padding, 0, 256}, 0, 0,
                                          NpuGraphMode::padding, f, o);
  EXPECT_DOUBLE_EQ(p.chosen_us, 100 + 0.2 * 4096 * 8 + 30 + 56.0 * 4096 * 2 / 40e3);
}

TEST(Objective, ContentionAndSharedBandwidthAddToSplitsOnly) {
  const FormulaLatency f = paperlike();
  SolverOptions o = options();
  o.contention = 0.5;
  const OpDecision d = evaluate_placement(kSquare, 64, {Strategy::weight_split, 2048, 0}, 1, 1,
                                          NpuGraphMode::padding, f, o);
  // GPU 50 + 0.1*2048*64 = 13157, NPU 100 + 0.2*2048*2 = 919: half of the shorter is added.
  EXPECT_DOUBLE_EQ(d.contention_us, 0.5 * d.npu_part_us);
  EXPECT_DOUBLE_EQ(d.chosen_us, d.gpu_part_us + d.contention_us + 30);
  EXPECT_DOUBLE_EQ(
      evaluate_placement(kSquare, 64, {Strategy::gpu_only, 0, 0}, 0, 0, NpuGraphMode::padding, f, o)
          .contention_us,
      0.0);
  // Shared bandwidth: both parts' weight bytes (4096 x 4096 Q4_0, 18 B per 32) and activations
  // over 0.5 GB/s is a floor above either part.
  o.contention = 0;
  o.shared_gbps = 0.5;
  const OpDecision b = evaluate_placement(kSquare, 64, {Strategy::weight_split, 2048, 0}, 1, 1,
                                          NpuGraphMode::padding, f, o);
  const double bytes = 4096.0 * 4096 * 18 / 32 + (64.0 + 64) * 4096 * 2;
  EXPECT_NEAR(b.shared_bw_us, bytes / 0.5e3, 1e-6);
  EXPECT_GT(b.shared_bw_us, b.gpu_part_us);
  EXPECT_DOUBLE_EQ(b.chosen_us, b.shared_bw_us + 30);
}

TEST(SolveOp, FullContentionMakesEqualDevicesRunTheOpOnOne) {
  // Devices that serialise when run together (contention 1): a split costs the sum of its parts
  // plus a sync, so the whole op on the faster device wins.
  FormulaLatency f;
  f.gpu = [](const OpShape& s) {
    return 0.1 * static_cast<double>(s.m) * static_cast<double>(s.n);
  };
  f.npu = f.gpu;
  SolverOptions o = options();
  EXPECT_NE(solve_op(kSquare, 64, NpuGraphMode::padding, f, o).placement.strategy,
            Strategy::gpu_only);  // free overlap: splitting pays
  o.contention = 1;
  const OpDecision d = solve_op(kSquare, 64, NpuGraphMode::padding, f, o);
  EXPECT_EQ(d.placement.strategy, Strategy::gpu_only) << d.why;
  EXPECT_NE(d.why.find("T_gpu(all)"), std::string::npos) << d.why;
}

TEST(Objective, RejectsPlacementsThatDoNotFit) {
  const FormulaLatency f = paperlike();
  EXPECT_THROW(evaluate_placement(kSquare, 64, {Strategy::weight_split, 4096, 0}, 1, 1,
                                  NpuGraphMode::padding, f, options()),
               Error);
  EXPECT_THROW(evaluate_placement(kSquare, 64, {Strategy::activation_split, 0, 64}, 0, 0,
                                  NpuGraphMode::padding, f, options()),
               Error);
}

TEST(SolveOp, PicksTheMinimumOfEveryCandidate) {
  const FormulaLatency f = paperlike();
  const SolverOptions o = options();
  for (int64_t n : {1, 40, 128, 200, 257, 300}) {
    const OpDecision best = solve_op(kSquare, n, NpuGraphMode::padding, f, o);
    // No single-device placement nor any weight split on a fine grid beats it.
    EXPECT_LE(best.chosen_us, evaluate_placement(kSquare, n, {Strategy::gpu_only, 0, 0}, 0, 0,
                                                 NpuGraphMode::padding, f, o)
                                  .chosen_us);
    for (int64_t g = 512; g < 4096; g += 512)
      EXPECT_LE(best.chosen_us * 0.999,
                evaluate_placement(kSquare, n,
                                   {n == 1 || n == 128 ? Strategy::weight_split : Strategy::hybrid,
                                    g, n == 1 || n == 128 ? 0 : 1024},
                                   1, 1, NpuGraphMode::padding, f, o)
                    .chosen_us)
          << n << " " << g;
    EXPECT_FALSE(best.why.empty());
  }
}

TEST(SolveOp, SlowNpuMeansGpuOnlyAndSlowGpuMeansNpuOnly) {
  FormulaLatency f = paperlike();
  f.npu = [](const OpShape&) { return 1e9; };
  EXPECT_EQ(solve_op(kSquare, 128, NpuGraphMode::padding, f, options()).placement.strategy,
            Strategy::gpu_only);
  f = paperlike();
  f.gpu = [](const OpShape&) { return 1e9; };
  EXPECT_EQ(solve_op(kSquare, 128, NpuGraphMode::padding, f, options()).placement.strategy,
            Strategy::npu_only);
  EXPECT_EQ(solve_op(kSquare, 200, NpuGraphMode::padding, f, options()).placement.strategy,
            Strategy::padding);
}

TEST(SolveOp, FusedGateUpSplitsBothHalvesAlike) {
  const FormulaLatency f = paperlike();
  const std::vector<WeightShape> weights = {{"gate+up",
                                             OpKind::MatMul,
                                             DType::Q4_0,
                                             2 * 14336,
                                             4096,
                                             {MatmulRole::gate, MatmulRole::up}}};
  const PlanResult r = solve_plan(weights, 32, Phase::decode, 1, f, options());
  ASSERT_EQ(r.ops.size(), 1u);
  const Placement& gate = r.plan.at(MatmulRole::gate);
  EXPECT_EQ(gate.strategy, r.ops[0].placement.strategy);
  EXPECT_EQ(gate.gpu_rows * 2, r.ops[0].placement.gpu_rows);
  EXPECT_EQ(gate.gpu_rows % 32, 0);
  EXPECT_EQ(r.plan.at(MatmulRole::up).gpu_rows, gate.gpu_rows);
  EXPECT_DOUBLE_EQ(r.total_us, 32 * r.layer_us);
}

TEST(Baselines, NeverBeatTheSolversPlan) {
  const FormulaLatency f = paperlike();
  const std::vector<WeightShape> weights = model_weight_shapes(model_shape("llama3-8b"));
  for (auto [phase, n] :
       {std::pair{Phase::decode, int64_t{1}}, {Phase::prefill, 128}, {Phase::prefill, 300}}) {
    const PlanResult tensor = solve_plan(weights, 32, phase, n, f, options());
    for (const char* name : {"gpu-only", "npu-only", "npu-pipe", "layer"}) {
      const PlanResult b = baseline_plan(name, weights, 32, phase, n, f, options());
      EXPECT_LE(tensor.total_us, b.total_us * (1 + 1e-9)) << name << " n=" << n;
      EXPECT_EQ(b.plan.name, name);
    }
  }
  EXPECT_THROW(baseline_plan("online-prepare", weights, 32, Phase::prefill, 300, f, options()),
               Error);  // no SoC
  EXPECT_THROW(baseline_plan("fastest", weights, 32, Phase::prefill, 300, f, options()), Error);
}

TEST(Baselines, OnlinePreparePaysEachDistinctGraphOncePerRequest) {
  const FormulaLatency f = paperlike();
  const SocProfile soc = load_soc_profile("sd8gen3");
  SolverOptions o = options();
  o.soc = &soc;
  const std::vector<WeightShape> weights = model_weight_shapes(model_shape("llama3-8b"));
  const PlanResult r = baseline_plan("online-prepare", weights, 32, Phase::prefill, 300, f, o);
  // q and o share a graph, k and v too; logits run one token, which has a standard graph.
  double expected = 0;
  for (const char* name : {"q", "k", "gate+up", "down"})
    for (const WeightShape& w : weights)
      if (w.name == name)
        expected += npu_graph_compile_us(soc, OpShape{w.kind, w.wtype, w.m, w.k, 300, true});
  EXPECT_NEAR(r.compile_us, expected, 1e-6 * expected);
  EXPECT_NEAR(r.total_us, 32 * r.layer_us + r.ops.back().chosen_us + expected, 1e-6 * r.total_us);
  // At a standard length there is nothing to prepare.
  EXPECT_EQ(baseline_plan("online-prepare", weights, 32, Phase::prefill, 256, f, o).compile_us,
            0.0);
}

TEST(PlanJson, RoundTripsThroughPlanFromJson) {
  const FormulaLatency f = paperlike();
  const PlanResult r = solve_plan(model_weight_shapes(model_shape("llama3-8b")), 32, Phase::prefill,
                                  300, f, options());
  const nlohmann::json j = nlohmann::json::parse(plan_to_json(r).dump());
  const Plan back = plan_from_json(j);
  EXPECT_EQ(back.name, "tensor");
  EXPECT_EQ(back.npu_mode, r.plan.npu_mode);
  for (int i = 0; i < kMatmulRoles; ++i) {
    EXPECT_EQ(back.matmul[i].strategy, r.plan.matmul[i].strategy) << i;
    EXPECT_EQ(back.matmul[i].gpu_rows, r.plan.matmul[i].gpu_rows) << i;
    EXPECT_EQ(back.matmul[i].npu_tokens, r.plan.matmul[i].npu_tokens) << i;
  }
  EXPECT_EQ(j.at("rows").size(), 7u);
}

TEST(PlanJson, BadJsonNamesTheField) {
  const FormulaLatency f = paperlike();
  nlohmann::json j = plan_to_json(solve_plan(model_weight_shapes(model_shape("llama3-8b")), 32,
                                             Phase::decode, 1, f, options()));
  auto message_of = [](const nlohmann::json& bad) {
    try {
      plan_from_json(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::bad_format);
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  nlohmann::json no_down = j;
  no_down["matmul"].erase("down");
  EXPECT_NE(message_of(no_down).find("matmul.down"), std::string::npos);
  nlohmann::json bad_strategy = j;
  bad_strategy["matmul"]["q"]["strategy"] = "both";
  EXPECT_NE(message_of(bad_strategy).find("matmul.q"), std::string::npos);
  nlohmann::json bad_mode = j;
  bad_mode["npu_mode"] = "sometimes";
  EXPECT_NE(message_of(bad_mode).find("sometimes"), std::string::npos);
  EXPECT_NE(message_of(nlohmann::json::array()).find("not an object"), std::string::npos);
}

TEST(PlanCache, ReusesAPlanUntilTheProfileChangesThenBumpsItsVersion) {
  char tmpl[] = "/tmp/duet-plancache-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  setenv("DUET_CACHE_DIR", tmpl, 1);
  const std::string soc_dir = std::string(tmpl) + "/soc";
  std::filesystem::create_directories(soc_dir);
  std::filesystem::copy_file("deploy/soc/sd8gen3.toml", soc_dir + "/phone.toml");
  PlanQuery q;
  q.shape = "llama3.2-1b";
  q.soc = soc_dir + "/phone.toml";
  q.phase = Phase::prefill;
  q.n_tokens = 300;
  const nlohmann::json first = plan_json_for(q);
  EXPECT_EQ(first.at("version"), 1);
  EXPECT_FALSE(first.at("cached").get<bool>());
  const nlohmann::json again = plan_json_for(q);
  EXPECT_TRUE(again.at("cached").get<bool>());
  EXPECT_EQ(again.at("version"), 1);
  EXPECT_EQ(again.at("matmul"), first.at("matmul"));
  // A faster NPU clock changes the modelled profile: the plan is solved again, version 2.
  std::string text;
  {
    std::ifstream in(soc_dir + "/phone.toml");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto at = text.find("clock_ghz = 2.0");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 15, "clock_ghz = 3.0");
  std::ofstream(soc_dir + "/phone.toml") << text;
  const nlohmann::json changed = plan_json_for(q);
  EXPECT_FALSE(changed.at("cached").get<bool>());
  EXPECT_EQ(changed.at("version"), 2);
  EXPECT_NE(changed.at("fingerprint"), first.at("fingerprint"));
  EXPECT_TRUE(std::filesystem::exists(plan_cache_path(q, query_model(q))));
  std::filesystem::remove_all(tmpl);
  unsetenv("DUET_CACHE_DIR");
}

TEST(PlanQuery, BadQueriesAreRefusedByName) {
  PlanQuery q;
  q.timing = "guessed";
  EXPECT_THROW(q.validate(), Error);
  q = PlanQuery{};
  q.phase = Phase::decode;
  q.n_tokens = 5;
  EXPECT_THROW(q.validate(), Error);
  q = PlanQuery{};
  q.shape = "llama9-999b";
  try {
    query_model(q);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

}  // namespace
}  // namespace duet
