// duet trace --stack ID [--request N | --last] --out F.json: one request's steps as executed
// through the stack, as a Chrome/Perfetto trace-event file (open it in ui.perfetto.dev or
// chrome://tracing): the frontend's lane, gpu_svc's and npu_svc's op spans, flag waits and IPC,
// measured here, and as a second process the modelled SoC timeline of the same steps
// (services/frontend/frontend_trace.cpp). The frontend keeps the last DUET_TRACE_STEPS steps
// (default 1024); request numbers count the requests it received (status: "trace"). In a stack of
// several models each model's frontend keeps its own steps: --model-name picks the model.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"

namespace {

struct TraceArgs {
  std::string stack = "default";
  std::string run_dir;
  uint64_t request = 0;
  bool last = false;
  std::string out;
  std::string model_name;  // which of the stack's models ("" = its default)
  int timeout_ms = 10000;
};

int run_trace(const TraceArgs& a) {
  duet::validate_stack_id(a.stack);
  if (a.request == 0 && !a.last)
    throw duet::Error(duet::Errc::invalid_argument, "trace: give --request N or --last");
  duet::client::Client c(duet::client::stack_endpoint(a.stack, a.run_dir));
  c.set_model(a.model_name);
  const nlohmann::json trace =
      c.trace(a.last ? 0 : a.request, std::chrono::milliseconds(a.timeout_ms));
  std::ofstream f(a.out);
  f << trace.dump() << "\n";
  f.close();
  if (!f) throw duet::Error(duet::Errc::io, "trace: cannot write " + a.out);
  const nlohmann::json& o = trace.at("otherData");
  std::printf("%s request %s: %s steps, %s op spans measured, %s ops modelled on %s -> %s\n",
              o.value("model", "?").c_str(), o.at("request").dump().c_str(),
              o.at("steps").dump().c_str(), o.at("op_spans").dump().c_str(),
              o.at("modeled_ops").dump().c_str(), o.value("soc", "?").c_str(), a.out.c_str());
  std::printf("  executed here: %s\n  modelled: %s\n", o.value("executed_plan", "?").c_str(),
              o.value("modeled_plan", "?").c_str());
  for (const auto& n : o.at("notes")) std::printf("  note: %s\n", n.get<std::string>().c_str());
  return 0;
}

duet::cli::RegisterCommand register_trace([](CLI::App& app) {
  auto args = std::make_shared<TraceArgs>();
  auto* cmd = app.add_subcommand(
      "trace", "one request's steps as a Chrome/Perfetto trace: measured lanes and the SoC model");
  cmd->add_option("--stack", args->stack, "stack id")->capture_default_str();
  cmd->add_option("--run-dir", args->run_dir, "run directory (default: from the stack id)");
  auto* req =
      cmd->add_option("--request", args->request, "the frontend's request number (status: trace)");
  auto* last = cmd->add_flag("--last", args->last, "the last request with steps kept");
  req->excludes(last);
  cmd->add_option("--out", args->out, "trace-event JSON file to write")->required();
  cmd->add_option("--model-name", args->model_name,
                  "which of the stack's models (default: its first); request numbers are that "
                  "model's");
  cmd->add_option("--timeout-ms", args->timeout_ms, "deadline")->capture_default_str();
  cmd->callback([args] { run_trace(*args); });
});

}  // namespace
