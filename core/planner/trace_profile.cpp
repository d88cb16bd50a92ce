#include "core/planner/trace_profile.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <list>
#include <map>
#include <sstream>
#include <tuple>
#include <utility>

#include "core/base/error.h"
#include "core/planner/solver.h"
#include "core/program/program.h"

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

// What one device did in a step.
struct DeviceWork {
  double span_us = 0;   // its step span
  double ops_us = 0;    // its ops' measured time
  double waits_us = 0;  // its waits on the other device's flags
  int ops = 0;          // its ops (fused ones too: they have no time of their own)
  int waiting_ops = 0;  // ops that waited on the other device's flags
  double other_us = 0;  // GPU: the ops that are not matmuls
};

struct StepInfo {
  std::string plan;
  int64_t tokens = 0, sequences = 1, context = 0;
  double begin_us = 0, frontend_us = 0;  // the frontend's step: start, wall time
  DeviceWork dev[2];                     // Device::gpu, Device::npu
  double device_us() const { return std::max(dev[0].span_us, dev[1].span_us); }
};

bool is_matmul_name(const std::string& name) {
  return name.rfind("MatMul", 0) == 0 || name.rfind("Logits", 0) == 0;
}

// The expected time of what the samples time, less the host's other tenants: the mean of the
// samples within 3x their median. TTFT and TPOT are means over steps and requests, and some
// costs are systematic yet not in the median (a decode step right after a prefill runs on caches
// the prefill evicted: 1.5-3x the later ones); a span past 3x its median is a preempted worker or
// a late wake-up (bench/modeled/host_stalls.py counts those apart, by the same rule).
double typical(const std::vector<double>& v) {
  if (v.empty()) return 0.0;
  const double limit = 3.0 * median(v);
  double sum = 0;
  size_t n = 0;
  for (double x : v)
    if (x <= limit) {
      sum += x;
      ++n;
    }
  return n ? sum / static_cast<double>(n) : median(v);
}

// gap(tokens) = a + b (tokens - 1): a from the steps of the fewest tokens (decode: most of a
// run's steps, so well measured), b the median over the other token counts of their typical
// gap's rise per token from it (a prefill's few steps are noisy: one stalled step
// must not move the decode figure). b >= 0.
std::pair<double, double> gap_line(const std::map<int64_t, std::vector<double>>& by_tokens) {
  if (by_tokens.empty()) return {0.0, 0.0};
  const auto& [n0, first] = *by_tokens.begin();
  const double g0 = typical(first);
  std::vector<double> slopes;
  for (const auto& [n, v] : by_tokens)
    if (n > n0) slopes.push_back((typical(v) - g0) / static_cast<double>(n - n0));
  const double b = slopes.empty() ? 0.0 : std::max(0.0, median(slopes));
  return {std::max(0.0, g0 - b * static_cast<double>(n0 - 1)), b};
}

}  // namespace

