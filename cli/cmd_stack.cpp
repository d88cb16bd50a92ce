// `duet stack up|down|status|restart|logs`: the stack verbs (deploy/stack.sh runs these). `up`
// daemonises duet-supervisor (found next to this executable) and waits on its readiness pipe
// until all four services answer heartbeats, or reports why not; the other verbs talk to the
// supervisor's control socket in the stack's run dir.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/command.h"
#include "cli/stack_settings.h"
#include "cli/stack_warmup.h"
#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_config.h"
#include "core/ipc/stack_models.h"
#include "core/ipc/stack_record.h"

extern char** environ;

namespace {

using namespace duet;
using namespace std::chrono_literals;

struct StackArgs {
  std::string stack;
  // --model PATH or NAME=PATH, repeated for several models (issue 25); none: the config file's
  // `models`, else cli::kDefaultModel.
  std::vector<std::string> models;
  std::vector<std::string> model_plans;       // --model-plan NAME=PLAN (DUET_MODEL_PLANS)
  std::vector<std::string> model_priorities;  // --model-priority NAME=RANK (DUET_MODEL_PRIORITIES)
  std::string soc = "sd8gen3";
  std::string plan;    // the frontend's plan (DUET_PLAN in the services' environment)
  std::string timing;  // what the solver optimises (DUET_TIMING)
  std::string service;
  std::string http;          // [ADDR:]PORT: also run http_svc there
  std::string api_key_file;  // http_svc's bearer key
  std::string kv_memory;     // the KV pool's budget (core/model/kv_budget.h); empty: the default
  std::string kv_type;       // f16 (default), f32 or q8_0
  std::string config;        // a stack.toml of settings (core/ipc/stack_config.h)
  bool keys = false;         // `stack config --keys`: the registry, not a stack
  bool no_warmup = false;    // `stack up --no-warmup` (DUET_WARMUP off)
  int timeout_s = 30;
  int max_restarts = 5;
  int restart_window_ms = 10000;
  int unresponsive_ms = 3000;
  int stop_timeout_ms = 3000;
  bool json = false;
  int lines = 100;
};

std::string default_stack() {
  return setting_override("DUET_STACK").value_or(std::string(kDefaultStackId));
}

std::string run_dir_of(const std::string& stack) {
  return default_run_dir(stack);
}

int read_pid_file(const std::string& run_dir) {
  std::ifstream f(pid_file_path(run_dir));
  long pid = 0;
  return (f >> pid) && pid > 0 ? static_cast<int>(pid) : 0;
}

bool exists(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0;
}

// The supervisor's status, or nullopt when the stack has no supervisor socket.
std::optional<nlohmann::json> query_status(const std::string& run_dir,
                                           std::chrono::milliseconds timeout = 2000ms) {
  const std::string sock = supervisor_socket_path(run_dir);
  if (!exists(sock)) return std::nullopt;
  msg::RequestClient client(ipc_endpoint(sock));
  auto reply = client.call([](uint64_t id) { return msg::make_status_request(id); }, timeout);
  const auto* r = reply.message().body_as_StatusReply();
  if (!r || !r->json())
    throw Error(Errc::bad_format, "the supervisor answered a status request with something else");
  return nlohmann::json::parse(r->json()->str());
}

nlohmann::json require_status(const std::string& stack) {
  const std::string run_dir = run_dir_of(stack);
  const int pid = read_pid_file(run_dir);
  if (pid != 0 && !process_alive(pid)) {
    // Its services outlive it: say which still run (they serve, but nothing restarts them).
    std::string running, gone;
    if (const auto record = read_stack_record(run_dir)) {
      for (const ServiceRecord& svc : record->services) {
        const int fd = open_recorded_process(svc);
        std::string& list = fd >= 0 ? running : gone;
        list += (list.empty() ? "" : ", ") + svc.name +
                (fd >= 0 ? " pid " + std::to_string(svc.pid) : std::string());
        if (fd >= 0) close(fd);
      }
    }
    if (running.empty())
      throw Error(Errc::unavailable, "stack '" + stack + "' is not up: its supervisor (pid " +
                                         std::to_string(pid) + ") died; `duet stack down --stack " +
                                         stack + "` or the next `up` reclaims what it left");
    throw Error(Errc::unavailable,
                "stack '" + stack + "' is degraded: its supervisor (pid " + std::to_string(pid) +
                    ") died; still running, unsupervised: " + running +
                    (gone.empty() ? "" : "; down: " + gone) + ". `duet stack up --stack " + stack +
                    "` adopts them, `duet stack down --stack " + stack + "` stops them");
  }
  auto status = query_status(run_dir);
  if (!status)
    throw Error(Errc::not_found, "stack '" + stack + "' is not up (no supervisor socket in " +
                                     run_dir + "): start it with `duet stack up --stack " + stack +
                                     "`");
  return *status;
}

// A --soc name becomes the path of its profile; a path must exist. The supervisor runs from
// elsewhere, so everything it gets is absolute.
std::string resolve_soc(const std::string& soc) {
  if (soc.find('/') != std::string::npos || soc.ends_with(".toml")) {
    if (!exists(soc)) throw Error(Errc::not_found, "SoC profile '" + soc + "' does not exist");
    return absolute_path(soc);
  }
  std::vector<std::string> tried;
  if (const auto dir = setting_override("DUET_SOC_DIR"))
    tried.push_back(*dir + "/" + soc + ".toml");
  tried.push_back("deploy/soc/" + soc + ".toml");
  tried.push_back(executable_dir() + "/../../deploy/soc/" + soc + ".toml");
  for (const auto& p : tried)
    if (exists(p)) return absolute_path(p);
  std::string list;
  for (const auto& p : tried) list += (list.empty() ? "" : ", ") + p;
  throw Error(Errc::not_found, "unknown SoC profile '" + soc + "' (looked for " + list + ")");
}

// Starts duet-supervisor in its own session with its readiness pipe on fd 3; returns its pid and
// the read end of the pipe.
std::pair<pid_t, int> spawn_supervisor(const StackArgs& a, const std::string& run_dir,
                                       const std::string& model, const std::string& soc) {
  const std::string exe = executable_dir() + "/duet-supervisor";
  if (access(exe.c_str(), X_OK) != 0)
    throw Error(Errc::not_found, "'" + exe + "' is missing: build the duet-supervisor target");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(Errc::io, "pipe2 failed");
  if (fds[1] == 3) {  // dup2(3, 3) would keep O_CLOEXEC and the child would lose its pipe
    int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, 10);
    close(fds[1]);
    fds[1] = moved;
  }
  std::vector<std::string> args = {exe,
                                   "--stack",
                                   a.stack,
                                   "--run-dir",
                                   run_dir,
                                   "--model",
                                   model,
                                   "--soc",
                                   soc,
                                   "--max-restarts",
                                   std::to_string(a.max_restarts),
                                   "--restart-window-ms",
                                   std::to_string(a.restart_window_ms),
                                   "--unresponsive-ms",
                                   std::to_string(a.unresponsive_ms),
                                   "--stop-timeout-ms",
                                   std::to_string(a.stop_timeout_ms),
                                   "--ready-fd",
                                   "3"};
  if (!a.http.empty()) args.insert(args.end(), {"--http", a.http});
  if (!a.api_key_file.empty())
    args.insert(args.end(), {"--api-key-file", absolute_path(a.api_key_file)});
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 3);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGPIPE, SIGCHLD}) sigaddset(&defaults, s);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  // Its own session: closing this terminal or killing `duet stack up` leaves the stack running.
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw Error(Errc::io, "cannot start '" + exe + "': " + std::strerror(rc));
  }
  return {pid, fds[0]};
}

