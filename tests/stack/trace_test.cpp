// `duet trace` on real stack requests (issue 23 items 2 and 5): the file is trace-event JSON
// with the frontend's, gpu_svc's and npu_svc's lanes, every op of each step exactly once on its
// device's lane, every measured span inside its step's wall time, and the modelled SoC timeline
// of the same steps as a second process. The default plan (auto) executes the solver's plan for
// this host and names the plan it models on the SoC in stats, status and the trace; --plan
// forces one plan for both.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/ipc/run_dir.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class TraceStack : public test_support::StackFixture {
 protected:
  TraceStack() : StackFixture("tr_", 14) {}
  nlohmann::json json_of(const CliResult& r) {
    EXPECT_EQ(r.rc, 0) << r.out;
    // `generate --json` prints the generated text's stream first only without --json; with it,
    // the JSON object is the last line.
    const size_t at = r.out.rfind("\n{");
    const nlohmann::json j = nlohmann::json::parse(
        at == std::string::npos ? r.out : r.out.substr(at + 1), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  }
  nlohmann::json generate(int max_tokens) {
    return json_of(run_duet("generate --stack " + id_ + " --max-tokens " +
                                std::to_string(max_tokens) + " --ignore-eos --json 'Once upon a'",
                            "timeout 120"));
  }
  nlohmann::json trace(const std::string& which) {
    const std::string out = (dir_ / "trace.json").string();
    const CliResult r = run_duet("trace --stack " + id_ + " " + which + " --out " + out);
    EXPECT_EQ(r.rc, 0) << r.out;
    std::ifstream f(out);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << out;
    return j;
  }

  test_support::TempDir tmp_{"duet-trace"};
  const std::filesystem::path dir_ = tmp_.path();
};

