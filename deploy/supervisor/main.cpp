// duet-supervisor: runs one stack in the foreground (`duet stack up` daemonises it). See
// deploy/supervisor/supervisor.h.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/base/error.h"
#include "core/ipc/log_file.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_record.h"
#include "deploy/supervisor/supervisor.h"

int main(int argc, char** argv) {
  using namespace duet;
  supervisor::SupervisorOptions o;
  bool reclaim_only = false;
  CLI::App app{"duet-supervisor: starts, watches and stops one duet stack"};
  app.add_option("--stack", o.stack_id, "stack id")->capture_default_str();
  app.add_option("--run-dir", o.run_dir, "run directory (default: from the stack id)");
  app.add_option("--model", o.model_path, "GGUF model passed to every service");
  app.add_option("--soc", o.soc, "SoC profile name or path")->capture_default_str();
  app.add_option("--bin-dir", o.bin_dir, "where the service executables are (default: here)");
  app.add_option("--max-restarts", o.max_restarts, "restarts allowed within the window")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  app.add_option("--restart-window-ms", o.restart_window_ms, "restart intensity window")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  app.add_option("--unresponsive-ms", o.unresponsive_ms, "heartbeat silence before unresponsive")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600000));
  app.add_option("--stop-timeout-ms", o.stop_timeout_ms, "SIGTERM to SIGKILL delay")
      ->capture_default_str()
      ->check(CLI::Range(1, 600000));
  app.add_option("--http", o.http_listen,
                 "also run http_svc, the OpenAI-compatible HTTP service, on [ADDR:]PORT");
  app.add_option("--api-key-file", o.http_api_key_file,
                 "http_svc: clients must send 'Authorization: Bearer <this file's key>'");
  app.add_option("--ready-fd", o.ready_fd, "fd to report readiness on (one line, then closed)");
  app.add_flag("--reclaim-only", reclaim_only,
               "remove what a dead supervisor of this stack left (segments, sockets, run dir), "
               "then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  umask(0077);  // logs, pid file and sockets: ours alone (the services inherit it)
  try {
    if (o.run_dir.empty()) o.run_dir = default_run_dir(o.stack_id);
    o.run_dir = absolute_path(o.run_dir);
    if (o.bin_dir.empty()) o.bin_dir = executable_dir();
    validate_stack_id(o.stack_id);
    (void)ipc_endpoint(supervisor_socket_path(o.run_dir));  // fails early on a too-long run dir

    supervisor::StackLock lock(o.stack_id, o.run_dir);
    // A dead supervisor's services may still run (they outlive it): adopt them, or stop them for
    // --reclaim-only (`duet stack down`).
    std::optional<StackRecord> record =
        lock.stale_pid() != 0 ? read_stack_record(o.run_dir) : std::nullopt;
    const int live = record ? count_live_services(*record) : 0;
    if (reclaim_only) {
      const int stopped = record ? stop_recorded_services(*record, o.stop_timeout_ms) : 0;
      lock.reclaim();
      std::printf(
          "stack %s: stopped %d services, reclaimed %d segments and %d sockets%s; removed %s\n",
          o.stack_id.c_str(), stopped, lock.reclaimed_segments(), lock.reclaimed_sockets(),
          lock.stale_pid() ? (" of dead supervisor pid " + std::to_string(lock.stale_pid())).c_str()
                           : "",
          o.run_dir.c_str());
      lock.remove_run_dir();
      return 0;
    }

    std::vector<spdlog::sink_ptr> sinks;
    sinks.push_back(make_log_file_sink(o.run_dir, "supervisor"));
    if (o.ready_fd < 0) sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    auto log = std::make_shared<spdlog::logger>("supervisor", sinks.begin(), sinks.end());
    log->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n %P] %l: %v");
    log->flush_on(spdlog::level::info);
    if (live > 0) {
      o.adopt = record;
      o.adopt_from = lock.stale_pid();
      std::filesystem::remove(supervisor_socket_path(o.run_dir));  // the dead one's
      o.ready_note = "adopted " + std::to_string(live) +
                     " running services of dead supervisor pid " +
                     std::to_string(lock.stale_pid()) +
                     " (they keep the settings of the `up` that started them)";
      log->warn("stack {}: {}", o.stack_id, o.ready_note);
    } else {
      lock.reclaim();
    }
    if (live == 0 && (lock.stale_pid() != 0 || lock.reclaimed_segments() != 0 ||
                      lock.reclaimed_sockets() != 0)) {
      o.ready_note = "reclaimed " + std::to_string(lock.reclaimed_segments()) + " segments and " +
                     std::to_string(lock.reclaimed_sockets()) +
                     " sockets left by dead supervisor pid " + std::to_string(lock.stale_pid());
      log->warn("stack {}: {}", o.stack_id, o.ready_note);
    }
    try {
      supervisor::Supervisor sup(o, lock, log);
      return sup.run();
    } catch (...) {
      lock.remove_run_dir();  // nothing of a stack that never ran stays behind
      throw;
    }
  } catch (const Error& e) {
    std::string line = "error: [" + std::string(errc_name(e.code())) + "] " + std::string(e.what());
    std::fprintf(stderr, "duet-supervisor: %s\n", line.c_str());
    supervisor::notify_ready_fd(o.ready_fd, line);
  } catch (const std::exception& e) {
    std::string line = std::string("error: ") + e.what();
    std::fprintf(stderr, "duet-supervisor: %s\n", line.c_str());
    supervisor::notify_ready_fd(o.ready_fd, line);
  }
  return 1;
}