TraceProfileReport profile_from_traces(const std::vector<nlohmann::json>& traces,
                                       const LlamaModel& model, const std::string& model_key) {
  TraceProfileReport r;
  using Key = std::tuple<int, int, int, int64_t, int64_t, int64_t>;
  std::map<Key, std::vector<double>> samples;
  std::vector<double> overheads, between;
  std::map<int64_t, std::vector<double>> gpu_gaps, npu_gaps;  // per op, by the step's tokens
  std::map<std::string, std::vector<double>> around;          // by frontend_class
  std::vector<const StepInfo*> unsplit_waiting;      // steps whose hand-offs are measured below
  std::list<std::map<int64_t, StepInfo>> all_steps;  // a list: the pointers above stay valid
  for (const nlohmann::json& trace : traces) {
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array())
      throw Error(Errc::bad_format, "not a duet trace: no traceEvents array");
    std::map<int64_t, StepInfo>& steps = all_steps.emplace_back();
    const auto& events = trace["traceEvents"];
    for (const auto& e : events) {  // the steps first: their tokens and plan
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "step")
        continue;
      const auto& a = e.at("args");
      StepInfo& s = steps[a.at("step").get<int64_t>()];
      const int tid = e.value("tid", 0);
      if (tid == kFrontendTid) {
        s.plan = a.value("plan", "");
        s.tokens = a.value("tokens", int64_t{0});
        s.sequences = std::max<int64_t>(1, a.value("sequences", int64_t{1}));
        s.context = a.value("context", int64_t{0});
        s.begin_us = e.value("ts", 0.0);
        s.frontend_us = e.value("dur", 0.0);
      } else if (tid == kGpuTid || tid == kNpuTid) {
        s.dev[tid == kGpuTid ? 0 : 1].span_us = e.value("dur", 0.0);
      }
    }
    for (const auto& e : events) {  // every op's time and flag waits, per step and device
      const int tid = e.value("tid", 0);
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "op" || (tid != kGpuTid && tid != kNpuTid))
        continue;
      const auto& a = e.at("args");
      const auto step = steps.find(a.at("step").get<int64_t>());
      if (step == steps.end()) continue;
      DeviceWork& d = step->second.dev[tid == kGpuTid ? 0 : 1];
      const double us = a.value("measured_us", 0.0), wait = a.value("wait_us", 0.0);
      d.ops_us += us;
      d.waits_us += wait;
      ++d.ops;
      if (wait > 0.5) ++d.waiting_ops;
      if (!is_matmul_name(e.value("name", ""))) d.other_us += us;
    }
    const StepInfo* prev = nullptr;
    for (const auto& [number, s] : steps) {
      if (s.frontend_us > 0 && s.device_us() > 0) {
        overheads.push_back(s.frontend_us - s.device_us());
        around[frontend_class(s.dev[1].ops > 0, s.tokens > s.sequences)].push_back(s.frontend_us -
                                                                                   s.device_us());
      }
      if (prev && prev->frontend_us > 0 && s.frontend_us > 0)
        between.push_back(std::max(0.0, s.begin_us - (prev->begin_us + prev->frontend_us)));
      prev = &s;
      const DeviceWork &g = s.dev[0], &n = s.dev[1];
      // The GPU alone (nothing to wait for): its span less its ops is its gaps.
      if (g.ops > 0 && g.span_us > 0 && n.ops == 0) {
        gpu_gaps[s.tokens].push_back(std::max(0.0, g.span_us - g.ops_us - g.waits_us) / g.ops);
        if (s.plan.rfind("gpu-only", 0) == 0)
          r.gpu_steps.push_back({s.tokens, s.context, g.other_us});
      }
      if (n.ops > 0 && n.span_us > 0)
        npu_gaps[s.tokens].push_back(std::max(0.0, n.span_us - n.ops_us - n.waits_us) / n.ops);
      if (g.waiting_ops + n.waiting_ops > 0 && unsplit_plan(s.plan)) unsplit_waiting.push_back(&s);
    }
    r.steps += steps.size();
    // A matmul span followed by ops without time of their own (gpu_svc's sibling matmuls,
    // op_fusion.h, and its step chains, GpuKernels::begin_chain: one launch, its time on the
    // first) measured them all: not the first's shape.
    std::vector<double>* last_sample = nullptr;
    for (const auto& e : events) {
      const int tid = e.value("tid", 0);
      if (e.value("ph", "") != "X" || e.value("pid", 0) != kMeasuredPid ||
          e.value("cat", "") != "op" || (tid != kGpuTid && tid != kNpuTid))
        continue;
      OpKind kind = OpKind::MatMul;
      const ops::Matrix* w = weight_named(model, e.at("name").get<std::string>(), &kind);
      const bool folded = !(e.at("args").value("measured_us", 0.0) > 0);
      if (folded && last_sample) {
        last_sample->pop_back();
        --r.op_spans;
      }
      last_sample = nullptr;
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
      last_sample =
          &samples[{static_cast<int>(device), static_cast<int>(kind), static_cast<int>(w->type),
                    static_cast<int64_t>(w->rows), static_cast<int64_t>(w->cols), n}];
      last_sample->push_back(us);
      ++r.op_spans;
    }
  }
  std::erase_if(samples, [](const auto& s) { return s.second.empty(); });
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
                         static_cast<DType>(wtype), m, k, n, typical(us)});
  }
  if (!overheads.empty()) p.handoff_us = std::max(0.0, typical(overheads));
  // Each device's gap per op grows with the step's tokens (GPU: a prefill's first kernel starts
  // later, its kernels wake more work-groups; NPU: the publish of a bigger op's flag, the
  // consumer woken on the same cores): gap_line.
  std::tie(r.gpu_op_gap_us, r.gpu_op_gap_us_per_token) = gap_line(gpu_gaps);
  std::tie(r.npu_op_gap_us, r.npu_op_gap_us_per_token) = gap_line(npu_gaps);
  r.between_steps_us = typical(between);
  for (const auto& [cls, us] : around) r.frontend_us[cls] = std::max(0.0, typical(us));
  // An unsplit step's devices run one after the other: its span is every op, every gap and a
  // hand-off per flag wait.
  std::vector<double> syncs;
  for (const StepInfo* s : unsplit_waiting) {
    const DeviceWork &g = s->dev[0], &n = s->dev[1];
    const double beyond_first = static_cast<double>(std::max<int64_t>(0, s->tokens - 1));
    const double gpu_gap = r.gpu_op_gap_us + r.gpu_op_gap_us_per_token * beyond_first;
    const double npu_gap = r.npu_op_gap_us + r.npu_op_gap_us_per_token * beyond_first;
    const double left = s->device_us() - g.ops_us - n.ops_us - gpu_gap * g.ops - npu_gap * n.ops;
    syncs.push_back(std::max(0.0, left) / (g.waiting_ops + n.waiting_ops));
  }
  r.handoff_sync_us = typical(syncs);
  // The two device processes share this host's cores (each would use all of them alone), so
  // while both run each gets about half: contention 1 (trace_profile.h).
  p.contention = 1.0;
  return r;
}

