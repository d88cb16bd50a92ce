// Issue 25's device-in-the-loop check: the GA's Pareto solutions for a small scenario of two tiny
// models (tiny-fortune and mkmodel's tiny qwen2, one group), the four whole-model mappings, the
// per-phase GA's Pareto solutions and Best Mapping per phase's, each re-run through a real stack
// on this host serving both models at once, with each model placed and ranked as the candidate
// says, so all three of Puzzle's chromosomes are executed (`stack up --model fortune=A --model
// qwen=B --model-plan NAME=subgraph:FILE --model-priority NAME=RANK`). A per-phase candidate's
// files are version 2 plans, which the stack executes per step: a step of decode tokens only runs
// the decode placement, any other the prefill one (puzzle/subgraph_plan.h). For each solution:
// the modelled makespan (puzzle/simulator.h on the SoC profile, periods long enough that no
// request waits for the previous one) and the measured one (both models' requests of a group
// released together through the client API; makespan = release to the later Done), mean and p90
// over the group's requests, each model's mean latency (release to its own Done: where the ranks
// show), and whether the two orders of the solutions agree.
//
//   puzzle_device_check --fortune F.gguf --qwen Q.gguf [--duet build/bin/duet] [--soc sd8gen3]
//                       [--requests 8] [--repeats 3] [--seed 1] [--stack mmcheck]
//                       [--work-dir /tmp/puzzle-check] [--out results.json]
// The stack runs every model's remaining plan gpu-only (DUET_PLAN). The whole-model mappings are
// ranked as Best Mapping's genomes are (fortune 0, qwen 1).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/ipc/client.h"
#include "puzzle/scenarios.h"

using namespace duet;
using namespace duet::puzzle;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string fortune, qwen, duet = "build/bin/duet", soc = "sd8gen3", stack = "mmcheck";
  std::string work_dir = "/tmp/puzzle-check", out;
  int requests = 8, repeats = 3;
  uint64_t seed = 1;
};

// Mean and p90 (nearest rank, as puzzle/simulator.h's objectives) of makespans in ms.
std::pair<double, double> mean_p90(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  double sum = 0;
  for (double v : ms) sum += v;
  const size_t rank = static_cast<size_t>(std::ceil(0.9 * double(ms.size())));
  return {sum / double(ms.size()), ms[std::max<size_t>(rank, 1) - 1]};
}

void run_or_throw(const std::string& cmd) {
  if (std::system(cmd.c_str()) != 0) throw Error(Errc::internal, "failed: " + cmd);
}

double mean_of(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / double(v.size());
}

// One run of the group's requests: makespans (release to the later Done) and each model's
// latencies (release to its Done), ms.
struct Measured {
  std::vector<double> makespans;
  std::vector<std::vector<double>> latency;  // [model][request]
};

// The group's requests through the stack: both models' requests released together, the next
// group once both are done.
Measured measure(const Args& a, const Scenario& sc, const std::vector<std::string>& names) {
  client::Client c(client::stack_endpoint(a.stack));
  Measured out;
  out.latency.resize(sc.models.size());
  for (int j = 0; j < a.requests; ++j) {
    const auto release = Clock::now();
    std::map<uint64_t, size_t> open;  // request id -> model
    for (size_t m = 0; m < sc.models.size(); ++m) {
      client::GenerateRequest req;
      req.model = names[m];
      // Ids 100.. (valid in both vocabularies): exactly the scenario's prompt length.
      for (int64_t t = 0; t < sc.models[m].prompt; ++t)
        req.prompt_ids.push_back(static_cast<int32_t>(100 + t));
      req.max_tokens = static_cast<int>(sc.models[m].output);
      req.ignore_eos = true;
      req.stream = false;
      req.heartbeat_ms = 0;
      open[c.submit(req)] = m;
    }
    Clock::time_point last = release;
    while (!open.empty()) {
      const auto e = c.next_event(std::chrono::seconds(120));
      if (!e) throw Error(Errc::timeout, "no answer within 120 s");
      if (e->kind == client::Event::Kind::error) throw Error(e->code, e->message);
      if (e->kind == client::Event::Kind::done) {
        last = Clock::now();
        out.latency[open.at(e->request_id)].push_back(
            std::chrono::duration<double, std::milli>(last - release).count());
        open.erase(e->request_id);
      }
    }
    out.makespans.push_back(std::chrono::duration<double, std::milli>(last - release).count());
  }
  return out;
}

