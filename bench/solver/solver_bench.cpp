// solver_bench [--shape S] [--soc X] [--timing modeled|measured] [--stack ID]: prints JSON with
// how long profiling and solving take, the latency functions' error on held-out lengths (fit on
// the standard lengths, predict the sweep between them), and, per phase and length, the solver's
// plan against HeteroInfer's baselines under the same latencies (modelled or measured).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "core/base/error.h"
#include "core/planner/plan_store.h"

namespace {

using namespace duet;

nlohmann::json held_out(const Profile& p) {
  const std::vector<int64_t> standard = standard_profile_lengths();
  auto is_standard = [&](int64_t n) {
    return std::find(standard.begin(), standard.end(), n) != standard.end();
  };
  // (device, kind, m, k) -> points
  std::map<std::tuple<int, int, int64_t, int64_t>,
           std::pair<std::vector<LatencyPoint>, std::vector<LatencyPoint>>>
      by;
  for (const ProfileEntry& e : p.entries) {
    auto& [fit, held] = by[{static_cast<int>(e.device), static_cast<int>(e.kind), e.m, e.k}];
    (is_standard(e.n) ? fit : held).push_back({e.n, e.us});
  }
  double sum[2] = {0, 0}, worst[2] = {0, 0};
  int count[2] = {0, 0};
  for (const auto& [key, pts] : by) {
    const auto& [fit, held] = pts;
    if (fit.size() < 2 || held.empty()) continue;
    const int d = std::get<0>(key);
    const FitError e = d == static_cast<int>(Device::gpu)
                           ? held_out_error(GpuLatencyFn::fit(fit), held)
                           : held_out_error(NpuLatencyFn::fit(fit), held);
    sum[d] += e.mean_rel * e.points;
    count[d] += e.points;
    worst[d] = std::max(worst[d], e.max_rel);
  }
  auto entry = [&](int d) {
    return nlohmann::json{{"points", count[d]},
                          {"mean_rel_error", count[d] ? sum[d] / count[d] : 0.0},
                          {"max_rel_error", worst[d]}};
  };
  return {{"gpu_piecewise_linear", entry(0)}, {"npu_steps", entry(1)}};
}

int run(int argc, char** argv) {
  PlanQuery q;
  q.use_cache = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--shape")
      q.shape = value;
    else if (flag == "--soc")
      q.soc = value;
    else if (flag == "--timing")
      q.timing = value;
    else if (flag == "--stack")
      q.stack_id = value;
    else
      throw Error(Errc::invalid_argument, "unknown flag " + flag);
  }
  if (q.timing == "measured") q.use_cache = true;  // keep a measured profile between runs
  const QueryModel model = query_model(q);
  bool cached = false;
  const Profile profile = profile_for(q, model, &cached);
  nlohmann::json out = {{"bench", "solver"},
                        {"shape", model.key},
                        {"soc", q.soc},
                        {"timing", q.timing},
                        {"profile",
                         {{"device", profile.device},
                          {"ops", profile.entries.size()},
                          {"profiling_s", profile.profiling_s},
                          {"cached", cached}}},
                        {"held_out", held_out(profile)}};
  nlohmann::json plans = nlohmann::json::array();
  for (auto [phase, n] : std::vector<std::pair<Phase, int64_t>>{{Phase::decode, 1},
                                                                {Phase::prefill, 64},
                                                                {Phase::prefill, 135},
                                                                {Phase::prefill, 256},
                                                                {Phase::prefill, 300},
                                                                {Phase::prefill, 525},
                                                                {Phase::prefill, 1000},
                                                                {Phase::prefill, 1024}}) {
    q.phase = phase;
    q.n_tokens = n;
    const auto t0 = std::chrono::steady_clock::now();
    const nlohmann::json j = plan_json_for(q);
    const double solve_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double tensor = j.at("total_us").get<double>();
    nlohmann::json speedup = nlohmann::json::object();
    for (const auto& [name, us] : j.at("baselines").items())
      speedup[name] = us.get<double>() / tensor;
    plans.push_back(
        {{"phase", phase_name(phase)},
         {"tokens", n},
         {"npu_mode", j.at("npu_mode")},
         {"tensor_ms", tensor / 1000},
         {"baselines_ms",
          [&] {
            nlohmann::json b = nlohmann::json::object();
            for (const auto& [name, us] : j.at("baselines").items())
              b[name] = us.get<double>() / 1000;
            return b;
          }()},
         {"speedup_over", speedup},
         {"best_single_device", j.at("best_single_device").at("name")},
         {"never_slower_than_best_single",
          tensor <= j.at("best_single_device").at("total_us").get<double>() * (1 + 1e-9)},
         {"tokens_per_s", phase == Phase::prefill ? n * 1e6 / tensor : 1e6 / tensor},
         {"plan_ms_incl_profile", solve_ms}});
  }
  out["plans"] = plans;
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "solver_bench: %s\n", e.what());
    return 1;
  }
}
