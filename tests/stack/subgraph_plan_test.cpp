// A subgraph placement (issue 25 item 2) served by a real stack: `stack up --plan subgraph:PATH`
// runs each layer's matmuls where the plan's units say (NPU, GPU, NPU here), and every greedy
// continuation equals the in-process reference forward's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/ipc/run_dir.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

const std::string kModel =
    std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf";

class SubgraphPlanStack : public test_support::StackFixture {
 protected:
  SubgraphPlanStack() : StackFixture("sg_", 14) {}
  std::string write_plan(const nlohmann::json& subgraphs) {
    const std::string path = (dir_ / "plan.json").string();
    std::ofstream(path) << nlohmann::json{
        {"version", 1}, {"model", "tiny-fortune"}, {"units", 13}, {"subgraphs", subgraphs}};
    return path;
  }
  test_support::TempDir tmp_{"duet-subgraph"};
  const std::filesystem::path dir_ = tmp_.path();
};

TEST_F(SubgraphPlanStack, GreedyTokensEqualTheReference) {
  const std::string plan = write_plan({{{"first", 0}, {"last", 2}, {"device", "npu"}},
                                       {{"first", 3}, {"last", 4}, {"device", "gpu"}},
                                       {{"first", 5}, {"last", 12}, {"device", "npu"}}});
  const CliResult up = run_duet("stack up --timeout 90 --stack " + id_ + " --model '" + kModel +
                                "' --plan subgraph:" + plan);
  ASSERT_EQ(up.rc, 0) << up.out;
  const CliResult status = run_duet("status --stack " + id_);
  EXPECT_NE(status.out.find("plan subgraph:" + plan), std::string::npos) << status.out;
  for (const char* prompt : {"Once upon a time", "The fortune says", "Tomorrow"}) {
    const CliResult r = run_duet(
        "generate --stack " + id_ + " --max-tokens 24 --ignore-eos --json '" + prompt + "'",
        "timeout 120");
    ASSERT_EQ(r.rc, 0) << r.out;
    const size_t at = r.out.rfind("\n{");
    const nlohmann::json j = nlohmann::json::parse(
        at == std::string::npos ? r.out : r.out.substr(at + 1), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    // The reference prints the text, then a stats line starting "prompt:".
    const CliResult ref = run_duet(
        "generate --model '" + kModel + "' --local --max-tokens 24 --ignore-eos '" + prompt + "'",
        "timeout 120");
    ASSERT_EQ(ref.rc, 0) << ref.out;
    const std::string text = j["text"].get<std::string>();
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(ref.out.substr(0, text.size()), text) << prompt;
    EXPECT_EQ(ref.out.compare(text.size(), 7, "prompt:"), 0) << ref.out;
  }
}

TEST_F(SubgraphPlanStack, ABadPlanFileIsRefusedWithItsReason) {
  const std::string plan = write_plan({{{"first", 0}, {"last", 5}, {"device", "npu"}}});
  const CliResult up = run_duet("stack up --timeout 90 --stack " + id_ + " --model '" + kModel +
                                "' --plan subgraph:" + plan);
  if (up.rc == 0) {
    // The engine is built on the first request: the request gets the plan's error.
    const CliResult r =
        run_duet("generate --stack " + id_ + " --max-tokens 4 'Hello'", "timeout 120");
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("unplaced"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(up.out.find("unplaced"), std::string::npos) << up.out;
  }
}

}  // namespace
}  // namespace duet
