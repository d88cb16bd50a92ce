// The subgraph plan format: units, JSON round trip, and the validation errors a bad plan gets.
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {
namespace {

SubgraphPlan three_way() {  // llama3.2-1b: 16 layers, 33 units
  return {"llama3.2-1b", 33, {{0, 9, Proc::npu}, {10, 20, Proc::gpu}, {21, 32, Proc::both}}};
}

// Version 2: prefill mostly on the NPU, decode steps mostly on the GPU (as the per-phase GA
// chooses on the modelled SoC).
SubgraphPlan per_phase() {
  SubgraphPlan p{"llama3.2-1b", 33, {{0, 20, Proc::npu}, {21, 32, Proc::gpu}}};
  p.decode_subgraphs = {{0, 1, Proc::npu}, {2, 32, Proc::gpu}};
  return p;
}

// The Errc and message a call fails with.
template <typename F>
std::pair<Errc, std::string> failure(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  return {Errc::ok, ""};
}

TEST(SubgraphPlan, UnitsAreHalfLayersPlusTheHead) {
  EXPECT_EQ(unit_count(model_shape("llama3.2-1b")), 33);
  EXPECT_EQ(unit_name(0, 16), "embed+layer0.attn");
  EXPECT_EQ(unit_name(1, 16), "layer0.ffn");
  EXPECT_EQ(unit_name(6, 16), "layer3.attn");
  EXPECT_EQ(unit_name(32, 16), "head");
}

TEST(SubgraphPlan, JsonRoundTrips) {
  const SubgraphPlan p = three_way();
  const nlohmann::json j = subgraph_plan_to_json(p);
  EXPECT_EQ(j["subgraphs"][1]["device"], "gpu");
  EXPECT_EQ(j["subgraphs"][2]["device"], "both");
  EXPECT_EQ(subgraph_plan_from_json(j), p);
}

TEST(SubgraphPlan, ValidationNamesTheProblem) {
  auto bad = [](auto edit) {
    SubgraphPlan p = three_way();
    edit(p);
    return failure([&] { validate_subgraph_plan(p, 33); });
  };
  auto [code, msg] = bad([](SubgraphPlan& p) { p.subgraphs[1].first = 11; });
  EXPECT_EQ(code, Errc::bad_format);
  EXPECT_NE(msg.find("leaves units 10..10 unplaced"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs[1].first = 9; });
  EXPECT_NE(msg.find("overlaps"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs[2].last = 33; });
  EXPECT_NE(msg.find("outside units [0, 33)"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs[2].last = 31; });
  EXPECT_NE(msg.find("units 32..32 are unplaced"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs[1].last = 8; });
  EXPECT_NE(msg.find("ends before it starts"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs.clear(); });
  EXPECT_NE(msg.find("no subgraphs"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.units = 31; });
  EXPECT_NE(msg.find("units is 31, the model has 33"), std::string::npos) << msg;
  EXPECT_EQ(code, Errc::bad_format);
}

TEST(SubgraphPlan, JsonErrorsNameTheField) {
  nlohmann::json j = subgraph_plan_to_json(three_way());
  j["subgraphs"][0]["device"] = "cpu";
  auto [code, msg] = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_EQ(code, Errc::bad_format);
  EXPECT_NE(msg.find("\"cpu\" is not"), std::string::npos) << msg;

  j = subgraph_plan_to_json(three_way());
  j["subgraphs"][2].erase("last");
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("subgraph 2: missing field 'last'"), std::string::npos) << msg;

  j = subgraph_plan_to_json(three_way());
  j["version"] = 99;
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("version 99"), std::string::npos) << msg;

  j = subgraph_plan_to_json(three_way());
  j["units"] = "33";
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("'units' is not an integer"), std::string::npos) << msg;

  j = subgraph_plan_to_json(three_way());
  j["model"] = "no-such-model";
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_EQ(code, Errc::not_found);
}

TEST(SubgraphPlan, APlanPerPhaseRoundTripsAsVersion2) {
  const SubgraphPlan p = per_phase();
  const nlohmann::json j = subgraph_plan_to_json(p);
  EXPECT_EQ(j["version"], 2);
  EXPECT_FALSE(j.contains("subgraphs"));
  EXPECT_EQ(j["prefill"]["subgraphs"][0]["device"], "npu");
  EXPECT_EQ(j["decode"]["subgraphs"][1]["device"], "gpu");
  const SubgraphPlan back = subgraph_plan_from_json(j);
  EXPECT_EQ(back, p);
  EXPECT_TRUE(back.per_phase());
  EXPECT_EQ(back.of(Phase::prefill), p.subgraphs);
  EXPECT_EQ(back.of(Phase::decode), p.decode_subgraphs);
}

TEST(SubgraphPlan, AVersion1PlanPlacesBothPhasesAlike) {
  const nlohmann::json j = subgraph_plan_to_json(three_way());
  EXPECT_EQ(j["version"], 1);
  const SubgraphPlan p = subgraph_plan_from_json(j);
  EXPECT_FALSE(p.per_phase());
  EXPECT_EQ(p.of(Phase::decode), p.of(Phase::prefill));
  EXPECT_EQ(p.of(Phase::decode), three_way().subgraphs);
}

TEST(SubgraphPlan, APlanPerPhaseNamesThePhaseAndTheSubgraphAtFault) {
  auto bad = [](auto edit) {
    SubgraphPlan p = per_phase();
    edit(p);
    return failure([&] { validate_subgraph_plan(p, 33); });
  };
  auto [code, msg] = bad([](SubgraphPlan& p) { p.decode_subgraphs[1].first = 3; });
  EXPECT_EQ(code, Errc::bad_format);
  EXPECT_NE(msg.find("decode subgraph 1 [3, 32] leaves units 2..2 unplaced"), std::string::npos)
      << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.subgraphs[1].first = 20; });
  EXPECT_NE(msg.find("prefill subgraph 1 [20, 32] overlaps"), std::string::npos) << msg;
  std::tie(code, msg) = bad([](SubgraphPlan& p) { p.decode_subgraphs[1].last = 31; });
  EXPECT_NE(msg.find("decode units 32..32 are unplaced"), std::string::npos) << msg;

  nlohmann::json j = subgraph_plan_to_json(per_phase());
  j.erase("decode");
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_EQ(code, Errc::bad_format);
  EXPECT_NE(msg.find("missing field 'decode'"), std::string::npos) << msg;

  j = subgraph_plan_to_json(per_phase());
  j["decode"]["subgraphs"][0].erase("last");
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("decode subgraph 0: missing field 'last'"), std::string::npos) << msg;

  j = subgraph_plan_to_json(per_phase());
  j["prefill"]["subgraphs"][1]["device"] = "dsp";
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("prefill subgraph 1: device \"dsp\" is not"), std::string::npos) << msg;

  j = subgraph_plan_to_json(per_phase());
  j["decode"]["subgraphs"] = nlohmann::json::array();
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("decode no subgraphs"), std::string::npos) << msg;

  // A version 1 body under version 2 (or the reverse) is refused, not read as something else.
  j = subgraph_plan_to_json(three_way());
  j["version"] = 2;
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("not in a top-level 'subgraphs'"), std::string::npos) << msg;
  j = subgraph_plan_to_json(per_phase());
  j["version"] = 1;
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("missing field 'subgraphs'"), std::string::npos) << msg;
  j["version"] = 3;
  std::tie(code, msg) = failure([&] { subgraph_plan_from_json(j); });
  EXPECT_NE(msg.find("version 3, this build reads 1 to 2"), std::string::npos) << msg;
}

}  // namespace
}  // namespace duet::puzzle
