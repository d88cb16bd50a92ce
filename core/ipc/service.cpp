#include "core/ipc/service.h"

#include "core/base/settings.h"
#include "core/ipc/log_file.h"
#include "core/ipc/model_access.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace duet {

namespace {

// The write end of the running loop's wake pipe, for the signal handler (one loop per process
// handles signals).
std::atomic<int> g_signal_wake_fd{-1};

void on_stop_signal(int) {
  int fd = g_signal_wake_fd.load();
  if (fd >= 0) {
    char c = 's';
    [[maybe_unused]] ssize_t n = write(fd, &c, 1);
  }
}

bool crash_requested(std::string_view name) {
  const auto v = setting_override("DUET_CRASH_AT_START");
  if (!v) return false;
  std::string_view list = *v;
  while (!list.empty()) {
    size_t comma = list.find(',');
    if (list.substr(0, comma) == name) return true;
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

ServiceLoop::ServiceLoop(ServiceOptions options) : options_(std::move(options)) {
  validate_stack_id(options_.stack_id);
  run_dir_ = options_.run_dir.empty() ? default_run_dir(options_.stack_id) : options_.run_dir;
  make_private_dir(run_dir_);
  socket_path_ = control_socket_path(run_dir_, options_.id);

  std::vector<spdlog::sink_ptr> sinks;
  sinks.push_back(make_log_file_sink(run_dir_, name()));
  if (options_.log_to_stderr)
    sinks.push_back(std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
  logger_ = std::make_shared<spdlog::logger>(std::string(name()), sinks.begin(), sinks.end());
  logger_->set_pattern("%Y-%m-%d %H:%M:%S.%e [%n %P] %l: %v");
  logger_->flush_on(spdlog::level::info);

  if (pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(Errc::io, std::string("pipe2: ") + std::strerror(errno));
  router_ = msg::bind_router(socket_path_);
  started_ms_ = monotonic_ms();
  logger_->info("{} pid {} bound {} (stack {}, model '{}', soc '{}')", name(), getpid(),
                socket_path_, options_.stack_id, options_.model_path, options_.soc);
}

ServiceLoop::~ServiceLoop() {
  if (options_.handle_signals) g_signal_wake_fd.store(-1);
  router_.close();
  // Only our own socket file: a successor bound at the same path must keep its file.
  unlink(socket_path_.c_str());
  for (int fd : wake_pipe_)
    if (fd >= 0) close(fd);
  if (logger_) logger_->flush();
}

void ServiceLoop::on(fb::Body type, Handler handler) {
  switch (type) {
    case fb::Body::Hello:
    case fb::Body::Heartbeat:
    case fb::Body::StatusRequest:
    case fb::Body::Shutdown:
      throw Error(Errc::invalid_argument,
                  std::string("the service loop answers ") + fb::EnumNameBody(type) + " itself");
    default:
      handlers_[type] = std::move(handler);
  }
}

void ServiceLoop::add_socket(zmq::socket_t& socket, std::function<void()> on_readable) {
  extra_.push_back({&socket, std::move(on_readable)});
}

void ServiceLoop::set_idle(std::function<void()> on_idle, int idle_tick_ms) {
  on_idle_ = std::move(on_idle);
  idle_tick_ms_ = std::max(1, idle_tick_ms);
}

void ServiceLoop::set_state(std::string state) {
  if (state != state_) logger_->info("state {} -> {}", state_, state);
  state_ = std::move(state);
}

void ServiceLoop::set_status(std::function<nlohmann::json()> status) {
  status_ = std::move(status);
}

uint64_t ServiceLoop::uptime_ms() const {
  return monotonic_ms() - started_ms_;
}

void ServiceLoop::stop() {
  stopping_.store(true);
  char c = 'q';
  [[maybe_unused]] ssize_t n = write(wake_pipe_[1], &c, 1);
}

nlohmann::json ServiceLoop::status_json() const {
  nlohmann::json j = {
      {"service", name()},   {"pid", getpid()},          {"stack", options_.stack_id},
      {"state", state_},     {"uptime_ms", uptime_ms()}, {"model", options_.model_path},
      {"soc", options_.soc}, {"requests", requests_},    {"errors", errors_}};
  if (status_) j.update(status_());
  return j;
}

msg::Bytes ServiceLoop::dispatch(const msg::Bytes& payload) {
  const fb::Message* m = nullptr;
  try {
    m = msg::verify_control(payload);
  } catch (const Error& e) {
    ++errors_;
    logger_->warn("rejected a {}-byte request: {}", payload.size(), e.what());
    return msg::make_error_reply(0, e.code(), e.what());
  }
  const uint64_t rid = m->request_id();
  const fb::Body type = m->body_type();
  const auto kind = msg::service_kind(options_.id);
  try {
    switch (type) {
      case fb::Body::Hello: {
        const auto* h = m->body_as_Hello();
        epoch_ = std::max(epoch_, h->epoch());
        return msg::make_hello_ack(rid, kind, getpid(), epoch_);
      }
      case fb::Body::Heartbeat:
        return msg::make_heartbeat_ack(rid, m->body_as_Heartbeat()->seq(), kind, getpid(),
                                       uptime_ms(), state_);
      case fb::Body::StatusRequest:
        return msg::make_status_reply(rid, kind, status_json().dump());
      case fb::Body::Shutdown:
        logger_->info("shutdown requested");
        stopping_.store(true);
        set_state("stopping");
        return msg::make_status_reply(rid, kind, status_json().dump());
      default:
        break;
    }
    auto it = handlers_.find(type);
    if (it == handlers_.end())
      throw Error(Errc::unsupported, std::string(name()) + " has no handler for " +
                                         (fb::EnumNameBody(type)[0] ? fb::EnumNameBody(type)
                                                                    : "an unknown body type"));
    return it->second(*m);
  } catch (const Error& e) {
    ++errors_;
    logger_->warn("{} request {} failed [{}]: {}", fb::EnumNameBody(type), rid, errc_name(e.code()),
                  e.what());
    return msg::make_error_reply(rid, e.code(), e.what());
  } catch (const std::exception& e) {
    ++errors_;
    logger_->error("{} request {} failed: {}", fb::EnumNameBody(type), rid, e.what());
    return msg::make_error_reply(rid, Errc::internal, e.what());
  }
}

void ServiceLoop::serve_control() {
  msg::Envelope env;
  // Bounded so that a flood on one socket cannot starve the others.
  for (int i = 0; i < 256 && !stopping_.load(); ++i) {
    if (!msg::try_recv_envelope(router_, env)) return;
    ++requests_;
    msg::Bytes reply = dispatch(env.payload);
    msg::send_reply(router_, env, reply);
  }
}

void ServiceLoop::run() {
  struct sigaction old_term {
  }, old_int{};
  if (options_.handle_signals) {
    g_signal_wake_fd.store(wake_pipe_[1]);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGINT, &sa, &old_int);
  }
  if (state_ == "starting") set_state("ready");
  std::vector<zmq::pollitem_t> items;
  items.push_back({static_cast<void*>(router_), 0, ZMQ_POLLIN, 0});
  items.push_back({nullptr, wake_pipe_[0], ZMQ_POLLIN, 0});
  for (auto& e : extra_) items.push_back({static_cast<void*>(*e.socket), 0, ZMQ_POLLIN, 0});

  while (!stopping_.load()) {
    try {
      zmq::poll(items.data(), items.size(),
                std::chrono::milliseconds(busy_ && busy_() ? 0 : idle_tick_ms_));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      throw;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      char buf[64];
      while (read(wake_pipe_[0], buf, sizeof(buf)) > 0) {
      }
      if (!stopping_.load()) {
        logger_->info("stop signal received");
        stopping_.store(true);
      }
      break;
    }
    if (items[0].revents & ZMQ_POLLIN) serve_control();
    for (size_t i = 0; i < extra_.size(); ++i)
      if (items[2 + i].revents & ZMQ_POLLIN) extra_[i].on_readable();
    if (on_idle_) on_idle_();
  }
  set_state("stopped");
  logger_->info("{} stopping after {} requests ({} failed)", name(), requests_, errors_);
  if (options_.handle_signals) {
    g_signal_wake_fd.store(-1);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaction(SIGINT, &old_int, nullptr);
  }
}

int service_main(int argc, char** argv, ServiceId id,
                 const std::function<void(ServiceLoop&)>& setup,
                 const std::function<void(CLI::App&)>& add_options) {
  const std::string exe(service_name(id));
  ServiceOptions o;
  o.id = id;
  CLI::App app{exe + ": a duet service (normally started by duet-supervisor)"};
  app.add_option("--stack", o.stack_id, "stack id")->capture_default_str();
  app.add_option("--run-dir", o.run_dir, "run directory (default: from the stack id)");
  app.add_option("--model", o.model_path, "GGUF model path");
  app.add_option("--soc", o.soc, "SoC profile name or path")->capture_default_str();
  app.add_flag("--log-stderr", o.log_to_stderr, "also log to stderr");
  std::vector<std::string> model_dirs;
  app.add_option("--model-dir", model_dirs,
                 "another directory whose models peers may name (also DUET_MODEL_DIRS)");
  if (add_options) add_options(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // Peers may name model files only inside these (core/ipc/model_access.h).
  allow_model_dirs(model_dirs_for(o.model_path, model_dirs));

  umask(0077);
  // A service outlives its supervisor (issue 22): the next `duet stack up` adopts it from the
  // supervisor's record (core/ipc/stack_record.h) and `duet stack down` stops it. Only a supervisor
  // that died before this process got here means a start nobody will record: exit then.
  if (const auto sup = setting_override("DUET_SUPERVISOR_PID")) {
    if (std::to_string(getppid()) != *sup) return 1;
  }
  if (crash_requested(exe)) {
    std::fprintf(stderr, "%s: crashing at start (test hook DUET_CRASH_AT_START)\n", exe.c_str());
    struct rlimit no_core {};
    setrlimit(RLIMIT_CORE, &no_core);
    std::abort();
  }
  try {
    ServiceLoop loop(o);
    setup(loop);
    loop.run();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: error [%s]: %s\n", exe.c_str(),
                 std::string(errc_name(e.code())).c_str(), e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", exe.c_str(), e.what());
  }
  return 1;
}

}  // namespace duet
