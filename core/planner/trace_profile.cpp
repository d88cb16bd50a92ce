#include "core/planner/trace_profile.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <tuple>

#include "core/base/error.h"

namespace duet {
namespace {

// services/frontend/frontend_trace.cpp's measured process and lanes.
constexpr int kMeasuredPid = 1, kFrontendTid = 1, kGpuTid = 2, kNpuTid = 3;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

// Plans whose matmuls each compute the whole weight for every token of the step.
bool unsplit_plan(const std::string& plan) {
  for (const char* p : {"gpu-only", "npu-only", "layer"})
    if (plan.rfind(p, 0) == 0) return true;
  return false;
}

// "MatMul q L3" -> the layer's q weight; "Logits logits" -> the output matrix.
const ops::Matrix* weight_named(const LlamaModel& model, const std::string& name, OpKind* kind) {
  std::istringstream in(name);
  std::string op, role, layer_tag;
  in >> op >> role >> layer_tag;
  if (op == "Logits") {
    *kind = OpKind::Logits;
    return &model.output;
  }
  if (op != "MatMul" || layer_tag.size() < 2 || layer_tag[0] != 'L') return nullptr;
  *kind = OpKind::MatMul;
  const size_t layer = std::stoul(layer_tag.substr(1));
  if (layer >= model.layers.size())
    throw Error(Errc::bad_format, "trace names layer " + layer_tag + ", the model has " +
                                      std::to_string(model.layers.size()));
  const LlamaLayer& l = model.layers[layer];
  const std::map<std::string, const ops::Matrix*> by_role = {
      {"q", &l.wq},        {"k", &l.wk},    {"v", &l.wv},       {"o", &l.wo},
      {"gate", &l.w_gate}, {"up", &l.w_up}, {"down", &l.w_down}};
  const auto it = by_role.find(role);
  return it == by_role.end() ? nullptr : it->second;
}

struct StepInfo {
  std::string plan;
  int64_t tokens = 0, sequences = 1;
  double frontend_us = 0, device_us = 0;  // the step's wall time; its longest device span
  double ops_us = 0;                      // every op's measured time, both devices
  int waits = 0;                          // ops that waited on the other device's flags
};

}  // namespace

TraceProfileReport profile_from_traces(const std::vector<nlohmann::json>& traces,
                                       const LlamaModel& model, const std::string& model_key) {
  TraceProfileReport r;
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<double>> samples;
  std::vector<double> overheads, syncs;
  for (const nlohmann::json& trace : traces) {
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
      throw Error(Errc::bad_format, "not a duet trace: no traceEvents array");
    std::map<int64_t, StepInfo> steps;
    const auto& events = trace["traceEvents"];
    for (const auto& e : events) {  // the steps first: their tokens and plan
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "step")
        continue;
      const auto& a = e.at("args");
      StepInfo& s = steps[a.at("step").get<int64_t>()];
      if (e.value("tid", 0) == kFrontendTid) {
        s.plan = a.value("plan", "");
        s.tokens = a.value("tokens", int64_t{0});
        s.sequences = std::max<int64_t>(1, a.value("sequences", int64_t{1}));
        s.frontend_us = e.value("dur", 0.0);
      } else {
        s.device_us = std::max(s.device_us, e.value("dur", 0.0));
      }
    }
    for (const auto& e : events) {  // every op's time and flag waits, per step
      const int tid = e.value("tid", 0);
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "op" || (tid != kGpuTid && tid != kNpuTid))
        continue;
      const auto& a = e.at("args");
      const auto step = steps.find(a.at("step").get<int64_t>());
      if (step == steps.end()) continue;
      step->second.ops_us += a.value("measured_us", 0.0);
      if (a.value("wait_us", 0.0) > 0.5) ++step->second.waits;
    }
    for (const auto& [number, s] : steps) {
      if (s.frontend_us > 0 && s.device_us > 0) overheads.push_back(s.frontend_us - s.device_us);
      if (s.waits > 0 && unsplit_plan(s.plan) && s.device_us > s.ops_us)
        syncs.push_back((s.device_us - s.ops_us) / s.waits);
    }
    r.steps += steps.size();
    for (const auto& e : events) {
      const int tid = e.value("tid", 0);
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "op" || (tid != kGpuTid && tid != kNpuTid))
        continue;
      OpKind kind = OpKind::MatMul;
      const ops::Matrix* w = weight_named(model, e.at("name").get<std::string>(), &kind);
      if (!w) continue;
      const auto& a = e.at("args");
      const auto step = steps.find(a.at("step").get<int64_t>());
      if (step == steps.end() || !unsplit_plan(step->second.plan)) {
        ++r.skipped_ops;
        continue;
      }
      const int64_t n = kind == OpKind::Logits ? step->second.sequences : step->second.tokens;
      const double us = a.value("measured_us", 0.0);
      if (n <= 0 || !(us > 0)) continue;
      const Device device = tid == kGpuTid ? Device::gpu : Device::npu;
      samples[{static_cast<int>(device), static_cast<int>(kind), static_cast<int>(w->type),
               static_cast<int64_t>(w->rows), static_cast<int64_t>(w->cols), n}]
          .push_back(us);
      ++r.op_spans;
    }
  }
  if (samples.empty())
    throw Error(Errc::invalid_argument,
                "the traces hold no matmul of a gpu-only, npu-only or layer step");
  Profile& p = r.profile;
  p.timing = "steps";
  p.device = "this host, in steps (duet trace)";
  p.soc = "host";
  p.shape = model_key;
  for (const auto& [key, us] : samples) {
    const auto& [device, kind, wtype, m, k, n] = key;
    p.entries.push_back({static_cast<Device>(device), static_cast<OpKind>(kind),
                         static_cast<DType>(wtype), m, k, n, median(us)});
  }
  if (!overheads.empty()) p.handoff_us = std::max(0.0, median(overheads));
  if (!syncs.empty()) r.handoff_sync_us = median(syncs);
  // The two device processes share this host's cores (each would use all of them alone), so
  // while both run each gets about half: contention 1 (trace_profile.h).
  p.contention = 1.0;
  return r;
}

}  // namespace duet
