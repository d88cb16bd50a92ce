// duet profile: a SoC profile of this machine (issue 23 item 4). Profiles a running stack's
// gpu_svc and npu_svc (measured timing, as `duet plan --timing measured`: the profile is cached
// and shared with the stack's solver), fits the SoC timing models to it
// (core/planner/soc_profile_fit.h) and writes the result as a deploy/soc-style TOML, so that a
// run's modelled timeline (core/planner/timeline.h) can be set beside its measured one on the same
// hardware (bench/modeled/run_host_check.sh). With --from-trace the profile is the ops' times
// inside real steps of gpu-only/npu-only requests (core/planner/trace_profile.h), not ops timed one
// request at a time.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/planner/plan_store.h"
#include "core/planner/soc_profile_fit.h"
#include "core/planner/trace_profile.h"

namespace {

struct ProfileArgs {
  duet::PlanQuery query;
  std::string out, name = "host";
  double fast_sync_us = 0;
  std::vector<std::string> traces;  // --from-trace: real steps instead of ops timed alone
  std::string profile_out;
  std::string report_json;   // the fit's figures as one JSON object
  double shared_cores = -1;  // < 0: the fit's own choice (1 for traced steps)
};

// The measured profile from `duet trace` files of real steps (core/planner/trace_profile.h).
struct FromTraces {
  std::unique_ptr<duet::LlamaModel> model;
  duet::TraceProfileReport report;
};

FromTraces profile_from_trace_files(ProfileArgs& args) {
  if (args.query.model_path.empty())
    throw duet::Error(duet::Errc::invalid_argument,
                      "profile --from-trace needs --model (the shapes of the traced ops)");
  std::vector<nlohmann::json> traces;
  for (const std::string& path : args.traces) {
    std::ifstream in(path);
    if (!in) throw duet::Error(duet::Errc::not_found, "cannot read trace " + path);
    try {
      traces.push_back(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      throw duet::Error(duet::Errc::bad_format, path + ": " + e.what());
    }
  }
  FromTraces t;
  t.model = duet::LlamaModel::load(args.query.model_path);
  t.report = duet::profile_from_traces(traces, *t.model, args.query.model_path);
  const duet::TraceProfileReport& r = t.report;
  std::printf(
      "%zu traces: %zu steps, %zu matmul spans -> %zu profile points (%zu spans of split "
      "plans left out); a cross-device hand-off %.0f us; gaps per op: GPU %.1f us + %.3f us a "
      "token, NPU %.1f us + %.3f us a token; %.0f us between steps\n",
      traces.size(), r.steps, r.op_spans, r.profile.entries.size(), r.skipped_ops,
      r.handoff_sync_us, r.gpu_op_gap_us, r.gpu_op_gap_us_per_token, r.npu_op_gap_us,
      r.npu_op_gap_us_per_token, r.between_steps_us);
  // The traces measured the hand-off: it is the fast sync unless --fast-sync-us says otherwise.
  if (args.fast_sync_us <= 0) args.fast_sync_us = r.handoff_sync_us;
  return t;
}

void run_profile_cmd(ProfileArgs& args) {
  duet::PlanQuery q = args.query;
  q.timing = "measured";
  bool cached = false;
  duet::Profile measured;
  std::string key;
  FromTraces from_traces;
  if (!args.traces.empty()) {
    from_traces = profile_from_trace_files(args);
    measured = from_traces.report.profile;
    key = args.query.model_path;
  } else {
    q.validate();
    const duet::QueryModel model = duet::query_model(q);
    measured = duet::profile_for(q, model, &cached);
    key = model.key;
  }
  if (!args.profile_out.empty()) duet::save_profile(measured, args.profile_out);
  duet::SocFitReport r =
      duet::fit_soc_profile(measured, duet::load_soc_profile(q.soc), args.name, args.fast_sync_us);
  // A host whose gpu_svc drives a discrete GPU does not share its cores with npu_svc, which the
  // traces cannot tell: the caller says so.
  if (args.shared_cores >= 0) r.soc.mem.shared_cores = args.shared_cores;
  duet::StepCostFit steps;  // the op gaps and the non-matmul kernels, from the traced steps
  if (from_traces.model)
    steps = duet::fit_step_costs(from_traces.report, *from_traces.model, r.soc);
  {
    std::ofstream o(args.out);
    o << duet::soc_profile_toml(r.soc,
                                "SoC profile of this machine: `duet profile` fitted the "
                                "timing models to a measured profile\n(" +
                                    measured.device + ", " + key + ", " +
                                    std::to_string(measured.entries.size()) +
                                    " points): core/planner/soc_profile_fit.h.");
    if (!o) throw duet::Error(duet::Errc::io, "cannot write " + args.out);
  }
  duet::load_soc_profile(args.out);  // it must read back
  std::printf(
      "wrote %s: %zu GPU points (rms log error %.3f, worst %.2fx), %zu NPU points (%.3f, "
      "%.2fx); contention %.2f, hand-off %.0f us; profile %s\n",
      args.out.c_str(), r.gpu_points, r.gpu_rms_log, r.gpu_worst, r.npu_points, r.npu_rms_log,
      r.npu_worst, measured.contention, measured.handoff_us,
      !args.traces.empty() ? "from traces"
      : cached             ? "cached"
                           : "measured now");
  if (steps.points > 0)
    std::printf("GPU non-matmul kernels: %zu step points, rms log error %.3f, worst %.2fx\n",
                steps.points, steps.rms_log, steps.worst);
  if (!args.report_json.empty()) {
    const duet::TraceProfileReport& t = from_traces.report;
    std::ofstream o(args.report_json);
    nlohmann::json report = duet::soc_fit_report_json(r, measured);
    report.update({{"out", args.out},
                   {"fast_sync_us", args.fast_sync_us},
                   {"gpu_op_gap_us", t.gpu_op_gap_us},
                   {"gpu_op_gap_us_per_token", t.gpu_op_gap_us_per_token},
                   {"npu_op_gap_us", t.npu_op_gap_us},
                   {"npu_op_gap_us_per_token", t.npu_op_gap_us_per_token},
                   {"between_steps_us", t.between_steps_us},
                   {"frontend_us", t.frontend_us},
                   {"steps", t.steps},
                   {"op_spans", t.op_spans},
                   {"gpu_other_points", steps.points},
                   {"gpu_other_rms_log", steps.rms_log},
                   {"gpu_other_worst_ratio", steps.worst}});
    o << report.dump() << "\n";
    if (!o) throw duet::Error(duet::Errc::io, "cannot write " + args.report_json);
  }
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
  cmd->add_option("--from-trace", args->traces,
                  "`duet trace` files of gpu-only/npu-only requests: fit the ops' times inside "
                  "real steps instead of timing ops one by one (needs --model)")
      ->delimiter(',');
  cmd->add_option("--shared-cores", args->shared_cores,
                  "Whether the two device processes take turns on the same CPU cores, 0-1 "
                  "([memory] shared_cores; default: 1 with --from-trace, where gpu_svc runs on "
                  "PoCL; 0 where it drives a discrete GPU)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--profile-out", args->profile_out, "Also write the measured profile (JSON)");
  cmd->add_option("--report-json", args->report_json,
                  "Also write the fit's figures (errors, hand-off, gaps) as JSON");
  cmd->callback([args] { run_profile_cmd(*args); });
});

}  // namespace
