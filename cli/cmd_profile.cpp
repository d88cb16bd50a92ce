// duet profile: a SoC profile of this machine (issue 23 item 4). Profiles a running stack's
// gpu_svc and npu_svc (measured timing, as `duet plan --timing measured`: the profile is cached
// and shared with the stack's solver), fits the SoC timing models to it
// (core/planner/soc_profile_fit.h) and writes the result as a deploy/soc-style TOML, so that a
// run's modelled timeline (core/planner/timeline.h) can be set beside its measured one on the same
// hardware (bench/modeled/run_host_check.sh).
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/planner/plan_store.h"
#include "core/planner/soc_profile_fit.h"

namespace {

struct ProfileArgs {
  duet::PlanQuery query;
  std::string out, name = "host";
  double fast_sync_us = 0;
};

void run_profile_cmd(ProfileArgs& args) {
  duet::PlanQuery q = args.query;
  q.timing = "measured";
  q.validate();
  const duet::QueryModel model = duet::query_model(q);
  bool cached = false;
  const duet::Profile measured = duet::profile_for(q, model, &cached);
  const duet::SocFitReport r =
      duet::fit_soc_profile(measured, duet::load_soc_profile(q.soc), args.name, args.fast_sync_us);
  {
    std::ofstream o(args.out);
    o << duet::soc_profile_toml(r.soc,
                                "SoC profile of this machine: `duet profile` fitted the "
                                "timing models to a measured profile\n(" +
                                    measured.device + ", " + model.key + ", " +
                                    std::to_string(measured.entries.size()) +
                                    " points): core/planner/soc_profile_fit.h.");
    if (!o) throw duet::Error(duet::Errc::io, "cannot write " + args.out);
  }
  duet::load_soc_profile(args.out);  // it must read back
  std::printf(
      "wrote %s: %zu GPU points (rms log error %.3f, worst %.2fx), %zu NPU points (%.3f, "
      "%.2fx); contention %.2f, hand-off %.0f us; profile %s\n",
      args.out.c_str(), r.gpu_points, r.gpu_rms_log, r.gpu_worst, r.npu_points, r.npu_rms_log,
      r.npu_worst, measured.contention, measured.handoff_us, cached ? "cached" : "measured now");
}

duet::cli::RegisterCommand register_profile([](CLI::App& app) {
  auto args = std::make_shared<ProfileArgs>();
  auto* cmd = app.add_subcommand(
      "profile", "Profile a running stack's devices and write this machine's SoC profile (TOML)");
  cmd->add_option("--out", args->out, "TOML file to write")->required();
  cmd->add_option("--name", args->name, "The profile's name")->capture_default_str();
  cmd->add_option("--stack", args->query.stack_id, "Stack whose gpu_svc/npu_svc measure")
      ->capture_default_str();
  cmd->add_option("--shape", args->query.shape, "Named model shape whose matmuls to profile")
      ->capture_default_str();
  cmd->add_option("--model", args->query.model_path, "GGUF model file (its shapes and types)");
  cmd->add_option("--soc", args->query.soc, "Starting SoC profile (structure, first guesses)")
      ->capture_default_str();
  cmd->add_option("--reps", args->query.reps, "Repetitions per measured op")->capture_default_str();
  cmd->add_option("--profile-lengths", args->query.profile_lengths,
                  "Token counts to profile, comma separated (default: standard + sweep)")
      ->delimiter(',');
  cmd->add_option("--fast-sync-us", args->fast_sync_us,
                  "Flag hand-off between the device processes (bench/sync); 0 keeps --soc's");
  cmd->add_flag("--reprofile", args->query.reprofile, "Profile again even if one is cached");
  cmd->callback([args] { run_profile_cmd(*args); });
});

}  // namespace