// What a trace-event file must hold for one request's steps (the test's own reading of it).
void check_trace(const nlohmann::json& t, size_t expected_steps, bool npu_ops_expected) {
  ASSERT_TRUE(t.contains("traceEvents") && t["traceEvents"].is_array()) << t.dump().substr(0, 500);
  std::map<int, std::string> processes;
  std::map<std::pair<int, int>, std::string> threads;
  std::map<uint64_t, nlohmann::json> steps;  // the frontend lane's step spans, by step number
  std::vector<nlohmann::json> spans;
  for (const nlohmann::json& e : t["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e.contains("pid")) << e.dump();
    if (e["ph"] == "M") {
      if (e["name"] == "process_name") processes[e["pid"]] = e["args"]["name"];
      if (e["name"] == "thread_name") threads[{e["pid"], e["tid"]}] = e["args"]["name"];
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e.dump();
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["dur"] >= 0) << e.dump();
    if (e["pid"] == 1 && threads[{1, e["tid"]}] == "frontend" && e["cat"] == "step")
      steps[e["args"]["step"].get<uint64_t>()] = e;
    spans.push_back(e);
  }
  ASSERT_EQ(processes.size(), 2u);
  EXPECT_EQ(processes[1].rfind("measured here", 0), 0u) << processes[1];
  EXPECT_EQ(processes[2].rfind("modelled on", 0), 0u) << processes[2];
  int gpu_tid = 0, npu_tid = 0;
  for (const auto& [key, name] : threads) {
    if (key.first == 1 && name == "gpu_svc") gpu_tid = key.second;
    if (key.first == 1 && name == "npu_svc") npu_tid = key.second;
  }
  ASSERT_NE(gpu_tid, 0);
  ASSERT_NE(npu_tid, 0);
  ASSERT_EQ(steps.size(), expected_steps);

  // Every op of each step once on its device's lane; every measured span inside its step.
  std::map<std::pair<uint64_t, int>, std::multiset<int>> ops;  // (step, tid) -> op indices
  std::map<uint64_t, int> modeled_ops;
  for (const nlohmann::json& e : spans) {
    const uint64_t step = e["args"]["step"];
    ASSERT_TRUE(steps.count(step)) << "a span of a step with no frontend span: " << e.dump();
    if (e["pid"] == 2) {
      if (e["cat"] == "op") ++modeled_ops[step];
      continue;
    }
    const nlohmann::json& s = steps[step];
    const double begin = s["ts"], end = begin + s["dur"].get<double>();
    const double ts = e["ts"], te = ts + e["dur"].get<double>();
    EXPECT_GE(ts, begin - 0.01) << e.dump() << " starts before its step " << s.dump();
    EXPECT_LE(te, end + 0.01) << e.dump() << " ends after its step " << s.dump();
    if (e["cat"] == "op") ops[{step, e["tid"]}].insert(e["args"]["op"].get<int>());
  }
  size_t npu_ops = 0;
  for (const auto& [number, s] : steps) {
    for (const auto& [tid, key] : {std::pair{gpu_tid, "gpu_ops"}, std::pair{npu_tid, "npu_ops"}}) {
      const int n = s["args"][key];
      const std::multiset<int>& got = ops[{number, tid}];
      EXPECT_EQ(got.size(), static_cast<size_t>(n)) << "step " << number << " " << key;
      for (int i = 0; i < n; ++i) EXPECT_EQ(got.count(i), 1u) << "step " << number << " op " << i;
      if (tid == npu_tid) npu_ops += got.size();
    }
    EXPECT_GT(modeled_ops[number], 0) << "step " << number << " has no modelled ops";
  }
  if (npu_ops_expected) {
    EXPECT_GT(npu_ops, 0u);
  }
}

TEST_F(TraceStack, ARequestsStepsHaveBothLanesEveryOpOnceAndTheModelledSoc) {
  // npu-only: the matmuls on npu_svc, the rest on gpu_svc, so both lanes run every step and
  // wait on each other's flags.
  ASSERT_EQ(run_duet("stack up --plan npu-only --timeout 90 --stack " + id_).rc, 0);
  const nlohmann::json g = generate(6);
  EXPECT_EQ(g["stats"]["generated_tokens"], 6);
  // --plan forces the one plan for both: executed here and modelled on the SoC.
  EXPECT_EQ(g["stats"]["executed_plan"], "npu-only");
  EXPECT_EQ(g["stats"]["modeled_plan"], "npu-only on sd8gen3");
  EXPECT_GT(g["stats"]["modeled_tpot_ms"].get<double>(), 0);

  const nlohmann::json t = trace("--last");
  // A prompt of a few tokens: one prefill step, then one decode step per token after the first.
  check_trace(t, 6, true);
  EXPECT_EQ(t["otherData"]["modeled_plan"], "npu-only on sd8gen3");
  EXPECT_EQ(t["otherData"]["soc"], "sd8gen3");

  // A request number the ring does not hold is refused by name.
  const CliResult missing =
      run_duet("trace --stack " + id_ + " --request 999 --out " + (dir_ / "x.json").string());
  EXPECT_NE(missing.rc, 0);
  EXPECT_NE(missing.out.find("request 999 has no steps"), std::string::npos) << missing.out;
}

TEST_F(TraceStack, TheDefaultPlanExecutesTheHostsPlanAndModelsTheSolversSocPlan) {
  ASSERT_EQ(run_duet("stack up --timeout 90 --stack " + id_).rc, 0);
  const nlohmann::json g = generate(4);
  const nlohmann::json& stats = g["stats"];
  EXPECT_EQ(stats["plan"], "auto");
  EXPECT_EQ(stats["executed_plan"].get<std::string>().rfind(
                "auto: the solver's plan for this host (measured)", 0),
            0u)
      << stats.dump();
  EXPECT_EQ(stats["modeled_plan"].get<std::string>().rfind(
                "tensor: the solver's plan for sd8gen3 (modeled)", 0),
            0u)
      << stats.dump();
  EXPECT_GT(stats["modeled_ttft_ms"].get<double>(), 0);

  const CliResult st = run_duet("status --json --stack " + id_);
  const nlohmann::json fe = json_of(st)["frontend"];
  // The device services answer for themselves: gpu_svc its OpenCL device and the steps it ran,
  // npu_svc its SoC's NPU.
  const nlohmann::json devices = json_of(st)["devices"];
  EXPECT_FALSE(devices["gpu_svc"].value("device", "").empty()) << devices.dump();
  EXPECT_GT(devices["gpu_svc"].value("steps", 0), 0) << devices.dump();
  EXPECT_EQ(devices["npu_svc"].value("soc", ""), "sd8gen3") << devices.dump();
  EXPECT_EQ(fe["executed_plan"], stats["executed_plan"]) << fe.dump();
  EXPECT_EQ(fe["modeled_plan"], stats["modeled_plan"]) << fe.dump();
  // The engine's buckets: what runs here, and what the SoC is modelled running.
  for (const nlohmann::json& b : fe["engine"]["buckets"]) EXPECT_EQ(b["soc_plan"], "tensor");
  const uint64_t number = fe["trace"]["last_request_kept"];
  ASSERT_GT(number, 0u);

  const nlohmann::json t = trace("--request " + std::to_string(number));
  check_trace(t, 4, false);
  EXPECT_EQ(t["otherData"]["request"], number);
  EXPECT_EQ(t["otherData"]["modeled_plan"], stats["modeled_plan"]);
}

}  // namespace
}  // namespace duet
