// Issue 25's device-in-the-loop check: the GA's Pareto solutions for a small scenario of two tiny
// models (tiny-fortune and mkmodel's tiny qwen2, one group), each re-run through a real stack on
// this host serving both models at once, with each model placed as the solution says
// (`stack up --model fortune=A --model qwen=B --model-plan NAME=subgraph:FILE`). For each
// solution: the modelled makespan (puzzle/simulator.h on the SoC profile, periods long enough
// that no request waits for the previous one) and the measured one (both models' requests of a
// group released together through the client API; makespan = release to the later Done), mean
// and p90 over the group's requests, and whether the two orders of the solutions agree.
//
//   puzzle_device_check --fortune F.gguf --qwen Q.gguf [--duet build/bin/duet] [--soc sd8gen3]
//                       [--requests 8] [--repeats 3] [--seed 1] [--stack mmcheck]
//                       [--work-dir /tmp/puzzle-check] [--out results.json]
// The stack runs every model's remaining plan gpu-only (DUET_PLAN); model priorities (the GA's
// third chromosome) have no counterpart in the stack yet: models' steps take turns.
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

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw Error(Errc::invalid_argument, k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--fortune")
      a.fortune = v;
    else if (k == "--qwen")
      a.qwen = v;
    else if (k == "--duet")
      a.duet = v;
    else if (k == "--soc")
      a.soc = v;
    else if (k == "--stack")
      a.stack = v;
    else if (k == "--work-dir")
      a.work_dir = v;
    else if (k == "--out")
      a.out = v;
    else if (k == "--requests")
      a.requests = std::stoi(v);
    else if (k == "--repeats")
      a.repeats = std::stoi(v);
    else if (k == "--seed")
      a.seed = std::stoull(v);
    else
      throw Error(Errc::invalid_argument, "unknown option " + k);
  }
  if (a.fortune.empty() || a.qwen.empty())
    throw Error(Errc::invalid_argument, "give --fortune and --qwen (model files)");
  return a;
}

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

// The group's requests through the stack: both models' requests released together, the next
// group once both are done; makespans in ms (release to the later Done).
std::vector<double> measure(const Args& a, const Scenario& sc,
                            const std::vector<std::string>& names) {
  client::Client c(client::stack_endpoint(a.stack));
  std::vector<double> makespans;
  for (int j = 0; j < a.requests; ++j) {
    const auto release = Clock::now();
    std::map<uint64_t, bool> open;
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
      open[c.submit(req)] = true;
    }
    Clock::time_point last = release;
    while (!open.empty()) {
      const auto e = c.next_event(std::chrono::seconds(120));
      if (!e) throw Error(Errc::timeout, "no answer within 120 s");
      if (e->kind == client::Event::Kind::error) throw Error(e->code, e->message);
      if (e->kind == client::Event::Kind::done) {
        open.erase(e->request_id);
        last = Clock::now();
      }
    }
    makespans.push_back(std::chrono::duration<double, std::milli>(last - release).count());
  }
  return makespans;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args a = parse(argc, argv);
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
  std::filesystem::create_directories(a.work_dir);
  nlohmann::json out = {{"soc", soc.name},
                        {"seed", a.seed},
                        {"scenario", scenario_to_json(sc)},
                        {"requests", a.requests},
                        {"repeats", a.repeats},
                        {"search_s", ga.search_s},
                        {"solutions", nlohmann::json::array()}};
  std::printf(
      "| solution | placement (fortune; qwen) | modelled mean / p90 ms (%s) | measured "
      "mean / p90 ms (this host, best of %d) |\n|---|---|---|---|\n",
      soc.name.c_str(), a.repeats);
  for (size_t i = 0; i < ga.solutions.size(); ++i) {
    const nlohmann::json& sol = ga.detail["solutions"][i];
    // Modelled: a period so long that each request runs alone (no queueing behind the last).
    const std::vector<double> modelled = objectives_ms(sm.run(ga.solutions[i], 1000.0));
    std::string flags, placement;
    for (size_t m = 0; m < names.size(); ++m) {
      const std::string path =
          a.work_dir + "/solution" + std::to_string(i) + "-" + names[m] + ".json";
      std::ofstream(path) << sol["models"][m].dump(1) << "\n";
      flags += " --model " + names[m] + "='" + files[m] + "' --model-plan " + names[m] +
               "=subgraph:" + path;
      std::string p;
      for (const auto& s : sol["models"][m]["subgraphs"])
        p += (p.empty() ? "" : " ") + std::to_string(s["first"].get<int>()) + "-" +
             std::to_string(s["last"].get<int>()) + ":" + s["device"].get<std::string>();
      placement += (placement.empty() ? "" : "; ") + p;
    }
    run_or_throw("'" + a.duet + "' stack up --timeout 120 --plan gpu-only --stack " + a.stack +
                 flags + " > /dev/null");
    std::vector<double> best;
    try {
      (void)measure(a, sc, names);  // warm: programs registered, NPU graphs compiled
      for (int r = 0; r < a.repeats; ++r) {
        const std::vector<double> ms = measure(a, sc, names);
        if (best.empty() || mean_p90(ms).first < mean_p90(best).first) best = ms;
      }
    } catch (...) {
      std::system(("'" + a.duet + "' stack down --stack " + a.stack + " > /dev/null").c_str());
      throw;
    }
    run_or_throw("'" + a.duet + "' stack down --stack " + a.stack + " > /dev/null");
    const auto [mean, p90] = mean_p90(best);
    out["solutions"].push_back({{"placement", sol},
                                {"modelled_ms", {{"mean", modelled[0]}, {"p90", modelled[1]}}},
                                {"measured_ms", {{"mean", mean}, {"p90", p90}, {"all", best}}}});
    std::printf("| %zu | %s | %.2f / %.2f | %.2f / %.2f |\n", i, placement.c_str(), modelled[0],
                modelled[1], mean, p90);
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
      ++pairs;
      agree += (dm < 0) == (dh < 0);
    }
  out["order_agreement"] = {{"agree", agree}, {"pairs", pairs}};
  std::printf("\norder of the solutions' means, modelled vs measured: %d of %d pairs agree\n",
              agree, pairs);
  if (!a.out.empty()) std::ofstream(a.out) << out.dump(1) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "puzzle_device_check: %s\n", e.what());
  return 2;
}
