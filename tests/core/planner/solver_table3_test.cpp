// HeteroInfer's Table 3 from duet's own pipeline: Llama-3-8B shapes, the sd8gen3 timing models,
// a modelled profile, the latency functions and the solver, exactly as `duet plan --shape
// llama3-8b --soc sd8gen3 --timing modeled` runs them. Ratios may be one step off the paper's on
// the solver's grid of small integer ratios (1:4 1:3 1:2 2:3 3:4 1:1 4:3 3:2 2:1 3:1 4:1).
//
// All nine rows are checked. What makes the decode rows come out (core/planner/gpu_timing.h,
// core/planner/npu_timing.h): the GPU's GEMV draws bandwidth in proportion to the rows it keeps in
// flight (Memory-1), so giving the NPU half of [4096,4096] saves the GPU real time while the NPU
// streams its half over its own DMA; spare NPU cores split the streamed rows when a decode graph
// has one stationary column. The x257-272 rows come from the GPU's few-token GEMV (16 ragged tokens
// ~1.5 ms). One deviation remains and is checked as such: [4096,14336] x369-377 is an activation
// split 256 + the rest, within 2% of the best hybrid (the GPU's 113 ragged tokens and the pipe's
// 256+64+32 cover make the two nearly equal).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "core/planner/plan_store.h"

namespace duet {
namespace {

const std::vector<std::string> kRatios = {"1:4", "1:3", "1:2", "2:3", "3:4", "1:1",
                                          "4:3", "3:2", "2:1", "3:1", "4:1"};

int ratio_index(const std::string& ratio) {
  const std::string head = ratio.substr(0, ratio.find(' '));
  const auto it = std::find(kRatios.begin(), kRatios.end(), head);
  return it == kRatios.end() ? -100 : static_cast<int>(it - kRatios.begin());
}

class Table3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/duet-table3-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    cache_ = tmpl;
    setenv("DUET_CACHE_DIR", cache_.c_str(), 1);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(cache_); }

  // The plan row of one weight ("q", "gate+up", "down") at n tokens.
  static nlohmann::json row(const std::string& weight, int64_t n) {
    const std::string key = weight + "@" + std::to_string(n);
    if (!rows_.count(key)) {
      PlanQuery q;
      q.shape = "llama3-8b";
      q.soc = "sd8gen3";
      q.timing = "modeled";
      q.phase = n == 1 ? Phase::decode : Phase::prefill;
      q.n_tokens = n;
      q.baselines = false;
      const nlohmann::json plan = plan_json_for(q);
      for (const nlohmann::json& r : plan.at("rows"))
        rows_[r.at("weight").get<std::string>() + "@" + std::to_string(n)] = r;
    }
    return rows_.at(key);
  }
  static void expect(const std::string& weight, int64_t n, const std::string& strategy,
                     const std::string& ratio = "") {
    const nlohmann::json r = row(weight, n);
    EXPECT_EQ(r.at("strategy").get<std::string>(), strategy)
        << weight << " x" << n << ": " << r.dump();
    if (!ratio.empty()) {
      EXPECT_LE(std::abs(ratio_index(r.at("ratio").get<std::string>()) - ratio_index(ratio)), 1)
          << weight << " x" << n << ": " << r.at("ratio") << " vs the paper's " << ratio;
    }
  }

  static inline std::string cache_;
  static inline std::map<std::string, nlohmann::json> rows_;
};

TEST_F(Table3, Row1DecodeAttentionProjectionIsWeightSplitOneToOne) {
  expect("q", 1, "weight", "1:1");
}

TEST_F(Table3, Row2DecodeFusedGateUpIsWeightSplitThreeToOne) {
  expect("gate+up", 1, "weight", "3:1");
}

TEST_F(Table3, Row3DecodeDownIsGpuOnly) {
  expect("down", 1, "gpu-only");
}

TEST_F(Table3, Row4PrefillAtAStandardLengthIsNpuOnly) {
  expect("q", 128, "npu-only");
}

TEST_F(Table3, Row5PrefillJustUnderAStandardLengthPadsOnTheNpu) {
  for (int64_t n = 193; n <= 255; ++n) {
    expect("q", n, "padding");
    EXPECT_EQ(row("q", n).at("npu_tokens"), 256) << n;
  }
}

TEST_F(Table3, Row6PrefillAt256IsNpuOnly) {
  expect("q", 256, "npu-only");
}

TEST_F(Table3, Row7PrefillJustOverAStandardLengthSplitsTheActivation) {
  for (int64_t n = 257; n <= 272; ++n) {
    expect("q", n, "activation");
    EXPECT_EQ(row("q", n).at("ratio"), "dynamic:256") << n;
    EXPECT_EQ(row("q", n).at("npu_tokens"), 256) << n;
  }
}

TEST_F(Table3, Row8WideDownProjectionAtStandardLengthIsWeightSplitTwoToThree) {
  expect("down", 256, "weight", "2:3");
}

TEST_F(Table3, Row9WideDownProjectionPastAStandardLengthIsHybridTwoToThree) {
  int hybrid = 0, lengths = 0;
  for (int64_t n = 257; n <= 384; ++n, ++lengths) {
    const nlohmann::json r = row("down", n);
    const std::string strategy = r.at("strategy").get<std::string>();
    if (strategy == "hybrid") {
      ++hybrid;
      EXPECT_LE(std::abs(ratio_index(r.at("ratio").get<std::string>()) - ratio_index("2:3")), 1)
          << n << ": " << r.dump();
      continue;
    }
    // The one deviation: an activation split, and a hybrid is the runner-up within 2%.
    EXPECT_EQ(strategy, "activation") << n << ": " << r.dump();
    const std::string why = r.at("why").get<std::string>();
    const size_t at = why.find("next best hybrid");
    ASSERT_NE(at, std::string::npos) << n << ": " << why;
    const size_t pct = why.find("(+", at);
    ASSERT_NE(pct, std::string::npos) << why;
    EXPECT_LT(std::stod(why.substr(pct + 2)), 2.0) << n << ": " << why;
  }
  EXPECT_GE(hybrid * 10, lengths * 9) << hybrid << " of " << lengths;
}

TEST_F(Table3, LatencyColumnsMatchThePaperWithinThirtyPercent) {
  struct Paper {
    std::string weight;
    int64_t n;
    double gpu, npu;
  };
  for (const Paper& p : {Paper{"q", 1, 511, 693}, Paper{"gate+up", 1, 1903, 3886},
                         Paper{"down", 1, 1467, 6506}, Paper{"q", 128, 7306, 912},
                         Paper{"q", 256, 10841, 1884}, Paper{"down", 256, 35231, 23445}}) {
    const nlohmann::json r = row(p.weight, p.n);
    EXPECT_NEAR(r.at("t_gpu_us").get<double>() / p.gpu, 1.0, 0.3) << r.dump();
    EXPECT_NEAR(r.at("t_npu_us").get<double>() / p.npu, 1.0, 0.3) << r.dump();
  }
}

}  // namespace
}  // namespace duet
