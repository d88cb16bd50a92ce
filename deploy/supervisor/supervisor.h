#pragma once
// The supervisor: one libuv loop that starts the four services (five with http_svc), restarts a
// crashed one (one-for-one) under a restart-intensity limit, heartbeats each over ZeroMQ, serves
// supervisor.sock (status, restart, down) and on down/SIGTERM stops the services in order and
// removes the stack's segments, sockets and run dir.
#include <spdlog/logger.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "core/ipc/stack_record.h"
#include "deploy/supervisor/stack_lock.h"

namespace duet::supervisor {

struct SupervisorOptions {
  std::string stack_id = "default";
  std::string run_dir;     // resolved (absolute) run dir
  std::string model_path;  // passed to every service as --model
  std::string soc = "sd8gen3";
  std::string bin_dir;   // where frontend, gpu_svc, npu_svc, solver_svc are
  int max_restarts = 5;  // automatic restarts allowed per service within restart_window_ms ...
  int restart_window_ms = 10000;  // ... one more crash marks the service failed
  int restart_delay_ms = 20;      // after a crash, before the restart (no tight fork loop)
  int heartbeat_ms = 50;          // heartbeat period
  int unresponsive_ms = 3000;     // no HeartbeatAck for this long: the service is unresponsive
  int stop_timeout_ms = 3000;     // SIGTERM, then SIGKILL after this long
  int ready_fd =
      -1;  // if >= 0: one line ("ok", "degraded: ...") once all are healthy or one failed
  std::string ready_note;  // appended to the "ok" line (what was reclaimed at start)
  // Non-empty: a fifth service, http_svc, listens there ([ADDR:]PORT), with this bearer key file.
  std::string http_listen;
  std::string http_api_key_file;
  // A takeover: the record a dead supervisor (pid adopt_from) left. Its services that still run are
  // adopted (watched through pidfds, signalled, heartbeaten, restarted as any other); the others
  // are started again with the argv and DUET_* environment recorded for them.
  std::optional<StackRecord> adopt;
  int adopt_from = 0;
};

class Supervisor {
 public:
  Supervisor(SupervisorOptions options, StackLock& lock, std::shared_ptr<spdlog::logger> log);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs until down or SIGTERM/SIGINT, then removes the stack's segments and run dir. Returns
  // the process exit code.
  int run();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Writes one line to the readiness fd and closes it (no-op for fd < 0).
void notify_ready_fd(int& fd, const std::string& line);

}  // namespace duet::supervisor
