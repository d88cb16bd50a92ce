// duet plan: the solver's partition plan for a model shape (or file) on a SoC profile, printed like
// HeteroInfer's Table 3 (weight shape, activation shape, T_gpu, T_npu, strategy, ratio). Without
// --tokens it prints the lengths of Table 3: decode, then prefill at 128, 193-255 (sampled), 256,
// 257-272 (sampled) and up to 384.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/planner/plan_store.h"

namespace {

struct PlanArgs {
  duet::PlanQuery query;
  std::string phase;
  int64_t tokens = 0;
  bool json = false;
  bool no_cache = false;
};

// The token counts of the paper's Table 3 rows (ranges sampled at their ends and middle).
const std::vector<int64_t> kTable3Prefill = {128, 193, 224, 255, 256, 257, 264, 272, 320, 384};

void run_plan(PlanArgs& args) {
  duet::PlanQuery q = args.query;
  q.use_cache = !args.no_cache;
  std::vector<std::pair<duet::Phase, int64_t>> runs;
  if (args.tokens > 0) {
    const duet::Phase phase = args.phase.empty()
                                  ? (args.tokens == 1 ? duet::Phase::decode : duet::Phase::prefill)
                                  : duet::phase_from_name(args.phase);
    runs.emplace_back(phase, args.tokens);
  } else if (args.phase == "decode") {
    runs.emplace_back(duet::Phase::decode, 1);
  } else {
    if (args.phase.empty())
      runs.emplace_back(duet::Phase::decode, 1);
    else
      duet::phase_from_name(args.phase);  // rejects a misspelt phase
    for (int64_t n : kTable3Prefill) runs.emplace_back(duet::Phase::prefill, n);
  }
  std::vector<nlohmann::json> plans;
  for (auto [phase, n] : runs) {
    q.phase = phase;
    q.n_tokens = n;
    plans.push_back(duet::plan_json_for(q));
  }
  if (args.json) {
    std::printf("%s\n", (plans.size() == 1 ? plans[0] : nlohmann::json(plans)).dump(2).c_str());
    return;
  }
  const nlohmann::json& first = plans.front();
  std::printf("plan for %s on %s, %s timing (profile: %s, %zu points, %.3f s%s)\n",
              first.at("shape").get<std::string>().c_str(), q.soc.c_str(), q.timing.c_str(),
              first.at("profile").at("device").get<std::string>().c_str(),
              first.at("profile").at("entries").get<size_t>(),
              first.at("profile").at("profiling_s").get<double>(),
              first.at("profile").at("cached").get<bool>() ? ", cached" : "");
  std::printf("%s", duet::format_plan_table(plans).c_str());
}

duet::cli::RegisterCommand register_plan([](CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan", "Solve the GPU/NPU partition plan of a model (HeteroInfer Table 3 layout)");
  cmd->add_option("--shape", args->query.shape, "Named model shape (llama3-8b, llama2-7b, ...)")
      ->capture_default_str();
  cmd->add_option("--model", args->query.model_path,
                  "GGUF model file (its shapes and weight types)");
  cmd->add_option("--soc", args->query.soc, "SoC profile (deploy/soc/<name>.toml) or a path")
      ->capture_default_str();
  cmd->add_option("--timing", args->query.timing,
                  "modeled (timing models) or measured (the stack's services)")
      ->check(CLI::IsMember({"modeled", "measured"}))
      ->capture_default_str();
  cmd->add_option("--phase", args->phase, "prefill or decode")
      ->check(CLI::IsMember({"prefill", "decode"}));
  cmd->add_option("--tokens", args->tokens, "Token count (default: the lengths of Table 3)")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_option("--npu-mode", args->query.npu_mode,
                  "NPU graph mode of the plan: auto (the cheaper), padding, pipe")
      ->check(CLI::IsMember({"auto", "padding", "pipe"}))
      ->capture_default_str();
  cmd->add_option("--stack", args->query.stack_id,
                  "Stack whose gpu_svc/npu_svc measure (measured timing)")
      ->capture_default_str();
  cmd->add_option("--reps", args->query.reps, "Repetitions per measured op")->capture_default_str();
  cmd->add_option("--profile-lengths", args->query.profile_lengths,
                  "Token counts to profile, comma separated (default: 1..1024, standard + sweep)")
      ->delimiter(',');
  cmd->add_flag("--reprofile", args->query.reprofile,
                "Measured: profile again even if a profile is cached");
  cmd->add_flag("--no-cache", args->no_cache, "Neither read nor write the plan cache");
  cmd->add_flag("--json", args->json, "Print the plan(s) as JSON");
  cmd->callback([args] { run_plan(*args); });
});

}  // namespace
