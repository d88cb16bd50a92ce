// A subgraph placement (issue 25 item 2) served by a real stack: `stack up --plan subgraph:PATH`
// runs each layer's matmuls where the plan's units say (NPU, GPU, NPU here), and every greedy
// continuation equals the in-process reference forward's. A plan per phase (version 2) runs its
// prefill placement for prompt steps and its decode placement for decode steps, as `duet trace`
// shows step by step.
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
  // The reference's greedy continuation of `prompt` equals the stack's (the text before its
  // stats line).
  void expect_reference_tokens(const std::string& prompt, int max_tokens) {
    const CliResult r =
        run_duet("generate --stack " + id_ + " --max-tokens " + std::to_string(max_tokens) +
                     " --ignore-eos --json '" + prompt + "'",
                 "timeout 120");
    ASSERT_EQ(r.rc, 0) << r.out;
    const size_t at = r.out.rfind("\n{");
    const nlohmann::json j = nlohmann::json::parse(
        at == std::string::npos ? r.out : r.out.substr(at + 1), nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    // The reference prints the text, then a stats line starting "prompt:".
    const CliResult ref =
        run_duet("generate --model '" + kModel + "' --local --max-tokens " +
                     std::to_string(max_tokens) + " --ignore-eos '" + prompt + "'",
                 "timeout 120");
    ASSERT_EQ(ref.rc, 0) << ref.out;
    const std::string text = j["text"].get<std::string>();
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(ref.out.substr(0, text.size()), text) << prompt;
    EXPECT_EQ(ref.out.compare(text.size(), 7, "prompt:"), 0) << ref.out;
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
  for (const char* prompt : {"Once upon a time", "The fortune says", "Tomorrow"})
    expect_reference_tokens(prompt, 24);
}

// Prefill on the NPU and decode on the GPU, then the reverse: the reference's tokens, and in the
// trace of the last request its prompt step ran the prefill placement's devices and every
// decode step the decode one's (an engine that ignored the phases would run the prompt's
// placement, or one of them, for all).
TEST_F(SubgraphPlanStack, APlanPerPhaseRunsPrefillAndDecodeWhereItSays) {
  for (const bool prefill_on_npu : {true, false}) {
    SCOPED_TRACE(prefill_on_npu ? "prefill on the NPU" : "prefill on the GPU");
    const char* pre = prefill_on_npu ? "npu" : "gpu";
    const char* dec = prefill_on_npu ? "gpu" : "npu";
    const std::string path = (dir_ / (std::string("phases-") + pre + ".json")).string();
    std::ofstream(path) << nlohmann::json{
        {"version", 2},
        {"model", "tiny-fortune"},
        {"units", 13},
        {"prefill", {{"subgraphs", {{{"first", 0}, {"last", 12}, {"device", pre}}}}}},
        {"decode", {{"subgraphs", {{{"first", 0}, {"last", 12}, {"device", dec}}}}}}};
    const CliResult up = run_duet("stack up --timeout 90 --stack " + id_ + " --model '" + kModel +
                                  "' --plan subgraph:" + path);
    ASSERT_EQ(up.rc, 0) << up.out;
    for (const char* prompt : {"Once upon a time", "Tomorrow"}) expect_reference_tokens(prompt, 12);

    const std::string out = (dir_ / "trace.json").string();
    const CliResult tr = run_duet("trace --stack " + id_ + " --last --out " + out);
    ASSERT_EQ(tr.rc, 0) << tr.out;
    std::ifstream f(out);
    const nlohmann::json t = nlohmann::json::parse(f, nullptr, false);
    ASSERT_FALSE(t.is_discarded()) << out;
    int prefill_steps = 0, decode_steps = 0;
    for (const nlohmann::json& e : t["traceEvents"]) {
      // The frontend lane's step spans (process 1, category "step", with the engine's info).
      if (e.value("ph", "") != "X" || e["pid"] != 1 || e.value("cat", "") != "step" ||
          !e["args"].contains("phase"))
        continue;
      const nlohmann::json& a = e["args"];
      const bool decode = a["phase"] == "decode";
      const bool prompt_step = a["tokens"].get<int>() > 1 || prefill_steps + decode_steps == 0;
      EXPECT_EQ(a["phase"].get<std::string>(), prompt_step ? "prefill" : "decode") << a.dump();
      const bool on_npu = decode ? !prefill_on_npu : prefill_on_npu;
      EXPECT_EQ(a["npu_ops"].get<size_t>() > 0, on_npu) << a.dump();
      EXPECT_GT(a["gpu_ops"].get<size_t>(), 0u) << a.dump();  // norms, attention: the GPU's
      ++(decode ? decode_steps : prefill_steps);
    }
    EXPECT_EQ(prefill_steps, 1);
    EXPECT_EQ(decode_steps, 11);  // the first token comes from the prefill
    // Two placements, two programs, each bucket naming its phase.
    const CliResult st = run_duet("status --stack " + id_ + " --json");
    EXPECT_NE(st.out.find("\"phase\": \"decode\""), std::string::npos) << st.out;
    ASSERT_EQ(run_duet("stack down --stack " + id_).rc, 0);
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
