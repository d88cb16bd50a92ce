// The NPU timing model shows the paper's NPU characteristics and reproduces Table 3; SoC
// profiles load from deploy/soc and reject bad files; the graph cache charges compile time once.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "core/base/error.h"
#include "core/planner/npu_timing.h"
#include "core/planner/soc_profile.h"
#include "services/npu_svc/graph_cache.h"
#include "tests/support/error_code.h"

namespace duet {
namespace {

OpShape matmul(int64_t m, int64_t k, int64_t n, DType t = DType::Q4_0, bool transposed = true) {
  OpShape s;
  s.kind = OpKind::MatMul;
  s.wtype = t;
  s.m = m;
  s.k = k;
  s.n = n;
  s.weight_stationary_transposed = transposed;
  return s;
}

const SocProfile& gen3() {
  static const SocProfile p = load_soc_profile("sd8gen3");
  return p;
}

using test_support::error_code_of;

TEST(SocProfile, LoadsTheShippedProfiles) {
  const SocProfile& p = gen3();
  EXPECT_EQ(p.name, "sd8gen3");
  EXPECT_EQ(p.npu.array_rows, 32);
  EXPECT_EQ(p.npu.array_cols, 32);
  EXPECT_GT(p.npu.cores, 1);
  EXPECT_GT(p.gpu.peak_gflops, p.gpu.achievable_gflops);
  EXPECT_LT(p.mem.single_gbps, p.mem.dual_gbps);
  EXPECT_LE(p.mem.dual_gbps, p.mem.peak_gbps);
  const SocProfile elite = load_soc_profile("sd8elite");
  EXPECT_EQ(elite.name, "sd8elite");
  EXPECT_GT(elite.npu.clock_ghz, p.npu.clock_ghz);
  // A path works as well as a name.
  EXPECT_EQ(load_soc_profile(std::string(DUET_SOURCE_DIR) + "/deploy/soc/sd8elite.toml").name,
            "sd8elite");
}

TEST(SocProfile, BadProfilesGiveErrorsNamingTheProblem) {
  std::string msg;
  EXPECT_EQ(error_code_of([] { load_soc_profile("no-such-soc"); }, &msg), Errc::not_found);
  EXPECT_NE(msg.find("no-such-soc"), std::string::npos) << msg;

  const std::string good = R"(name = "x"
[npu]
cores = 4
array_rows = 32
array_cols = 32
clock_ghz = 1.0
sram_bytes = 1048576
dma_gbps = 10
launch_us = 1
compile_us_per_mb = 1
compile_base_us = 1
activation_io_us_per_mb = 1
stationary_load_cycles = 1
stationary_fetch_cycles = 1
fill_cycles = 1
[gpu]
peak_gflops = 10
achievable_gflops = 5
bandwidth_gbps = 10
sync_us = 1
launch_us = 1
[gpu.params]
k_efficiency = 0.5
[memory]
peak_gbps = 10
single_gbps = 5
dual_gbps = 8
)";
  const SocProfile ok = parse_soc_profile(good, "good.toml");
  EXPECT_EQ(ok.gpu.param("k_efficiency"), 0.5);
  EXPECT_EQ(error_code_of([&] { ok.gpu.param("missing"); }), Errc::not_found);

  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  struct Case {
    std::string text, must_mention;
  };
  const Case cases[] = {
      {replace("dma_gbps = 10\n", ""), "dma_gbps"},                                   // missing key
      {replace("fill_cycles = 1", "fill_cycles = 1\nfil_cycles = 2"), "fil_cycles"},  // typo
      {replace("clock_ghz = 1.0", "clock_ghz = \"fast\""), "clock_ghz"},  // not a number
      {replace("cores = 4", "cores = -4"), "cores"},                      // negative
      {replace("[memory]", "[memry]"), "memry"},                          // misspelt table
      {replace("peak_gbps = 10", "peak_gbps = 4"), "peak_gbps"},          // single > peak
      {replace("name = \"x\"", "name = \"x"), "line"},                    // TOML syntax
  };
  for (const Case& c : cases) {
    EXPECT_EQ(error_code_of([&] { parse_soc_profile(c.text, "bad.toml"); }, &msg), Errc::bad_format)
        << c.must_mention;
    EXPECT_NE(msg.find(c.must_mention), std::string::npos) << msg;
    EXPECT_NE(msg.find("bad.toml"), std::string::npos) << msg;
  }
}

// HeteroInfer Table 3, NPU column (W4A16 on Snapdragon 8 Gen 3). Weight [rows, cols] x
// activation [cols, tokens]; the NPU runs the weight-streaming (W x^T) order.
TEST(NpuTiming, ReproducesTable3WithinThirtyPercent) {
  struct Row {
    int64_t m, k, n;
    double paper_us;
  };
  const Row rows[] = {{4096, 4096, 1, 693},   {28672, 4096, 1, 3886},  {4096, 14336, 1, 6506},
                      {4096, 4096, 128, 912}, {4096, 4096, 256, 1884}, {4096, 14336, 256, 23445}};
  for (const Row& r : rows) {
    const double us = npu_modeled_us(gen3(), matmul(r.m, r.k, r.n));
    EXPECT_NEAR(us / r.paper_us, 1.0, 0.30) << "[" << r.m << "," << r.k << "]x" << r.n
                                            << ": modelled " << us << " us, paper " << r.paper_us;
  }
}

// NPU-1: the arrays are 32 wide, so token counts are padded to tile multiples: every count up to
// 32 costs the same, and latency is a step function of ceil(n / 32).
TEST(NpuTiming, StagePerformanceFlatBelowTheTileAndSteppingAtMultiples) {
  const double at1 = npu_modeled_us(gen3(), matmul(4096, 4096, 1));
  for (int64_t n : {2, 7, 16, 31, 32})
    EXPECT_DOUBLE_EQ(npu_modeled_us(gen3(), matmul(4096, 4096, n)), at1) << n;
  for (int64_t tile = 1; tile < 12; ++tile) {
    const double first = npu_modeled_us(gen3(), matmul(4096, 4096, tile * 32 + 1));
    for (int64_t n = tile * 32 + 2; n <= (tile + 1) * 32; n += 5)
      EXPECT_DOUBLE_EQ(npu_modeled_us(gen3(), matmul(4096, 4096, n)), first) << n;
    EXPECT_GE(first, npu_modeled_us(gen3(), matmul(4096, 4096, tile * 32))) << tile;
  }
  // More tiles than cores take another pass: a visible step.
  const int64_t cols_per_pass = 32 * gen3().npu.cores;
  EXPECT_GT(npu_modeled_us(gen3(), matmul(4096, 4096, cols_per_pass + 1)),
            1.3 * npu_modeled_us(gen3(), matmul(4096, 4096, cols_per_pass)));
}

// NPU-2: [14336,4096]x[4096,K] against [K,4096]x[4096,14336]: same FLOPs, but with the weight
// stationary it is reloaded for every few tokens. The paper saw up to 6x.
TEST(NpuTiming, OrderSensitivityMakesWeightStationarySeveralTimesSlower) {
  double best_ratio = 0;
  for (int64_t k : {32, 64, 128, 256}) {
    const double fast = npu_modeled_us(gen3(), matmul(14336, 4096, k, DType::Q4_0, true));
    const double slow = npu_modeled_us(gen3(), matmul(14336, 4096, k, DType::Q4_0, false));
    EXPECT_GT(slow, 1.5 * fast) << "K=" << k;
    best_ratio = std::max(best_ratio, slow / fast);
  }
  EXPECT_GT(best_ratio, 3.0);
}

// NPU-3: with the same elements, a weight with more rows (output features) than columns (the
// shared reduction) is faster: a wide reduction makes the stationary operand tall and reloaded.
TEST(NpuTiming, ShapeSensitivityFavoursMoreRowsThanColumns) {
  for (int64_t n : {1, 64, 256, 512}) {
    const double tall = npu_modeled_us(gen3(), matmul(14336, 4096, n));
    const double wide = npu_modeled_us(gen3(), matmul(4096, 14336, n));
    EXPECT_GT(wide, 1.5 * tall) << "n=" << n;
  }
}

TEST(NpuTiming, MoreCoresAndFasterClocksHelpComputeBoundShapes) {
  SocProfile one_core = gen3();
  one_core.npu.cores = 1;
  const OpShape prefill = matmul(4096, 4096, 256);
  EXPECT_GT(npu_modeled_us(one_core, prefill), 1.5 * npu_modeled_us(gen3(), prefill));
  const SocProfile elite = load_soc_profile("sd8elite");
  EXPECT_LT(npu_modeled_us(elite, prefill), npu_modeled_us(gen3(), prefill));
  const NpuTiming t = npu_timing(gen3(), prefill);
  EXPECT_EQ(t.tiles_k, 128);
  EXPECT_EQ(t.tiles_c, 8);
  EXPECT_EQ(t.passes, 8 / gen3().npu.cores);
  EXPECT_NEAR(t.total_us, t.launch_us + std::max(t.compute_us, t.dma_us), 1e-9);
}

// Weights stream from DRAM in their stored format: a decode matmul moves m*k times the format's
// bytes per weight (Q4_K 144/256, Q5_K 176/256, Q6_K 210/256, Q4_0 18/32, ...), the rest of its
// traffic (fp16 activations in and out) is the same for every format.
TEST(NpuTiming, ChargesEachFormatsRealBytesPerWeight) {
  const int64_t m = 4096, k = 4096;
  const double f16 = npu_timing(gen3(), matmul(m, k, 1, DType::F16)).dma_bytes;
  const struct {
    DType type;
    double bytes_per_weight;
  } cases[] = {{DType::Q4_K, 144.0 / 256}, {DType::Q5_K, 176.0 / 256}, {DType::Q6_K, 210.0 / 256},
               {DType::Q4_0, 18.0 / 32},   {DType::Q4_1, 20.0 / 32},   {DType::Q5_0, 22.0 / 32},
               {DType::Q5_1, 24.0 / 32},   {DType::Q8_0, 34.0 / 32},   {DType::BF16, 2.0}};
  for (const auto& c : cases) {
    const NpuTiming t = npu_timing(gen3(), matmul(m, k, 1, c.type));
    EXPECT_DOUBLE_EQ(t.dma_bytes - f16, static_cast<double>(m * k) * (c.bytes_per_weight - 2.0))
        << dtype_name(c.type);
  }
  EXPECT_LT(npu_timing(gen3(), matmul(m, k, 1, DType::Q4_K)).dma_us,
            npu_timing(gen3(), matmul(m, k, 1, DType::Q6_K)).dma_us);
}

TEST(NpuTiming, RejectsShapesTheNpuDoesNotRun) {
  OpShape norm = matmul(4096, 4096, 1);
  norm.kind = OpKind::RmsNorm;
  EXPECT_EQ(error_code_of([&] { npu_modeled_us(gen3(), norm); }), Errc::unsupported);
  EXPECT_EQ(error_code_of([&] { npu_modeled_us(gen3(), matmul(0, 4096, 1)); }),
            Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { npu_modeled_us(gen3(), matmul(4096, 4096, -3)); }),
            Errc::invalid_argument);
}

