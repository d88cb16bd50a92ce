#include "deploy/supervisor/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <array>
#include <cstring>
#include <deque>
#include <filesystem>

#include "core/messaging.h"
#include "core/run_dir.h"
#include "shm/completion_flag.h"
#include "shm/segment.h"

extern char** environ;

namespace duet::supervisor {

void notify_ready_fd(int& fd, const std::string& line) {
  if (fd < 0) return;
  std::string text = line + "\n";
  [[maybe_unused]] ssize_t n = write(fd, text.data(), text.size());
  close(fd);
  fd = -1;
}

namespace {

enum class ChildState { stopped, starting, healthy, unresponsive, restart_pending, failed };

const char* state_name(ChildState s) {
  switch (s) {
    case ChildState::stopped:
      return "stopped";
    case ChildState::starting:
      return "starting";
    case ChildState::healthy:
      return "healthy";
    case ChildState::unresponsive:
      return "unresponsive";
    case ChildState::restart_pending:
      return "restarting";
    case ChildState::failed:
      return "failed";
  }
  return "unknown";
}

std::string describe_exit(int64_t status, int term_signal) {
  if (term_signal != 0)
    return "killed by signal " + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
  return "exited with status " + std::to_string(status);
}

// Stop order: clients first (http_svc, a client of the frontend, then the clients of the
// devices), so nothing is mid-request on a vanished peer.
constexpr std::array<ServiceId, 5> kStopOrder = {ServiceId::http, ServiceId::frontend,
                                                 ServiceId::solver, ServiceId::npu, ServiceId::gpu};

}  // namespace

struct Supervisor::Impl {
  struct Child {
    Impl* sup = nullptr;
    ServiceId id{};
    std::string name;
    uv_process_t* proc = nullptr;  // set while the process runs; freed in its close callback
    int pid = 0;
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
  uint64_t started_ms = monotonic_ms();
  bool stopping = false;
  size_t stop_index = 0;
  bool ready_notified = false;
  std::string last_stack_state;

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
    }
  }

  Child* find_child(ServiceId id) {
    for (auto& c : children)
      if (c.id == id) return &c;
    return nullptr;
  }

  // ---- processes ----

  void spawn(Child& c) {
    std::string exe = opt.bin_dir + "/" + c.name;
    std::vector<std::string> args = {exe,         "--stack", opt.stack_id, "--run-dir",
                                     opt.run_dir, "--soc",   opt.soc};
    if (!opt.model_path.empty()) args.insert(args.end(), {"--model", opt.model_path});
    if (c.id == ServiceId::http) {
      args.insert(args.end(), {"--listen", opt.http_listen});
      if (!opt.http_api_key_file.empty())
        args.insert(args.end(), {"--api-key-file", opt.http_api_key_file});
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    std::vector<std::string> env_store;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "DUET_SUPERVISOR_PID=", 20) != 0) env_store.emplace_back(*e);
    env_store.push_back("DUET_SUPERVISOR_PID=" + std::to_string(getpid()));
    std::vector<char*> envp;
    for (auto& e : env_store) envp.push_back(e.data());
    envp.push_back(nullptr);