// Reads the supervisor's one readiness line; nullopt on EOF (it died) or at the deadline.
std::optional<std::string> read_ready_line(int fd, std::chrono::seconds timeout, bool& timed_out) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string line;
  timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      return std::nullopt;
    }
    pollfd p{fd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[512];
    ssize_t got = read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return line.empty() ? std::nullopt : std::optional(line);
    line.append(buf, static_cast<size_t>(got));
    if (auto nl = line.find('\n'); nl != std::string::npos) return line.substr(0, nl);
  }
}

void stack_up(const StackArgs& a) {
  validate_stack_id(a.stack);
  const std::string run_dir = run_dir_of(a.stack);
  // The settings: the file's, then DUET_* variables, then flags; a bad key or value stops here.
  // The file's and flags' values go to the services through the supervisor's environment.
  const std::string config = a.config.empty() ? "" : absolute_path(a.config);
  if (!config.empty() && !exists(config))
    throw Error(Errc::not_found, "config file '" + a.config + "' does not exist");
  const std::vector<EffectiveSetting> settings =
      resolve_stack_settings(config, {{"DUET_PLAN", a.plan},
                                      {"DUET_TIMING", a.timing},
                                      {"DUET_KV_MEMORY", a.kv_memory},
                                      {"DUET_KV_TYPE", a.kv_type},
                                      {"DUET_MODELS", cli::models_flag(a.models)},
                                      {"DUET_MODEL_PLANS", cli::joined(a.model_plans)},
                                      {"DUET_MODEL_PRIORITIES", cli::joined(a.model_priorities)},
                                      {"DUET_WARMUP", a.no_warmup ? "off" : ""}});
  export_stack_settings(settings);
  const std::vector<ServedModel> models = cli::resolve_models(a.models);
  // A plan or priority naming a model the stack does not serve, or a bad one, stops here.
  if (const auto plans = setting_override("DUET_MODEL_PLANS"))
    (void)model_plans(stack_models(models.front().path), *plans,
                      !a.plan.empty() ? a.plan : setting_text("DUET_PLAN"));
  if (const auto ranks = setting_override("DUET_MODEL_PRIORITIES"))
    (void)model_priorities(stack_models(models.front().path), *ranks);
  const std::string& model = models.front().path;  // every service's --model: the default
  const std::string soc = resolve_soc(a.soc);
  (void)ipc_endpoint(supervisor_socket_path(run_dir));  // a too-long run dir fails here
  if (!a.api_key_file.empty() && a.http.empty())
    throw Error(Errc::invalid_argument, "--api-key-file is http_svc's: give --http too");
  if (!a.api_key_file.empty() && access(a.api_key_file.c_str(), R_OK) != 0)
    throw Error(Errc::not_found,
                "API key file '" + a.api_key_file + "' does not exist or is not readable");

  const std::string kv_note = cli::plan_stack_kv(a.stack, models, a.plan, a.kv_memory, a.kv_type);
  // The supervisor passes its environment on to the services.
  if (!a.plan.empty()) setenv("DUET_PLAN", a.plan.c_str(), 1);
  if (!a.timing.empty()) setenv("DUET_TIMING", a.timing.c_str(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  auto [pid, fd] = spawn_supervisor(a, run_dir, model, soc);
  bool timed_out = false;
  auto line = read_ready_line(fd, std::chrono::seconds(a.timeout_s), timed_out);
  close(fd);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  if (line && line->starts_with("ok")) {
    // What `duet stack config` prints; the run dir is removed at `down`.
    nlohmann::json record = stack_settings_json(settings);
    record["config_file"] = config;
    std::ofstream(stack_settings_path(run_dir)) << record.dump(2) << "\n";
    std::printf(
        "stack %s is up: %d services healthy in %lld ms (supervisor pid %d, run dir %s)%s%s\n",
        a.stack.c_str(), a.http.empty() ? 4 : 5, static_cast<long long>(ms), pid, run_dir.c_str(),
        line->size() > 2 ? "\n  " : "", line->size() > 4 ? line->c_str() + 4 : "");
    if (!kv_note.empty()) std::printf("  %s\n", kv_note.c_str());
    // llama-server's warm-up at load (cli/stack_warmup.h): the first request does not pay for
    // building the engines.
    if (setting_on("DUET_WARMUP")) {
      std::vector<cli::WarmupTarget> targets;
      for (const ServedModel& m : models)
        targets.push_back(
            {models.size() > 1 ? m.name : "",
             m.name.empty() ? std::filesystem::path(m.path).stem().string() : m.name});
      cli::warm_up(a.stack, run_dir, a.timeout_s, targets);
    }
    return;
  }
  if (line && line->starts_with("degraded: "))
    throw Error(Errc::unavailable,
                "stack " + a.stack + " came up degraded: " + line->substr(10) +
                    ". The supervisor keeps running: `duet stack status --stack " + a.stack +
                    "`, `duet stack down --stack " + a.stack + "`");
  if (line && line->starts_with("error: "))
    throw Error(Errc::unavailable, "cannot start stack " + a.stack + ": " + line->substr(7));
  if (timed_out)
    throw Error(Errc::timeout, "stack " + a.stack + " was not healthy within " +
                                   std::to_string(a.timeout_s) +
                                   " s; see `duet stack status --stack " + a.stack + "` and " +
                                   log_path(run_dir, "supervisor") +
                                   " (gpu_svc's first start on a machine compiles the OpenCL "
                                   "kernels: `gpu_svc --prepare` once, or a longer --timeout)");
  int status = 0;
  waitpid(pid, &status, 0);  // it closed the pipe without a word: it has exited
  throw Error(Errc::internal,
              "duet-supervisor exited before the stack was ready (" +
                  std::string(WIFSIGNALED(status) ? "signal " : "status ") +
                  std::to_string(WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status)) +
                  ")");
}

bool wait_gone(int pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (process_alive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

void stack_down(const StackArgs& a) {
  validate_stack_id(a.stack);
  const std::string run_dir = run_dir_of(a.stack);
  const int pid = read_pid_file(run_dir);
  bool asked = false;
  if (exists(supervisor_socket_path(run_dir)) && process_alive(pid)) {
    try {
      msg::RequestClient client(ipc_endpoint(supervisor_socket_path(run_dir)));
      client.call([](uint64_t id) { return msg::make_shutdown(id); }, 3000ms);
      asked = true;
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "duet: the supervisor did not take the down request (%s): sending SIGTERM\n",
                   e.what());
    }
  }
  if (process_alive(pid)) {
    if (!asked) kill(pid, SIGTERM);
    if (!wait_gone(pid, std::chrono::seconds(a.timeout_s)))
      throw Error(Errc::timeout, "supervisor pid " + std::to_string(pid) + " of stack " + a.stack +
                                     " is still running after " + std::to_string(a.timeout_s) +
                                     " s");
    std::printf("stack %s is down\n", a.stack.c_str());
    return;
  }
  if (!exists(run_dir))
    throw Error(Errc::not_found, "stack '" + a.stack + "' is not up (no run dir " + run_dir + ")");
  // Its supervisor died without cleaning up: let a reclaim-only supervisor remove the leftovers.
  // The stack lock can outlive a killed supervisor by a moment (seen under load: the reclaim
  // answers "already up" naming the dead pid), so a failed reclaim is retried until the deadline.
  std::string cmd = "'" + executable_dir() + "/duet-supervisor' --reclaim-only --stack " + a.stack +
                    " --run-dir '" + run_dir + "'";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(a.timeout_s);
  while (std::system(cmd.c_str()) != 0) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw Error(Errc::io, "reclaiming stack " + a.stack + " failed: " + cmd);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string format_ms(const nlohmann::json& v) {
  if (!v.is_number()) return "-";
  double ms = v.get<double>();
  char buf[32];
  if (ms < 1000)
    std::snprintf(buf, sizeof(buf), "%.0fms", ms);
  else
    std::snprintf(buf, sizeof(buf), "%.1fs", ms / 1000);
  return buf;
}

void stack_status(const StackArgs& a) {
  validate_stack_id(a.stack);
  const nlohmann::json s = require_status(a.stack);
  if (a.json) {
    std::printf("%s\n", s.dump(2).c_str());
    return;
  }
  std::printf("stack %s: %s (supervisor pid %d, up %s, run dir %s)\n", a.stack.c_str(),
              s.value("state", "?").c_str(), s.value("pid", 0), format_ms(s["uptime_ms"]).c_str(),
              s.value("run_dir", "?").c_str());
  if (const auto& t = s["takeover"]; t.is_object()) {
    auto names = [](const nlohmann::json& list) {
      std::string out;
      for (const auto& n : list) out += (out.empty() ? "" : ", ") + n.get<std::string>();
      return out.empty() ? std::string("none") : out;
    };
    std::printf("  took over from dead supervisor pid %d: adopted %s; restarted %s\n",
                t.value("from_supervisor_pid", 0), names(t["adopted"]).c_str(),
                names(t["restarted"]).c_str());
  }
  std::printf("%-11s %8s  %-12s %8s %9s %10s  %s\n", "SERVICE", "PID", "STATE", "UPTIME",
              "RESTARTS", "HEARTBEAT", "LAST EXIT");
  for (const auto& svc : s["services"])
    std::printf("%-11s %8d  %-12s %8s %9d %10s  %s\n", svc.value("name", "?").c_str(),
                svc.value("pid", 0), svc.value("state", "?").c_str(),
                format_ms(svc["uptime_ms"]).c_str(), svc.value("restarts", 0),
                format_ms(svc["heartbeat_age_ms"]).c_str(), svc.value("last_exit", "").c_str());
}

const nlohmann::json* find_service(const nlohmann::json& status, std::string_view name) {
  for (const auto& svc : status["services"])
    if (svc.value("name", "") == name) return &svc;
  return nullptr;
}

void stack_restart(const StackArgs& a) {
  validate_stack_id(a.stack);
  const ServiceId id = parse_service(a.service);
  const std::string name(service_name(id));
  const std::string run_dir = run_dir_of(a.stack);
  const nlohmann::json before = require_status(a.stack);
  const int old_pid = find_service(before, name)->value("pid", 0);
  const auto t0 = std::chrono::steady_clock::now();
  msg::RequestClient client(ipc_endpoint(supervisor_socket_path(run_dir)));
  client.call([&](uint64_t rid) { return msg::make_restart_service(rid, msg::service_kind(id)); },
              3000ms);
  const auto deadline = t0 + std::chrono::seconds(a.timeout_s);
  for (;;) {
    nlohmann::json now = require_status(a.stack);
    const nlohmann::json* svc = find_service(now, name);
    const int pid = svc->value("pid", 0);
    if (svc->value("state", "") == "healthy" && pid != 0 && pid != old_pid) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - t0)
                    .count();
      std::printf("%s restarted: pid %d -> %d, healthy in %lld ms\n", name.c_str(), old_pid, pid,
                  static_cast<long long>(ms));
      // A restarted frontend or device service leaves the engines to rebuild or re-register:
      // warm them up again, as `up` did (unless the stack runs without the warm-up).
      if (!a.no_warmup &&
          (id == ServiceId::frontend || id == ServiceId::gpu || id == ServiceId::npu) &&
          cli::recorded_warmup_on(run_dir))
        cli::warm_up(a.stack, run_dir, a.timeout_s, cli::served_models(a.stack, run_dir));
      return;
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error(Errc::timeout, name + " was not healthy again within " +
                                     std::to_string(a.timeout_s) + " s (state " +
                                     svc->value("state", "?") + ", " + svc->value("last_exit", "") +
                                     ")");
    std::this_thread::sleep_for(20ms);
  }
}

void stack_logs(const StackArgs& a) {
  validate_stack_id(a.stack);
  std::string name = a.service;
  if (name != "supervisor") name = std::string(service_name(parse_service(name)));
  const std::string path = log_path(run_dir_of(a.stack), name);
  std::ifstream f(path);
  if (!f) throw Error(Errc::not_found, "no log '" + path + "' (is stack '" + a.stack + "' up?)");
  std::deque<std::string> tail;
  for (std::string line; std::getline(f, line);) {
    tail.push_back(std::move(line));
    if (a.lines > 0 && static_cast<int>(tail.size()) > a.lines) tail.pop_front();
  }
  for (const auto& line : tail) std::printf("%s\n", line.c_str());
}

duet::cli::RegisterCommand reg([](CLI::App& app) {
  auto args = std::make_shared<StackArgs>();
  args->stack = default_stack();
  auto* stack = app.add_subcommand("stack", "run the four services under a supervisor");
  stack->require_subcommand(1);
  auto add_stack_opt = [&](CLI::App* c) {
    c->add_option("--stack", args->stack, "stack id (env DUET_STACK)")->capture_default_str();
  };

  auto* up = stack->add_subcommand("up", "start the stack and wait until all services are healthy");
  add_stack_opt(up);
  up->add_option(
        "--model", args->models,
        "GGUF model, PATH or NAME=PATH (name: the file's stem); repeat it to serve several "
        "models, the first the default (config: models)")
      ->default_str(cli::kDefaultModel);
  up->add_option("--model-plan", args->model_plans,
                 "NAME=PLAN: model NAME runs PLAN instead of --plan's (several models; repeat it; "
                 "config: model_plans)");
  up->add_option("--model-priority", args->model_priorities,
                 "NAME=RANK: model NAME's priority where models' steps contend, 0 first "
                 "(unlisted: 0; equal ranks take turns; aged, so none starves; repeat it; "
                 "config: model_priorities)");
  up->add_option("--soc", args->soc, "SoC profile name or .toml path")->capture_default_str();
  up->add_option("--plan", args->plan,
                 "auto (default: executes the solver's plan for this host, measured, and models "
                 "the solver's plan for the SoC), tensor (the solver's SoC plan, executed here "
                 "too), gpu-only, npu-only (NPU graphs padded), npu-only:online-prepare, "
                 "npu-only:pipe, layer, reference, or subgraph:PATH (a subgraph placement, "
                 "puzzle/subgraph_plan.h's JSON, its subgraphs on gpu or npu)")
      ->check(CLI::IsMember({"auto", "tensor", "gpu-only", "npu-only", "npu-only:online-prepare",
                             "npu-only:pipe", "layer", "reference"}) |
              CLI::Validator(
                  [](std::string& v) {
                    return v.rfind("subgraph:", 0) == 0 && v.size() > 9
                               ? std::string()
                               : std::string("not subgraph:PATH");
                  },
                  "subgraph:PATH"));
  up->add_option("--timing", args->timing,
                 "what the solver optimises for the executed plan: measured (auto's default) or "
                 "modeled (tensor's default; auto then executes the SoC's plan)")
      ->check(CLI::IsMember({"modeled", "measured"}));
  up->add_option("--http", args->http,
                 "also run http_svc, the OpenAI-compatible HTTP service, on [ADDR:]PORT "
                 "(ADDR defaults to 127.0.0.1)");
  up->add_option("--api-key-file", args->api_key_file,
                 "http_svc: require 'Authorization: Bearer <key>', the key being this file's "
                 "first line");
  up->add_option("--kv-memory", args->kv_memory,
                 "memory for the KV page pool, e.g. 2G or 512M (default: a quarter of the "
                 "memory available; env DUET_KV_MEMORY)");
  up->add_option("--kv-type", args->kv_type,
                 "KV cache values: f16 (default, as llama.cpp), f32 or q8_0 (ggml's blocks of 32, "
                 "34/32 bytes a value; env DUET_KV_TYPE)")
      ->check(CLI::IsMember({"f16", "f32", "q8_0"}));
  up->add_option("--config", args->config,
                 "a TOML file of settings (`duet stack config --keys` lists them); flags and "
                 "DUET_* variables override it");
  up->add_flag("--no-warmup", args->no_warmup,
               "do not warm the engines up once healthy (the first request builds them)");
  up->add_option("--timeout", args->timeout_s,
                 "seconds to wait for healthy (and then for each model's warm-up)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  up->add_option("--max-restarts", args->max_restarts, "restart intensity: restarts ...")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  up->add_option("--restart-window-ms", args->restart_window_ms, "... within this window")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  up->add_option("--unresponsive-ms", args->unresponsive_ms,
                 "no heartbeat reply for this long: the service is unresponsive")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  up->add_option("--stop-timeout-ms", args->stop_timeout_ms, "on down: SIGTERM, then SIGKILL after")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  up->callback([args] { stack_up(*args); });

  auto* down = stack->add_subcommand("down", "stop the stack and remove its files and segments");
  add_stack_opt(down);
  down->add_option("--timeout", args->timeout_s, "seconds to wait")->capture_default_str();
  down->callback([args] { stack_down(*args); });

  auto* status = stack->add_subcommand("status", "per service: pid, uptime, restarts, heartbeat");
  add_stack_opt(status);
  status->add_flag("--json", args->json, "print the supervisor's JSON");
  status->callback([args] { stack_status(*args); });

  auto* restart = stack->add_subcommand("restart", "restart one service and wait until healthy");
  add_stack_opt(restart);
  restart
      ->add_option("service", args->service, "frontend, gpu_svc, npu_svc, solver_svc or http_svc")
      ->required();
  restart->add_option("--timeout", args->timeout_s, "seconds to wait (and then for the warm-up)")
      ->capture_default_str();
  restart->add_flag(
      "--no-warmup", args->no_warmup,
      "do not warm the engines up again after a frontend, gpu_svc or npu_svc restart");
  restart->callback([args] { stack_restart(*args); });

  auto* config = stack->add_subcommand(
      "config",
      "the stack's effective settings and where each came from (default, file, env, flag)");
  add_stack_opt(config);
  config->add_flag("--json", args->json, "print the settings record as JSON");
  config->add_flag("--keys", args->keys, "list every key a config file may set, as Markdown");
  config->callback([args] {
    if (args->keys) return cli::print_setting_keys();
    validate_stack_id(args->stack);
    cli::print_stack_config(run_dir_of(args->stack), args->stack, args->json);
  });

  auto* logs = stack->add_subcommand("logs", "print the end of a service's log");
  add_stack_opt(logs);
  logs->add_option("service", args->service, "a service or 'supervisor'")->required();
  logs->add_option("-n,--lines", args->lines, "lines from the end (0 = all)")
      ->capture_default_str();
  logs->callback([args] { stack_logs(*args); });
});

}  // namespace