// Online preparation of a Llama-8B layer's ~4 graphs (QKV, O, gate+up, down): 408 ms at 135
// tokens and 2050 ms at 1000 in the paper.
TEST(NpuTiming, GraphCompileCostMatchesOnlinePreparation) {
  auto layer_graphs_us = [](int64_t n) {
    double us = 0;
    for (auto [m, k] :
         {std::pair<int64_t, int64_t>{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}})
      us += npu_graph_compile_us(gen3(), matmul(m, k, n));
    return us;
  };
  EXPECT_NEAR(layer_graphs_us(135) / 408.4e3, 1.0, 0.10);
  EXPECT_NEAR(layer_graphs_us(1000) / 2050e3, 1.0, 0.10);
  EXPECT_GT(npu_graph_compile_us(gen3(), matmul(4096, 4096, 512)),
            npu_graph_compile_us(gen3(), matmul(4096, 4096, 256)));
}

TEST(GraphCache, CompilesOnceAndRefusesUnknownShapesUnlessOnline) {
  npu::GraphCache cache(gen3());
  const OpShape s = matmul(4096, 4096, 128);
  EXPECT_FALSE(cache.contains(s));
  std::string msg;
  EXPECT_EQ(error_code_of([&] { cache.prepare(s, false); }, &msg), Errc::not_found);
  EXPECT_NE(msg.find("m=4096 k=4096 n=128"), std::string::npos) << msg;

  const auto first = cache.compile(s);
  EXPECT_FALSE(first.cached);
  EXPECT_DOUBLE_EQ(first.compile_us, npu_graph_compile_us(gen3(), s));
  const auto again = cache.compile(s);
  EXPECT_TRUE(again.cached);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_DOUBLE_EQ(cache.total_compile_us(), first.compile_us);
  EXPECT_EQ(cache.prepare(s, false), 0.0);

  // Each static dimension is part of the graph: another n, dtype or order is another graph.
  EXPECT_FALSE(cache.contains(matmul(4096, 4096, 129)));
  EXPECT_FALSE(cache.contains(matmul(4096, 4096, 128, DType::Q8_0)));
  EXPECT_FALSE(cache.contains(matmul(4096, 4096, 128, DType::Q4_0, false)));

  // Online preparation pays the compile cost once, then the graph is cached.
  const OpShape online = matmul(4096, 4096, 135);
  EXPECT_DOUBLE_EQ(cache.prepare(online, true), npu_graph_compile_us(gen3(), online));
  EXPECT_EQ(cache.prepare(online, true), 0.0);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.shapes().size(), 2u);

  EXPECT_EQ(error_code_of([&] { cache.compile(matmul(4096, 4090, 1)); }), Errc::invalid_argument);
}

}  // namespace
}  // namespace duet
