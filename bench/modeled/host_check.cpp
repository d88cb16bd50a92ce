// The timeline model checked on this machine (issue 23, item 4).
//   host_check fit --profile MEASURED.json --out host.toml [--name host] [--fast-sync-us US]
//     fits a SoC profile for the machine a measured profile (core/planner/profiler.h, written by
//     `duet plan --timing measured`) was taken on (core/planner/soc_profile_fit.h); prints the
//     fit's error per device as JSON.
//   host_check model --soc host.toml --model M.gguf (--plan NAME | --plan-json FILE) --tokens N
//                    [--context C] [--max-tokens 64] [--max-ctx 512] [--step-overhead-us US]
//                    [--between-steps-us US] [--frontend-json FIT.json] [--profile MEASURED.json]
//     builds the model's programs for the plan (core/program/program_builder, as the stack does),
//     composes one step on that profile's timeline (core/planner/timeline.h), pipelined (fast sync)
//     and with every op at its isolated cost, and (--profile) with the measured profile's own
//     matmul times in place of the fitted models; prints them as JSON, each with the frontend's
//     time per step added (--step-overhead-us around the devices, --between-steps-us between two
//     steps; --frontend-json: both from `duet profile --report-json`, the time around the devices
//     of the same kind of step: core/planner/trace_profile.h). run_host_check.sh sets them beside
//     the TTFT / TPOT measured through the real stack.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/planner/profiler.h"
#include "core/planner/soc_profile_fit.h"
#include "core/planner/solver.h"
#include "core/planner/timeline.h"
#include "core/planner/trace_profile.h"
#include "core/program/program.h"

namespace {

using namespace duet;

std::map<std::string, std::string> parse_flags(int argc, char** argv, int from) {
  std::map<std::string, std::string> f;
  for (int i = from; i < argc; ++i) {
    if (std::strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc)
      throw Error(Errc::invalid_argument, std::string("host_check: bad argument ") + argv[i]);
    f[argv[i] + 2] = argv[i + 1];
    ++i;
  }
  return f;
}

std::string need(const std::map<std::string, std::string>& f, const std::string& key) {
  auto it = f.find(key);
  if (it == f.end()) throw Error(Errc::invalid_argument, "host_check: --" + key + " is required");
  return it->second;
}

std::string get(const std::map<std::string, std::string>& f, const std::string& key,
                const std::string& fallback) {
  auto it = f.find(key);
  return it == f.end() ? fallback : it->second;
}

int fit(const std::map<std::string, std::string>& f) {
  const Profile measured = load_profile(need(f, "profile"));
  const SocProfile start = load_soc_profile(get(f, "start", "sd8gen3"));
  const double fast_sync = std::stod(get(f, "fast-sync-us", "0"));
  const SocFitReport r = fit_soc_profile(measured, start, get(f, "name", "host"), fast_sync);
  const std::string out = need(f, "out");
  {
    std::ofstream o(out);
    o << soc_profile_toml(r.soc,
                          "This machine's SoC profile, fitted by bench/modeled/host_check "
                          "to a measured profile\n(" +
                              measured.device + ", " + measured.shape + ", " +
                              std::to_string(measured.entries.size()) +
                              " points): core/planner/soc_profile_fit.h.");
    if (!o) throw Error(Errc::io, "cannot write " + out);
  }
  load_soc_profile(out);  // it must read back
  nlohmann::json report = soc_fit_report_json(r, measured);
  report["out"] = out;
  std::cout << report.dump() << "\n";
  return 0;
}

int model(const std::map<std::string, std::string>& f) {
  const SocProfile soc = load_soc_profile(need(f, "soc"));
  const auto m = LlamaModel::load(need(f, "model"));
  Plan plan;
  if (f.count("plan-json")) {
    std::ifstream in(f.at("plan-json"));
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.is_array()) j = j.at(0);
    plan = plan_from_json(j);
  } else {
    plan = Plan::fixed(need(f, "plan"));
  }
  ProgramSpec spec;
  spec.model = m.get();
  spec.plan = plan;
  spec.max_tokens = static_cast<uint32_t>(std::stoul(get(f, "max-tokens", "64")));
  spec.max_ctx = static_cast<uint32_t>(std::stoul(get(f, "max-ctx", "512")));
  spec.name = "host-check";
  const BuiltPrograms built = build_programs(spec);
  const Schedule s = schedule_from_programs(built, plan.npu_mode);
  const SolverOptions o = solver_options_for(soc);
  TimelineOptions t;
  t.n_tokens = std::stoll(need(f, "tokens"));
  t.context = std::stoll(get(f, "context", "0"));
  const Timeline fast = compose_timeline(s, soc, o, t);
  t.sync = SyncMode::blocking;
  const Timeline isolated = compose_timeline(s, soc, o, t);
  // The same step with the measured op times themselves (no fitted model) for the matmuls.
  double profiled_us = 0;
  if (f.count("profile")) {
    const ProfiledLatency lat(load_profile(f.at("profile")));
    t.sync = SyncMode::fast;
    t.matmul_latency = &lat;
    profiled_us = compose_timeline(s, soc, o, t).step_us;
  }
  // Per step, beside the devices' timeline: the frontend's time around the devices' spans and
  // its time from one step's end to the next one's start (both measured in the traced steps).
  double around = std::stod(get(f, "step-overhead-us", "0"));
  double between = std::stod(get(f, "between-steps-us", "0"));
  if (f.count("frontend-json")) {  // `duet profile --report-json`: this kind of step's
    std::ifstream in(f.at("frontend-json"));
    const nlohmann::json j = nlohmann::json::parse(in);
    between = j.value("between_steps_us", between);
    const std::string cls = frontend_class(!fast.npu.empty(), t.n_tokens > 1);
    if (j.contains("frontend_us") && j["frontend_us"].contains(cls))
      around = j["frontend_us"][cls].get<double>();
  }
  const double overhead = around + between;
  std::cout << nlohmann::json{{"plan", plan.name},
                              {"tokens", t.n_tokens},
                              {"context", t.context},
                              {"step_overhead_us", around},
                              {"step_kind", frontend_class(!fast.npu.empty(), t.n_tokens > 1)},
                              {"between_steps_us", between},
                              {"pipelined_us", fast.step_us + overhead},
                              {"isolated_us", isolated.step_us + overhead},
                              {"profiled_us", profiled_us > 0 ? profiled_us + overhead : 0.0},
                              {"pipelined", timeline_summary_json(fast)}}
                   .dump()
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc < 2) throw Error(Errc::invalid_argument, "usage: host_check fit|model --flags");
    const auto flags = parse_flags(argc, argv, 2);
    if (!std::strcmp(argv[1], "fit")) return fit(flags);
    if (!std::strcmp(argv[1], "model")) return model(flags);
    throw Error(Errc::invalid_argument, std::string("host_check: unknown command ") + argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "host_check: %s\n", e.what());
    return 1;
  }
}