double gpu_other_ops_us(const Schedule& schedule, const SocProfile& soc, int64_t tokens,
                        int64_t context) {
  TimelineOptions t;
  t.n_tokens = tokens;
  t.context = context;
  t.contention = false;
  double sum = 0;
  for (const TimedOp& op : compose_timeline(schedule, soc, solver_options_for(soc), t).gpu)
    if (op.kind != OpKind::MatMul && op.kind != OpKind::Logits) sum += op.compute_us;
  return sum;
}

std::string frontend_class(bool npu, bool prefill) {
  return std::string(npu ? "gpu+npu " : "gpu ") + (prefill ? "prefill" : "decode");
}

StepCostFit fit_step_costs(const TraceProfileReport& r, const LlamaModel& model, SocProfile& soc) {
  soc.gpu.params["op_gap_us"] = r.gpu_op_gap_us;
  soc.gpu.params["op_gap_us_per_token"] = r.gpu_op_gap_us_per_token;
  soc.npu.op_gap_us = r.npu_op_gap_us;
  soc.npu.op_gap_us_per_token = r.npu_op_gap_us_per_token;
  StepCostFit fit;
  // The typical non-matmul time per token count, at the median context of those steps: one
  // point per kind of step (a request's decode steps differ in context by a few positions, and
  // in warm-up more than that), so that decode and prefill weigh alike in the fit.
  std::map<int64_t, std::pair<std::vector<double>, std::vector<double>>> by_tokens;
  for (const StepWork& w : r.gpu_steps)
    if (w.tokens > 0 && w.other_us > 0) {
      by_tokens[w.tokens].first.push_back(w.other_us);
      by_tokens[w.tokens].second.push_back(static_cast<double>(w.context));
    }
  if (by_tokens.empty()) return fit;
  std::map<std::pair<int64_t, int64_t>, double> by_step;  // (tokens, context) -> us
  for (const auto& [tokens, v] : by_tokens)
    by_step[{tokens, static_cast<int64_t>(std::lround(median(v.second)))}] = typical(v.first);
  int64_t max_tokens = 1, max_ctx = 1;
  for (const auto& [key, us] : by_step) {
    max_tokens = std::max(max_tokens, key.first);
    max_ctx = std::max(max_ctx, key.first + key.second);
  }
  ProgramSpec spec;
  spec.model = &model;
  spec.plan = Plan::fixed("gpu-only");
  spec.max_tokens = static_cast<uint32_t>(max_tokens);
  spec.max_ctx = static_cast<uint32_t>((max_ctx + 15) / 16 * 16);
  spec.name = "step-costs";
  const Schedule schedule = schedule_from_programs(build_programs(spec), spec.plan.npu_mode);
  auto modelled = [&](const SocProfile& trial, int64_t tokens, int64_t context) {
    return gpu_other_ops_us(schedule, trial, tokens, context);
  };
  auto error = [&](const SocProfile& trial, double* worst) {
    double sum = 0;
    for (const auto& [key, us] : by_step) {
      const double e = std::log(std::max(modelled(trial, key.first, key.second), 1e-3) / us);
      sum += e * e;
      if (worst && std::abs(e) > std::abs(std::log(*worst))) *worst = std::exp(e);
    }
    return std::sqrt(sum / static_cast<double>(by_step.size()));
  };
  // Start: the launch-bound end (a decode step's time per non-matmul op) and the roofline's
  // rates; then multiplicative coordinate descent, the factors shrinking.
  double ops = 0;
  for (const ScheduleOp& op : schedule.gpu)
    if (op.kind != OpKind::MatMul && op.kind != OpKind::Logits) ++ops;
  auto& params = soc.gpu.params;
  params["op_fixed_us"] = std::max(1e-3, by_step.begin()->second / std::max(1.0, ops));
  params["elementwise_gbps"] = soc.gpu.bandwidth_gbps;
  params["attention_gflops"] = soc.gpu.achievable_gflops;
  const std::vector<std::function<double&(SocProfile&)>> free = {
      [](SocProfile& s) -> double& { return s.gpu.params["op_fixed_us"]; },
      [](SocProfile& s) -> double& { return s.gpu.params["elementwise_gbps"]; },
      [](SocProfile& s) -> double& { return s.gpu.params["attention_gflops"]; }};
  double best = error(soc, nullptr);
  for (double step : {16.0, 4.0, 2.0, 1.4, 1.15, 1.05, 1.01})
    for (bool improved = true; improved;) {
      improved = false;
      for (const auto& ref : free)
        for (double f : {step, 1.0 / step}) {
          const double old = ref(soc);
          ref(soc) = old * f;
          const double e = error(soc, nullptr);
          if (e < best - 1e-9) {
            best = e;
            improved = true;
          } else {
            ref(soc) = old;
          }
        }
    }
  fit.points = by_step.size();
  fit.rms_log = error(soc, &fit.worst);
  return fit;
}

}  // namespace duet
