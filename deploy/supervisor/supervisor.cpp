// The supervisor's processes: start, adopt, exit, restart, stop, and the loop. See supervisor.h;
// heartbeats, state and the control socket are in supervisor_control.cpp.
#include "deploy/supervisor/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <uv.h>

#include <array>
#include <cstring>
#include <deque>
#include <filesystem>

#include "core/ipc/listen_socket.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "deploy/supervisor/supervisor_impl.h"
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

std::vector<std::string> Supervisor::Impl::service_argv(const Child& c) const {
  std::vector<std::string> args = {opt.bin_dir + "/" + c.name,
                                   "--stack",
                                   opt.stack_id,
                                   "--run-dir",
                                   opt.run_dir,
                                   "--soc",
                                   opt.soc};
  if (!opt.model_path.empty()) args.insert(args.end(), {"--model", opt.model_path});
  if (c.id == ServiceId::http) {
    args.insert(args.end(), {"--listen", opt.http_listen});
    if (!opt.http_api_key_file.empty())
      args.insert(args.end(), {"--api-key-file", opt.http_api_key_file});
  }
  return args;
}

void Supervisor::Impl::write_record() {
  StackRecord r;
  r.supervisor_pid = getpid();
  for (const Child& c : children)
    r.services.push_back(
        {c.name, c.running() ? c.pid : 0, c.running() ? c.start_ticks : 0, c.argv, c.env});
  try {
    write_stack_record(opt.run_dir, r);
  } catch (const Error& e) {
    log->warn("cannot record the services for a takeover: {}", e.what());
  }
}

Supervisor::Impl::Child* Supervisor::Impl::find_child(ServiceId id) {
  for (auto& c : children)
    if (c.id == id) return &c;
  return nullptr;
}

void Supervisor::Impl::spawn(Child& c) {
  std::vector<std::string> args = c.argv;
  const std::string exe = args.front();
  // http_svc serves our listening socket, at the fd a takeover takes it back from.
  const int listen_fd = c.id == ServiceId::http ? http_listen_socket() : -1;
  if (listen_fd >= 0) args.insert(args.end(), {"--listen-fd", std::to_string(kInheritedListenFd)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "DUET_", 5) != 0) env_store.emplace_back(*e);
  env_store.insert(env_store.end(), c.env.begin(), c.env.end());
  env_store.push_back("DUET_SUPERVISOR_PID=" + std::to_string(getpid()));
  std::vector<char*> envp;
  for (auto& e : env_store) envp.push_back(e.data());
  envp.push_back(nullptr);

  // The service's stdout/stderr (an abort message, a sanitizer report) go to its log too.
  std::string log_file = log_path(opt.run_dir, c.name);
  int log_fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  uv_stdio_container_t stdio[kInheritedListenFd + 1];
  stdio[0].flags = UV_IGNORE;
  for (int i = 1; i < 3; ++i) {
    stdio[i].flags = log_fd >= 0 ? UV_INHERIT_FD : UV_IGNORE;
    stdio[i].data.fd = log_fd;
  }
  uv_stdio_container_t* socket_stdio = &stdio[kInheritedListenFd];
  socket_stdio->flags = UV_INHERIT_FD;
  socket_stdio->data.fd = listen_fd;
  uv_process_options_t po{};
  po.file = exe.c_str();
  po.args = argv.data();
  po.env = envp.data();
  po.stdio_count = listen_fd >= 0 ? kInheritedListenFd + 1 : 3;
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
  c.start_ticks = process_start_ticks(c.pid);
  c.adopted = false;
  c.state = ChildState::starting;
  log->info("started {} pid {}", c.name, c.pid);
  write_record();
}

int Supervisor::Impl::http_listen_socket() {
  if (http_socket >= 0 && is_listening_socket(http_socket)) return http_socket;
  if (http_socket >= 0) {
    log->warn("http_svc's socket stopped listening: binding a new one");
    close(http_socket);
    http_socket = -1;
  }
  try {
    http_socket = open_listening_socket(parse_listen_address(opt.http_listen));
    log->info("listening for http_svc on {} (port {})", opt.http_listen, bound_port(http_socket));
  } catch (const Error& e) {
    log->warn("http_svc binds its own socket: {}", e.what());
  }
  return http_socket;
}

void Supervisor::Impl::take_http_socket(int pidfd) {
  const int fd = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, kInheritedListenFd, 0));
  if (fd < 0) {
    log->warn("cannot take http_svc's socket ({}): a restarted http_svc binds a new one",
              std::strerror(errno));
    return;
  }
  const int want = parse_listen_address(opt.http_listen).port;
  if (!is_listening_socket(fd) || (want != 0 && bound_port(fd) != want)) {
    close(fd);  // an http_svc started without our socket: its fd 3 is something else
    return;
  }
  if (http_socket >= 0) close(http_socket);
  http_socket = fd;
  log->info("took http_svc's listening socket (port {}) back", bound_port(fd));
}

void Supervisor::Impl::adopt(Child& c, const ServiceRecord& r, int pidfd) {
  c.pid = r.pid;
  c.start_ticks = r.start_ticks;
  c.pidfd = pidfd;
  c.adopted = true;
  c.started_ms = monotonic_ms();
  c.last_ack_ms = 0;
  c.dealer.reset();
  c.state = ChildState::starting;  // healthy at its first HeartbeatAck
  if (c.id == ServiceId::http) take_http_socket(pidfd);
  c.pid_poll = new uv_poll_t{};
  c.pid_poll->data = &c;
  uv_poll_init(&loop, c.pid_poll, pidfd);
  uv_poll_start(c.pid_poll, UV_READABLE, [](uv_poll_t* h, int, int) {
    auto* ch = static_cast<Child*>(h->data);
    ch->sup->guarded("adopted exit", [ch] { ch->sup->on_adopted_exit(*ch); });
  });
  log->info("adopted {} pid {} (started by supervisor pid {})", c.name, c.pid, opt.adopt_from);
}