    // The service's stdout/stderr (an abort message, a sanitizer report) go to its log too.
    std::string log_file = log_path(opt.run_dir, c.name);
    int log_fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    for (int i = 1; i < 3; ++i) {
      stdio[i].flags = log_fd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
      stdio[i].data.fd = log_fd;
    }
    uv_process_options_t po{};
    po.file = exe.c_str();
    po.args = argv.data();
    po.env = envp.data();
    po.stdio_count = 3;
    po.stdio = stdio;
    po.exit_cb = [](uv_process_t* p, int64_t status, int sig) {
      auto* ch = static_cast<Child*>(p->data);
      ch->sup->guarded("exit", [&] { ch->sup->on_exit(*ch, status, sig); });
    };
    c.proc = new uv_process_t{};
    c.proc->data = &c;
    int r = uv_spawn(&loop, c.proc, &po);
    if (log_fd >= 0) close(log_fd);
    c.started_ms = monotonic_ms();
    c.last_ack_ms = 0;
    c.dealer.reset();
    if (r != 0) {
      uv_close(reinterpret_cast<uv_handle_t*>(c.proc),
               [](uv_handle_t* h) { delete reinterpret_cast<uv_process_t*>(h); });
      c.proc = nullptr;
      c.pid = 0;
      log->error("cannot start {}: {}", c.name, uv_strerror(r));
      on_crash(c, std::string("cannot start: ") + uv_strerror(r));
      return;
    }
    c.pid = c.proc->pid;
    c.state = ChildState::starting;
    log->info("started {} pid {}", c.name, c.pid);
  }

  void on_exit(Child& c, int64_t status, int sig) {
    uv_close(reinterpret_cast<uv_handle_t*>(c.proc),
             [](uv_handle_t* h) { delete reinterpret_cast<uv_process_t*>(h); });
    c.proc = nullptr;
    uv_timer_stop(&c.kill_timer);
    c.dealer.reset();
    c.last_exit = describe_exit(status, sig);
    const int old_pid = c.pid;
    c.pid = 0;
    if (stopping) {
      log->info("{} pid {} stopped: {}", c.name, old_pid, c.last_exit);
      c.state = ChildState::stopped;
      continue_stop();
      return;
    }
    bump_stack_epoch(c);
    if (c.manual_restart) {
      c.manual_restart = false;
      ++c.restarts;
      log->info("{} pid {} {} for a requested restart", c.name, old_pid, c.last_exit);
      spawn(c);
      update_stack_state();
      return;
    }
    log->warn("{} pid {} {}", c.name, old_pid, c.last_exit);
    on_crash(c, c.last_exit);
  }

  // A dead producer must never hang a consumer: bumping the stack epoch in the flag table (once
  // the frontend has made one) wakes every flag waiter at once, so the executor notices within
  // microseconds instead of at its deadline, and re-runs the step when the service is back.
  void bump_stack_epoch(const Child& c) {
    const std::string prefix = shm::segment_name(opt.stack_id, "flags");
    for (const std::string& name : shm::list_stack_segments(opt.stack_id)) {
      if (name.rfind(prefix, 0) != 0) continue;  // flags, flags.<plan>, ...
      try {
        shm::Segment seg = shm::Segment::open(name);
        const uint64_t epoch = shm::FlagTable::attach(seg).bump_epoch();
        log->info("{} died: epoch of {} is now {}", c.name, name, epoch);
      } catch (const Error& e) {
        log->warn("{} died: could not bump the epoch of {}: {}", c.name, name, e.what());
      }
    }
  }

  void on_crash(Child& c, const std::string& why) {
    const uint64_t now = monotonic_ms();
    while (!c.crash_restarts.empty() &&
           now - c.crash_restarts.front() > static_cast<uint64_t>(opt.restart_window_ms))
      c.crash_restarts.pop_front();
    if (static_cast<int>(c.crash_restarts.size()) >= opt.max_restarts) {
      c.state = ChildState::failed;
      c.last_exit = why;
      log->error("{} failed: {} restarts within {} ms and it died again ({}); not restarting it",
                 c.name, c.crash_restarts.size(), opt.restart_window_ms, why);
      update_stack_state();
      return;
    }
    c.crash_restarts.push_back(now);
    ++c.restarts;
    c.state = ChildState::restart_pending;
    uv_timer_start(
        &c.restart_timer,
        [](uv_timer_t* t) {
          auto* ch = static_cast<Child*>(t->data);
          if (!ch->sup->stopping && ch->proc == nullptr)
            ch->sup->guarded("restart", [ch] { ch->sup->spawn(*ch); });
        },
        static_cast<uint64_t>(opt.restart_delay_ms), 0);
    update_stack_state();
  }

  void terminate(Child& c) {
    if (!c.proc) return;
    uv_process_kill(c.proc, SIGTERM);
    uv_timer_start(
        &c.kill_timer,
        [](uv_timer_t* t) {
          auto* ch = static_cast<Child*>(t->data);
          if (!ch->proc) return;
          ch->sup->log->warn("{} pid {} ignored SIGTERM for {} ms: SIGKILL", ch->name, ch->pid,
                             ch->sup->opt.stop_timeout_ms);
          uv_process_kill(ch->proc, SIGKILL);
        },
        static_cast<uint64_t>(opt.stop_timeout_ms), 0);
  }

  void restart(Child& c) {
    log->info("restart of {} requested", c.name);
    if (c.proc) {
      c.manual_restart = true;
      terminate(c);
      return;
    }
    uv_timer_stop(&c.restart_timer);
    c.crash_restarts.clear();  // an operator's restart forgives earlier crashes
    ++c.restarts;
    spawn(c);
    update_stack_state();
  }

  void begin_stop(const char* why) {
    if (stopping) return;
    stopping = true;
    log->info("stopping stack {} ({})", opt.stack_id, why);
    notify_ready_fd(opt.ready_fd,
                    "error: stack stopped before it was ready (" + std::string(why) + ")");
    for (auto& c : children) {
      uv_timer_stop(&c.restart_timer);
      if (c.state == ChildState::restart_pending) c.state = ChildState::stopped;
    }
    stop_index = 0;
    continue_stop();
  }

  void continue_stop() {
    for (; stop_index < kStopOrder.size(); ++stop_index) {
      Child* found = find_child(kStopOrder[stop_index]);
      if (!found) continue;
      Child& c = *found;
      if (c.proc) {
        if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&c.kill_timer))) terminate(c);
        return;  // on_exit continues with the next one
      }
    }
    finish();
  }

  void finish() {
    uv_timer_stop(&tick);
    uv_poll_stop(&control_poll);
    auto close = [](auto* h) { uv_close(reinterpret_cast<uv_handle_t*>(h), nullptr); };
    close(&tick);
    close(&control_poll);
    close(&sig_term);
    close(&sig_int);
    close(&sig_hup);
    for (auto& c : children) {
      close(&c.restart_timer);
      close(&c.kill_timer);
      c.dealer.reset();
    }
  }

  // ---- heartbeats and state ----

  void heartbeat(Child& c, uint64_t now) {
    if (!c.proc) return;
    try {
      if (!c.dealer)
        c.dealer = std::make_unique<zmq::socket_t>(
            msg::connect_dealer(ipc_endpoint(control_socket_path(opt.run_dir, c.id)), false));
      for (int i = 0; i < 64; ++i) {
        zmq::message_t m;
        if (!c.dealer->recv(m, zmq::recv_flags::dontwait)) break;
        msg::Bytes bytes(static_cast<const uint8_t*>(m.data()),
                         static_cast<const uint8_t*>(m.data()) + m.size());
        const fb::Message* reply = msg::verify_control(bytes);
        const auto* ack = reply->body_as_HeartbeatAck();
        if (!ack || ack->pid() != c.pid) continue;
        c.last_ack_ms = now;
        if (c.state == ChildState::starting || c.state == ChildState::unresponsive) {
          log->info("{} pid {} healthy ({} ms after start)", c.name, c.pid, now - c.started_ms);
          c.state = ChildState::healthy;
        }
      }
      ++c.heartbeat_seq;
      msg::Bytes hb = msg::make_heartbeat(c.heartbeat_seq, c.heartbeat_seq);
      zmq::message_t out(hb.data(), hb.size());
      (void)c.dealer->send(out, zmq::send_flags::dontwait);  // not connected yet: next tick
    } catch (const std::exception& e) {
      log->warn("heartbeat to {}: {}", c.name, e.what());
      c.dealer.reset();
    }
    if (c.state == ChildState::healthy && c.last_ack_ms != 0 &&
        now - c.last_ack_ms > static_cast<uint64_t>(opt.unresponsive_ms)) {
      log->warn("{} pid {} unresponsive: no heartbeat reply for {} ms", c.name, c.pid,
                now - c.last_ack_ms);
      c.state = ChildState::unresponsive;
    }
  }

  std::string stack_state() const {
    if (stopping) return "stopping";
    bool all_healthy = true, degraded = false;
    for (const auto& c : children) {
      all_healthy = all_healthy && c.state == ChildState::healthy;
      degraded = degraded || c.state == ChildState::failed || c.state == ChildState::unresponsive;
    }
    return degraded ? "degraded" : all_healthy ? "healthy" : "starting";
  }

  void update_stack_state() {
    std::string s = stack_state();
    if (s != last_stack_state) {
      log->info("stack {} is {}", opt.stack_id, s);
      last_stack_state = s;
    }
    if (ready_notified) return;
    if (s == "healthy") {
      ready_notified = true;
      notify_ready_fd(opt.ready_fd, opt.ready_note.empty() ? "ok" : "ok: " + opt.ready_note);
    } else if (s == "degraded") {
      ready_notified = true;
      std::string why;
      for (const auto& c : children)
        if (c.state == ChildState::failed || c.state == ChildState::unresponsive)
          why += (why.empty() ? "" : "; ") + c.name + " " + state_name(c.state) + " (" +
                 c.last_exit + ", log " + log_path(opt.run_dir, c.name) + ")";
      notify_ready_fd(opt.ready_fd, "degraded: " + why);
    }
  }

  void on_tick() {
    const uint64_t now = monotonic_ms();
    for (auto& c : children) heartbeat(c, now);
    serve_control();
    update_stack_state();
  }

  // libuv callbacks are C: nothing may unwind through them.
  template <class F>
  void guarded(const char* what, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      log->error("{}: {}", what, e.what());
    }
  }

  nlohmann::json status_json() const {
    const uint64_t now = monotonic_ms();
    nlohmann::json services = nlohmann::json::array();
    for (const auto& c : children) {
      nlohmann::json s = {{"name", c.name},
                          {"pid", c.pid},
                          {"state", state_name(c.state)},
                          {"uptime_ms", c.proc ? now - c.started_ms : 0},
                          {"restarts", c.restarts},
                          {"heartbeat_age_ms", nullptr},
                          {"last_exit", c.last_exit},
                          {"log", log_path(opt.run_dir, c.name)}};
      if (c.proc && c.last_ack_ms != 0) s["heartbeat_age_ms"] = now - c.last_ack_ms;
      services.push_back(std::move(s));
    }
    return {{"stack", opt.stack_id},
            {"state", stack_state()},
            {"pid", getpid()},
            {"uptime_ms", now - started_ms},
            {"run_dir", opt.run_dir},
            {"model", opt.model_path},
            {"soc", opt.soc},
            {"max_restarts", opt.max_restarts},
            {"restart_window_ms", opt.restart_window_ms},
            {"http", opt.http_listen},
            {"services", std::move(services)}};
  }

  // ---- control socket ----

  msg::Bytes answer(const msg::Bytes& payload, bool& shutdown_after) {
    const fb::Message* m = nullptr;
    try {
      m = msg::verify_control(payload);
    } catch (const Error& e) {
      log->warn("rejected a {}-byte control request: {}", payload.size(), e.what());
      return msg::make_error_reply(0, e.code(), e.what());
    }
    const uint64_t rid = m->request_id();
    const auto self = fb::ServiceKind::Supervisor;
    switch (m->body_type()) {
      case fb::Body::Hello:
        return msg::make_hello_ack(rid, self, getpid(), 0);
      case fb::Body::Heartbeat:
        return msg::make_heartbeat_ack(rid, m->body_as_Heartbeat()->seq(), self, getpid(),
                                       monotonic_ms() - started_ms, stack_state());
      case fb::Body::StatusRequest:
        return msg::make_status_reply(rid, self, status_json().dump());
      case fb::Body::Shutdown:
        shutdown_after = true;
        return msg::make_status_reply(rid, self, nlohmann::json{{"state", "stopping"}}.dump());
      case fb::Body::RestartService: {
        auto kind = m->body_as_RestartService()->service();
        for (auto& c : children) {
          if (msg::service_kind(c.id) != kind) continue;
          if (stopping)
            return msg::make_error_reply(rid, Errc::unavailable, "the stack is stopping");
          restart(c);
          return msg::make_status_reply(rid, self, status_json().dump());
        }
        return msg::make_error_reply(
            rid, Errc::not_found,
            std::string("no supervised service of kind ") + fb::EnumNameServiceKind(kind));
      }
      default:
        return msg::make_error_reply(
            rid, Errc::unsupported,
            std::string("the supervisor does not serve ") + (fb::EnumNameBody(m->body_type())[0]
                                                                 ? fb::EnumNameBody(m->body_type())
                                                                 : "unknown body types"));
    }
  }

  void serve_control() {
    if (stopping) return;
    msg::Envelope env;
    for (int i = 0; i < 256; ++i) {
      if (!msg::try_recv_envelope(control, env)) return;
      bool shutdown_after = false;
      msg::send_reply(control, env, answer(env.payload, shutdown_after));
      if (shutdown_after) {
        begin_stop("down requested");
        return;
      }
    }
  }

  int run() {
    uv_loop_init(&loop);
    signal(SIGPIPE, SIG_IGN);
    control = msg::bind_router(supervisor_socket_path(opt.run_dir));
    int fd = control.get(zmq::sockopt::fd);
    uv_poll_init(&loop, &control_poll, fd);
    control_poll.data = this;
    // ZMQ_FD is edge-triggered: drain everything queued on each wake-up (the tick drains too).
    uv_poll_start(&control_poll, UV_READABLE, [](uv_poll_t* h, int, int) {
      auto* self = static_cast<Impl*>(h->data);
      self->guarded("control socket", [self] { self->serve_control(); });
    });

    auto on_signal = [](uv_signal_t* h, int signum) {
      auto* self = static_cast<Impl*>(h->data);
      if (signum == SIGHUP) return;
      self->begin_stop(signum == SIGTERM ? "SIGTERM" : "SIGINT");
    };
    for (auto [h, s] : {std::pair{&sig_term, SIGTERM}, std::pair{&sig_int, SIGINT},
                        std::pair{&sig_hup, SIGHUP}}) {
      uv_signal_init(&loop, h);
      h->data = this;
      uv_signal_start(h, on_signal, s);
    }
    uv_timer_init(&loop, &tick);
    tick.data = this;
    uv_timer_start(
        &tick,
        [](uv_timer_t* t) {
          auto* self = static_cast<Impl*>(t->data);
          self->guarded("tick", [self] { self->on_tick(); });
        },
        static_cast<uint64_t>(opt.heartbeat_ms), static_cast<uint64_t>(opt.heartbeat_ms));
    for (auto& c : children) {
      uv_timer_init(&loop, &c.restart_timer);
      uv_timer_init(&loop, &c.kill_timer);
      c.restart_timer.data = &c;
      c.kill_timer.data = &c;
    }
    log->info("supervisor pid {} for stack {} (run dir {}, model '{}', soc '{}')", getpid(),
              opt.stack_id, opt.run_dir, opt.model_path, opt.soc);
    for (auto& c : children) spawn(c);

    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    control.close();

    size_t segments = shm::remove_stack_segments(opt.stack_id);
    log->info("stack {} down: removed {} segments and the run dir {}", opt.stack_id, segments,
              opt.run_dir);
    log->flush();
    lock.remove_run_dir();
    return 0;
  }
};

Supervisor::Supervisor(SupervisorOptions options, StackLock& lock,
                       std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(std::move(options), lock, std::move(log))) {}

Supervisor::~Supervisor() = default;

int Supervisor::run() {
  return impl_->run();
}

}  // namespace duet::supervisor
