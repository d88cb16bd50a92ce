#include "puzzle/subgraph_plan.h"

#include "core/base/enum_names.h"
#include "core/base/error.h"

namespace duet::puzzle {

namespace {

constexpr std::string_view kProcNames[] = {"gpu", "npu", "both"};
static_assert(std::size(kProcNames) == kProcs, "a name for every Proc");

}  // namespace

std::string_view proc_name(Proc p) {
  return enum_name(kProcNames, p, "?");
}

int unit_count(const ModelShape& shape) {
  return 2 * shape.n_layer + 1;
}

std::string unit_name(int unit, int n_layer) {
  if (unit == 2 * n_layer) return "head";
  const std::string layer = "layer" + std::to_string(unit / 2);
  if (unit == 0) return "embed+" + layer + ".attn";
  return layer + (unit % 2 == 0 ? ".attn" : ".ffn");
}
namespace {

// One placement's subgraphs; `what` names the plan (and the phase, for a plan per phase).
void validate_placement(const std::vector<Subgraph>& subgraphs, int units,
                        const std::string& what) {
  if (subgraphs.empty()) throw Error(Errc::bad_format, what + "no subgraphs");
  int next = 0;
  for (size_t i = 0; i < subgraphs.size(); ++i) {
    const Subgraph& s = subgraphs[i];
    const std::string at = what + "subgraph " + std::to_string(i) + " [" + std::to_string(s.first) +
                           ", " + std::to_string(s.last) + "] ";
    if (s.first < 0 || s.last >= units)
      throw Error(Errc::bad_format, at + "is outside units [0, " + std::to_string(units) + ")");
    if (s.last < s.first) throw Error(Errc::bad_format, at + "ends before it starts");
    if (s.first > next)
      throw Error(Errc::bad_format, at + "leaves units " + std::to_string(next) + ".." +
                                        std::to_string(s.first - 1) + " unplaced");
    if (s.first < next) throw Error(Errc::bad_format, at + "overlaps the subgraph before it");
    if (static_cast<int>(s.device) >= kProcs)
      throw Error(Errc::bad_format, at + "has an unknown device");
    next = s.last + 1;
  }
  if (next != units)
    throw Error(Errc::bad_format, what + "units " + std::to_string(next) + ".." +
                                      std::to_string(units - 1) + " are unplaced");
}

nlohmann::json subgraphs_to_json(const std::vector<Subgraph>& subgraphs) {
  nlohmann::json subs = nlohmann::json::array();
  for (const Subgraph& s : subgraphs)
    subs.push_back({{"first", s.first}, {"last", s.last}, {"device", proc_name(s.device)}});
  return subs;
}

const nlohmann::json& field(const nlohmann::json& j, const char* name, const std::string& where) {
  if (!j.is_object() || !j.contains(name))
    throw Error(Errc::bad_format, where + ": missing field '" + name + "'");
  return j.at(name);
}

int int_field(const nlohmann::json& j, const char* name, const std::string& where) {
  const nlohmann::json& v = field(j, name, where);
  if (!v.is_number_integer())
    throw Error(Errc::bad_format, where + ": field '" + name + "' is not an integer");
  return v.get<int>();
}

// The "subgraphs" array of `j` (the plan, or one phase's object in it).
std::vector<Subgraph> subgraphs_from_json(const nlohmann::json& j, const std::string& where) {
  const nlohmann::json& subs = field(j, "subgraphs", where);
  if (!subs.is_array())
    throw Error(Errc::bad_format, where + ": field 'subgraphs' is not an array");
  std::vector<Subgraph> out;
  for (size_t i = 0; i < subs.size(); ++i) {
    const std::string at = where + " subgraph " + std::to_string(i);
    Subgraph s;
    s.first = int_field(subs[i], "first", at);
    s.last = int_field(subs[i], "last", at);
    const nlohmann::json& d = field(subs[i], "device", at);
    bool known = false;
    for (int k = 0; k < kProcs; ++k)
      if (d == proc_name(static_cast<Proc>(k))) {
        s.device = static_cast<Proc>(k);
        known = true;
      }
    if (!known)
      throw Error(Errc::bad_format,
                  at + ": device " + d.dump() + " is not \"gpu\", \"npu\" or \"both\"");
    out.push_back(s);
  }
  return out;
}

}  // namespace

void validate_subgraph_plan(const SubgraphPlan& plan, int expected_units) {
  const std::string what = "subgraph plan for '" + plan.model + "': ";
  if (plan.units != expected_units)
    throw Error(Errc::bad_format, what + "units is " + std::to_string(plan.units) +
                                      ", the model has " + std::to_string(expected_units));
  if (!plan.per_phase()) return validate_placement(plan.subgraphs, plan.units, what);
  validate_placement(plan.subgraphs, plan.units, what + "prefill ");
  validate_placement(plan.decode_subgraphs, plan.units, what + "decode ");
}

nlohmann::json subgraph_plan_to_json(const SubgraphPlan& plan) {
  nlohmann::json j = {
      {"version", plan.per_phase() ? 2 : 1}, {"model", plan.model}, {"units", plan.units}};
  if (!plan.per_phase()) {
    j["subgraphs"] = subgraphs_to_json(plan.subgraphs);
  } else {
    j["prefill"] = {{"subgraphs", subgraphs_to_json(plan.subgraphs)}};
    j["decode"] = {{"subgraphs", subgraphs_to_json(plan.decode_subgraphs)}};
  }
  return j;
}

SubgraphPlan subgraph_plan_from_json(const nlohmann::json& j) {
  const std::string where = "subgraph plan";
  const int version = int_field(j, "version", where);
  if (version < 1 || version > kSubgraphPlanVersion)
    throw Error(Errc::bad_format, where + ": version " + std::to_string(version) +
                                      ", this build reads 1 to " +
                                      std::to_string(kSubgraphPlanVersion));
  SubgraphPlan p;
  const nlohmann::json& model = field(j, "model", where);
  if (!model.is_string()) throw Error(Errc::bad_format, where + ": field 'model' is not a string");
  p.model = model.get<std::string>();
  p.units = int_field(j, "units", where);
  if (version == 1) {
    p.subgraphs = subgraphs_from_json(j, where);
  } else {
    if (j.contains("subgraphs"))
      throw Error(Errc::bad_format, where +
                                        ": version 2 places each phase apart ('prefill' and "
                                        "'decode' objects), not in a top-level 'subgraphs'");
    p.subgraphs = subgraphs_from_json(field(j, "prefill", where), where + " prefill");
    p.decode_subgraphs = subgraphs_from_json(field(j, "decode", where), where + " decode");
    // (An empty decode placement would read as version 1's "the same for both".)
    if (p.decode_subgraphs.empty())
      throw Error(Errc::bad_format, "subgraph plan for '" + p.model + "': decode no subgraphs");
  }
  validate_subgraph_plan(p, unit_count(model_shape(p.model)));
  return p;
}

}  // namespace duet::puzzle