void Supervisor::Impl::on_adopted_exit(Child& c) {
  uv_poll_stop(c.pid_poll);
  uv_close(reinterpret_cast<uv_handle_t*>(c.pid_poll),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_poll_t*>(h); });
  c.pid_poll = nullptr;
  close(c.pidfd);
  c.pidfd = -1;
  on_gone(c, "exited (an adopted service: its exit status went to init)");
}

void Supervisor::Impl::signal_child(Child& c, int sig) {
  if (c.proc)
    uv_process_kill(c.proc, sig);
  else
    pidfd_signal(c.pidfd, sig);
}

void Supervisor::Impl::on_exit(Child& c, int64_t status, int sig) {
  uv_close(reinterpret_cast<uv_handle_t*>(c.proc),
           [](uv_handle_t* h) { delete reinterpret_cast<uv_process_t*>(h); });
  c.proc = nullptr;
  on_gone(c, describe_exit(status, sig));
}

void Supervisor::Impl::on_gone(Child& c, std::string last_exit) {
  uv_timer_stop(&c.kill_timer);
  c.dealer.reset();
  c.last_exit = std::move(last_exit);
  const int old_pid = c.pid;
  c.pid = 0;
  c.adopted = false;
  write_record();
  if (stopping) {
    log->info("{} pid {} stopped: {}", c.name, old_pid, c.last_exit);
    c.state = ChildState::stopped;
    continue_stop();
    return;
  }
  bump_stack_epoch(c.name);
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

void Supervisor::Impl::bump_stack_epoch(const std::string& who) {
  const std::string prefix = shm::segment_name(opt.stack_id, "flags");
  for (const std::string& name : shm::list_stack_segments(opt.stack_id)) {
    if (name.rfind(prefix, 0) != 0) continue;  // flags, flags.<plan>, ...
    try {
      shm::Segment seg = shm::Segment::open(name);
      const uint64_t epoch = shm::FlagTable::attach(seg).bump_epoch();
      log->info("{} died: epoch of {} is now {}", who, name, epoch);
    } catch (const Error& e) {
      log->warn("{} died: could not bump the epoch of {}: {}", who, name, e.what());
    }
  }
}

void Supervisor::Impl::on_crash(Child& c, const std::string& why) {
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
        if (!ch->sup->stopping && !ch->running())
          ch->sup->guarded("restart", [ch] { ch->sup->spawn(*ch); });
      },
      static_cast<uint64_t>(opt.restart_delay_ms), 0);
  update_stack_state();
}

void Supervisor::Impl::terminate(Child& c) {
  if (!c.running()) return;
  signal_child(c, SIGTERM);
  uv_timer_start(
      &c.kill_timer,
      [](uv_timer_t* t) {
        auto* ch = static_cast<Child*>(t->data);
        if (!ch->running()) return;
        ch->sup->log->warn("{} pid {} ignored SIGTERM for {} ms: SIGKILL", ch->name, ch->pid,
                           ch->sup->opt.stop_timeout_ms);
        ch->sup->signal_child(*ch, SIGKILL);
      },
      static_cast<uint64_t>(opt.stop_timeout_ms), 0);
}

void Supervisor::Impl::restart(Child& c) {
  log->info("restart of {} requested", c.name);
  if (c.running()) {
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

void Supervisor::Impl::begin_stop(const char* why) {
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

void Supervisor::Impl::continue_stop() {
  for (; stop_index < kStopOrder.size(); ++stop_index) {
    Child* found = find_child(kStopOrder[stop_index]);
    if (!found) continue;
    Child& c = *found;
    if (c.running()) {
      if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&c.kill_timer))) terminate(c);
      return;  // on_exit continues with the next one
    }
  }
  finish();
}

void Supervisor::Impl::finish() {
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

int Supervisor::Impl::run() {
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
  for (auto [h, s] :
       {std::pair{&sig_term, SIGTERM}, std::pair{&sig_int, SIGINT}, std::pair{&sig_hup, SIGHUP}}) {
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
  for (auto& c : children) {
    const ServiceRecord* recorded = nullptr;
    if (opt.adopt)
      for (const ServiceRecord& r : opt.adopt->services)
        if (r.name == c.name) recorded = &r;
    if (recorded) {
      if (const int fd = open_recorded_process(*recorded); fd >= 0) {
        adopt(c, *recorded, fd);
        adopted_names.push_back(c.name);
        continue;
      }
      restarted_names.push_back(c.name);
    }
    spawn(c);
  }
  // A service that died while no supervisor ran left its waiters on their deadlines: wake them
  // now (the frontend re-runs its step once the restarted service has its programs again).
  if (!restarted_names.empty()) bump_stack_epoch("a service of the dead supervisor");
  write_record();

  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
  control.close();
  if (http_socket >= 0) close(http_socket);

  size_t segments = shm::remove_stack_segments(opt.stack_id);
  log->info("stack {} down: removed {} segments and the run dir {}", opt.stack_id, segments,
            opt.run_dir);
  log->flush();
  lock.remove_run_dir();
  return 0;
}

Supervisor::Supervisor(SupervisorOptions options, StackLock& lock,
                       std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<Impl>(std::move(options), lock, std::move(log))) {}

Supervisor::~Supervisor() = default;

int Supervisor::run() {
  return impl_->run();
}

}  // namespace duet::supervisor