// What the stack executed for `model`'s last request (`duet trace --last`): per phase, its steps
// and their NPU ops a step ("prefill 1 x 43 NPU ops, decode 15 x 17"): the placement run, phase
// by phase (a per-phase plan's decode steps run its decode placement).
std::string executed_phases(const Args& a, const std::string& model) {
  const std::string path = a.work_dir + "/trace-" + model + ".json";
  run_or_throw("'" + a.duet + "' trace --stack " + a.stack + " --last --model-name " + model +
               " --out " + path + " > /dev/null");
  std::ifstream f(path);
  const nlohmann::json t = nlohmann::json::parse(f);
  std::map<std::string, std::pair<int, size_t>> by_phase;  // phase -> steps, NPU ops
  for (const nlohmann::json& e : t.at("traceEvents"))
    if (e.value("ph", "") == "X" && e.value("pid", 0) == 1 && e.value("cat", "") == "step" &&
        e["args"].contains("phase")) {
      auto& [steps, ops] = by_phase[e["args"]["phase"].get<std::string>()];
      ++steps;
      ops += e["args"]["npu_ops"].get<size_t>();
    }
  std::string out;
  for (const auto& [phase, n] : by_phase)
    out += (out.empty() ? "" : ", ") + phase + " " + std::to_string(n.first) + " x " +
           std::to_string(n.second / static_cast<size_t>(std::max(n.first, 1)));
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  Args a;
  CLI::App app{"puzzle_device_check: the GA's solutions re-run through a two-model stack"};
  app.add_option("--fortune", a.fortune, "tiny-fortune model file")->required();
  app.add_option("--qwen", a.qwen, "mkmodel's tiny qwen2 model file")->required();
  app.add_option("--duet", a.duet, "the duet CLI");
  app.add_option("--soc", a.soc, "SoC profile");
  app.add_option("--stack", a.stack, "stack id");
  app.add_option("--work-dir", a.work_dir, "where the candidates' plans are written");
  app.add_option("--out", a.out, "write every result as JSON here");
  app.add_option("--requests", a.requests, "requests per model");
  app.add_option("--repeats", a.repeats, "measured runs per candidate (the best counts)");
  app.add_option("--seed", a.seed, "the GA's seed");
  CLI11_PARSE(app, argc, argv);
  const SocProfile soc = load_soc_profile(a.soc);
  Scenario sc;
  sc.groups = 1;
  sc.models = {{"tiny-fortune", 96, 16, 0}, {"tiny-qwen2", 64, 24, 0}};
  const std::vector<std::string> names = {"fortune", "qwen"};
  const std::vector<std::string> files = {std::filesystem::absolute(a.fortune).string(),
                                          std::filesystem::absolute(a.qwen).string()};
  ScenarioModel sm(sc, soc, a.requests);
  SearchOptions so;
  so.seed = a.seed;
  const MethodResult ga = run_puzzle(sm, so);
  const MethodResult ga_phases = run_puzzle(sm, so, 1.0, true);
  // The candidates: the GA's Pareto placements and priorities (genomes that differ only where
  // the stack runs the same, in cuts between subgraphs of one device, measure once), then each
  // model wholly on one device (the four mappings Best Mapping chooses from), so that the
  // modelled times differ across the rows.
  struct Candidate {
    std::string source;
    std::vector<SubgraphPlan> plans;
    std::vector<int> priority;  // [model] -> rank, 0 first
  };
  std::vector<Candidate> candidates;
  const std::vector<int> units = sm.units();
  // Two placements are the same when every unit is on the same device in both phases (a cut
  // between two subgraphs of one device changes nothing the stack runs).
  auto same_placement = [](const Candidate& x, const Candidate& y) {
    if (x.priority != y.priority) return false;
    for (size_t m = 0; m < x.plans.size(); ++m)
      for (const Phase phase : {Phase::prefill, Phase::decode})
        for (int u = 0; u < x.plans[m].units; ++u) {
          auto device_of = [u, phase](const SubgraphPlan& p) {
            for (const Subgraph& s : p.of(phase))
              if (u >= s.first && u <= s.last) return s.device;
            return Proc::both;
          };
          if (device_of(x.plans[m]) != device_of(y.plans[m])) return false;
        }
    return true;
  };
  // A candidate already there (the same placement and ranks) is measured once, named by both.
  auto add = [&](Candidate c) {
    const auto seen = std::find_if(candidates.begin(), candidates.end(),
                                   [&](const Candidate& o) { return same_placement(o, c); });
    if (seen == candidates.end())
      candidates.push_back(std::move(c));
    else if (seen->source.find(c.source) == std::string::npos)
      seen->source += " = " + c.source;
  };
  auto add_pareto = [&](const MethodResult& r, const std::string& source) {
    for (size_t i = 0; i < r.solutions.size(); ++i) {
      // A per-phase genome ranks 2M entries; a model's rank is its prefill entry's order.
      Candidate c{
          source + " " + std::to_string(i),
          {},
          model_ranks(r.detail["solutions"][i]["priority"].get<std::vector<int>>(), names.size())};
      for (size_t m = 0; m < names.size(); ++m)
        c.plans.push_back(subgraph_plan_from_json(r.detail["solutions"][i]["models"][m]));
      add(std::move(c));
    }
  };
  add_pareto(ga, "GA Pareto");
  // The GA's placements again with the ranks reversed: what its priority chromosome changes.
  const size_t n_ga = candidates.size();
  for (size_t i = 0; i < n_ga; ++i) {
    Candidate c = candidates[i];
    c.source += ", ranks reversed";
    for (int& r : c.priority) r = static_cast<int>(names.size()) - 1 - r;
    add(std::move(c));
  }
  for (Proc f : {Proc::gpu, Proc::npu})
    for (Proc q : {Proc::gpu, Proc::npu}) {
      Candidate c{"whole models", {}, {0, 1}};
      for (size_t m = 0; m < names.size(); ++m)
        c.plans.push_back({sc.models[m].shape, units[m], {{0, units[m] - 1, m == 0 ? f : q}}});
      add(std::move(c));
    }
  add_pareto(ga_phases, "per-phase GA Pareto");
  // Best Mapping per phase (its baseline): each Pareto mapping's models wholly on one device per
  // phase, ranked as Best Mapping's genomes are.
  const MethodResult best_phases = run_best_mapping_per_phase(sm);
  for (const nlohmann::json& map : best_phases.detail) {
    Candidate c{"per-phase Best Mapping Pareto", {}, {0, 1}};
    for (size_t m = 0; m < names.size(); ++m) {
      auto proc = [&](const char* phase) { return map[m][phase] == "npu" ? Proc::npu : Proc::gpu; };
      SubgraphPlan p{sc.models[m].shape, units[m], {{0, units[m] - 1, proc("prefill")}}};
      p.decode_subgraphs = {{0, units[m] - 1, proc("decode")}};
      c.plans.push_back(std::move(p));
    }
    add(std::move(c));
  }
  std::filesystem::create_directories(a.work_dir);
  nlohmann::json out = {{"soc", soc.name},
                        {"seed", a.seed},
                        {"scenario", scenario_to_json(sc)},
                        {"requests", a.requests},
                        {"repeats", a.repeats},
                        {"search_s", ga.search_s},
                        {"ga_pareto", ga.solutions.size()},
                        {"per_phase_search_s", ga_phases.search_s},
                        {"per_phase_ga_pareto", ga_phases.solutions.size()},
                        {"solutions", nlohmann::json::array()}};
  std::printf(
      "| candidate | placement (fortune; qwen) | ranks (fortune, qwen) | modelled mean / p90 ms "
      "(%s) | modelled latency fortune / qwen ms | measured mean / p90 ms (this host, best of %d) "
      "| measured latency fortune / qwen ms | executed, last request: steps x NPU ops a step "
      "(fortune; qwen) |\n|---|---|---|---|---|---|---|---|\n",
      soc.name.c_str(), a.repeats);
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& cand = candidates[i];
    // Modelled: a period so long that each request runs alone (no queueing behind the last).
    std::vector<SimModel> sim;
    for (size_t m = 0; m < names.size(); ++m)
      sim.push_back(
          {0, cand.priority[m],
           sm.steps(m, cand.plans[m].of(Phase::prefill), cand.plans[m].of(Phase::decode))});
    const SimResult sim_result = sm.run(sim, 1000.0);
    const std::vector<double> modelled = objectives_ms(sim_result);
    std::vector<double> modelled_latency;
    for (const std::vector<double>& us : sim_result.latency_us)
      modelled_latency.push_back(mean_of(us) / 1000.0);
    std::string flags, placement;
    nlohmann::json plans = nlohmann::json::array();
    for (size_t m = 0; m < names.size(); ++m) {
      const std::string path =
          a.work_dir + "/candidate" + std::to_string(i) + "-" + names[m] + ".json";
      plans.push_back(subgraph_plan_to_json(cand.plans[m]));
      std::ofstream(path) << plans.back().dump(1) << "\n";
      flags += " --model " + names[m] + "='" + files[m] + "' --model-plan " + names[m] +
               "=subgraph:" + path + " --model-priority " + names[m] + "=" +
               std::to_string(cand.priority[m]);
      // "0-12:npu" or, per phase, "prefill 0-12:npu / decode 0-12:gpu".
      // Adjacent subgraphs of one device merged: the stack runs them alike.
      auto text = [](const std::vector<Subgraph>& subgraphs) {
        std::string p;
        for (size_t k = 0; k < subgraphs.size(); ++k) {
          const Subgraph& s = subgraphs[k];
          size_t last = k;
          while (last + 1 < subgraphs.size() && subgraphs[last + 1].device == s.device) ++last;
          p += (p.empty() ? "" : " ") + std::to_string(s.first) + "-" +
               std::to_string(subgraphs[last].last) + ":" + std::string(proc_name(s.device));
          k = last;
        }
        return p;
      };
      const SubgraphPlan& sp = cand.plans[m];
      const std::string p = sp.per_phase() ? "prefill " + text(sp.subgraphs) + " / decode " +
                                                 text(sp.decode_subgraphs)
                                           : text(sp.subgraphs);
      placement += (placement.empty() ? "" : "; ") + p;
    }
    Measured best;
    std::string executed;
    try {
      // (Inside: a stack that did not come up healthy in time is taken down too.)
      run_or_throw("'" + a.duet + "' stack up --timeout 120 --plan gpu-only --stack " + a.stack +
                   flags + " > /dev/null");
      (void)measure(a, sc, names);  // warm: programs registered, NPU graphs compiled
      for (int r = 0; r < a.repeats; ++r) {
        Measured run = measure(a, sc, names);
        if (best.makespans.empty() ||
            mean_p90(run.makespans).first < mean_p90(best.makespans).first)
          best = std::move(run);
      }
      for (const std::string& name : names)
        executed += (executed.empty() ? "" : "; ") + executed_phases(a, name);
    } catch (...) {
      std::system(("'" + a.duet + "' stack down --stack " + a.stack + " > /dev/null").c_str());
      throw;
    }
    run_or_throw("'" + a.duet + "' stack down --stack " + a.stack + " > /dev/null");
    const auto [mean, p90] = mean_p90(best.makespans);
    const std::vector<double> latency = {mean_of(best.latency[0]), mean_of(best.latency[1])};
    out["solutions"].push_back(
        {{"source", cand.source},
         {"plans", plans},
         {"priority", cand.priority},
         {"modelled_ms",
          {{"mean", modelled[0]}, {"p90", modelled[1]}, {"latency", modelled_latency}}},
         {"measured_ms",
          {{"mean", mean}, {"p90", p90}, {"all", best.makespans}, {"latency", latency}}},
         {"executed", executed}});
    std::printf(
        "| %s | %s | %d, %d | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %.2f / %.2f | %s |\n",
        cand.source.c_str(), placement.c_str(), cand.priority[0], cand.priority[1], modelled[0],
        modelled[1], modelled_latency[0], modelled_latency[1], mean, p90, latency[0], latency[1],
        executed.c_str());
    std::fflush(stdout);
  }
  // Do the modelled and measured means order the solutions alike? (pairs that agree / all)
  int agree = 0, pairs = 0;
  const auto& sols = out["solutions"];
  for (size_t i = 0; i < sols.size(); ++i)
    for (size_t j = i + 1; j < sols.size(); ++j) {
      const double dm = sols[i]["modelled_ms"]["mean"].get<double>() -
                        sols[j]["modelled_ms"]["mean"].get<double>();
      const double dh = sols[i]["measured_ms"]["mean"].get<double>() -
                        sols[j]["measured_ms"]["mean"].get<double>();
      // Pairs the model calls a tie (within 1%) say nothing about its order.
      if (std::abs(dm) <= 0.01 * sols[i]["modelled_ms"]["mean"].get<double>()) continue;
      ++pairs;
      agree += (dm < 0) == (dh < 0);
    }
  out["order_agreement"] = {{"agree", agree}, {"pairs", pairs}};
  std::printf(
      "\norder of the candidates' means, modelled vs measured: %d of %d pairs agree "
      "(pairs the model ties left out)\n",
      agree, pairs);
  if (!a.out.empty()) std::ofstream(a.out) << out.dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "puzzle_device_check: %s\n", e.what());
  return 2;
}
