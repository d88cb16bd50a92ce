#pragma once
// Supervisor::Impl's state, shared by supervisor.cpp (processes: start, adopt, exit, restart, stop,
// the loop) and supervisor_control.cpp (heartbeats, the stack's state, the control socket).
#include <unistd.h>
#include <uv.h>

#include <cstring>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_record.h"
#include "deploy/supervisor/supervisor.h"

extern char** environ;

namespace duet::supervisor {

enum class ChildState { stopped, starting, healthy, unresponsive, restart_pending, failed };

const char* state_name(ChildState s);

struct Supervisor::Impl {
  struct Child {
    Impl* sup = nullptr;
    ServiceId id{};
    std::string name;
    uv_process_t* proc = nullptr;  // set while our child runs; freed in its close callback
    // An adopted service (a dead supervisor's child, now init's): watched through its pidfd.
    int pidfd = -1;
    uv_poll_t* pid_poll = nullptr;
    bool adopted = false;
    int pid = 0;
    uint64_t start_ticks = 0;
    std::vector<std::string> argv;  // what every (re)start runs
    std::vector<std::string> env;   // the DUET_* variables it runs with
    ChildState state = ChildState::stopped;
    uint64_t started_ms = 0;
    uint64_t last_ack_ms = 0;  // 0: no HeartbeatAck from this pid yet
    uint64_t heartbeat_seq = 0;
    int restarts = 0;                     // every restart, manual ones included
    std::deque<uint64_t> crash_restarts;  // times of automatic restarts within the window
    std::string last_exit;
    bool manual_restart = false;
    uv_timer_t restart_timer{};
    uv_timer_t kill_timer{};
    std::unique_ptr<zmq::socket_t> dealer;
    bool running() const { return proc != nullptr || pid_poll != nullptr; }
  };

  SupervisorOptions opt;
  StackLock& lock;
  std::shared_ptr<spdlog::logger> log;
  uv_loop_t loop{};
  uv_timer_t tick{};
  uv_poll_t control_poll{};
  uv_signal_t sig_term{}, sig_int{}, sig_hup{};
  zmq::socket_t control;
  std::vector<Child> children;  // indexed by ServiceId; http_svc last, only when asked for
  // http_svc's listening socket, bound here once and handed to every http_svc we start, so that
  // clients queue in its backlog while http_svc restarts (see core/ipc/listen_socket.h). -1: none.
  int http_socket = -1;
  uint64_t started_ms = monotonic_ms();
  bool stopping = false;
  size_t stop_index = 0;
  bool ready_notified = false;
  std::string last_stack_state;
  std::vector<std::string> adopted_names, restarted_names;  // a takeover's outcome

  Impl(SupervisorOptions o, StackLock& l, std::shared_ptr<spdlog::logger> lg)
      : opt(std::move(o)), lock(l), log(std::move(lg)) {
    std::vector<ServiceId> ids(kAllServices.begin(), kAllServices.end());
    if (!opt.http_listen.empty()) ids.push_back(ServiceId::http);
    children = std::vector<Child>(ids.size());  // never resized: timers hold &child
    for (size_t i = 0; i < children.size(); ++i) {
      Child& c = children[i];
      c.sup = this;
      c.id = ids[i];
      c.name = std::string(service_name(c.id));
      std::string exe = opt.bin_dir + "/" + c.name;
      if (access(exe.c_str(), X_OK) != 0)
        throw Error(Errc::not_found,
                    "service executable '" + exe + "' is missing or not executable");
      c.argv = service_argv(c);
      for (char** e = environ; *e; ++e)
        if (std::strncmp(*e, "DUET_", 5) == 0 && std::strncmp(*e, "DUET_SUPERVISOR_PID=", 20) != 0)
          c.env.emplace_back(*e);
      if (opt.adopt) {  // a takeover restarts a service exactly as its first supervisor did
        for (const ServiceRecord& r : opt.adopt->services)
          if (r.name == c.name) {
            c.argv = r.argv;
            c.env = r.env;
          }
      }
    }
  }

  std::vector<std::string> service_argv(const Child& c) const;

  // The record the next supervisor adopts from if this one is killed (core/ipc/stack_record.h).
  void write_record();

  Child* find_child(ServiceId id);

  // ---- processes ----

  void spawn(Child& c);

  // Takes over a service a dead supervisor started. Not our child, so its exit is seen as its
  // pidfd turning readable (the status goes to its new parent, init).
  void adopt(Child& c, const ServiceRecord& r, int pidfd);
  // The socket to hand http_svc: ours, made now if we have none (or ours stopped listening);
  // -1 when it cannot be bound (http_svc then binds itself and reports why it cannot).
  int http_listen_socket();
  // A copy of the socket a running (adopted) http_svc serves, taken through its pidfd.
  void take_http_socket(int pidfd);

  void on_adopted_exit(Child& c);

  void signal_child(Child& c, int sig);

  void on_exit(Child& c, int64_t status, int sig);

  void on_gone(Child& c, std::string last_exit);

  // A dead producer must never hang a consumer: bumping the stack epoch in the flag table (once
  // the frontend has made one) wakes every flag waiter at once, so the executor notices within
  // microseconds instead of at its deadline, and re-runs the step when the service is back.
  void bump_stack_epoch(const std::string& who);

  void on_crash(Child& c, const std::string& why);

  void terminate(Child& c);

  void restart(Child& c);

  void begin_stop(const char* why);

  void continue_stop();

  void finish();

  // ---- heartbeats and state ----

  void heartbeat(Child& c, uint64_t now);

  std::string stack_state() const;

  void update_stack_state();

  void on_tick();

  // libuv callbacks are C: nothing may unwind through them.
  template <class F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      log->error("{}: {}", what, e.what());
    }
  }

  nlohmann::json status_json() const;

  // ---- control socket ----

  msg::Bytes answer(const msg::Bytes& payload, bool& shutdown_after);

  void serve_control();

  int run();
};

}  // namespace duet::supervisor
