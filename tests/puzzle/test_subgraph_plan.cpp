// The subgraph plan format: units, JSON round trip, and the validation errors a bad plan gets.
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {
namespace {

SubgraphPlan three_way() {  // llama3.2-1b: 16 layers, 33 units
  return {"llama3.2-1b", 33, {{0, 9, Proc::npu}, {10, 20, Proc::gpu}, {21, 32, Proc::both}}};
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

}  // namespace
}  // namespace duet::puzzle
