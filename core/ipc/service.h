#pragma once
// The service runtime every duet service runs: a ROUTER on the service's control socket that
// answers Hello, Heartbeat, StatusRequest and Shutdown itself and hands every other body to a
// handler the service registered. A handler returns the reply buffer or throws duet::Error,
// which becomes an ErrorReply; a buffer that fails verification gets an ErrorReply too, so no
// input can crash or stall the loop. Logs go to <run-dir>/<service>.log.
//
// Test hook: DUET_CRASH_AT_START=<service>[,<service>...] makes service_main() abort before the
// socket is bound (the supervisor's restart-intensity tests use it).
#include <spdlog/logger.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"

namespace CLI {
class App;
}

namespace duet {

struct ServiceOptions {
  ServiceId id = ServiceId::gpu;
  std::string stack_id = std::string(kDefaultStackId);
  std::string run_dir;     // empty: default_run_dir(stack_id)
  std::string model_path;  // the GGUF the stack serves
  std::string soc = "sd8gen3";
  // Off for loops run inside a test process: SIGTERM/SIGINT then belong to the test.
  bool handle_signals = true;
  bool log_to_stderr = false;  // also echo the log to stderr
};

class ServiceLoop {
 public:
  // Handler for one Body type: gets the verified request, returns the finished reply buffer
  // (msg::make_* or msg::finish_message with request.request_id()).
  using Handler = std::function<msg::Bytes(const fb::Message& request)>;

  // Creates the run dir (0700) if needed, opens the log and binds the control socket (0600).
  explicit ServiceLoop(ServiceOptions options);
  ~ServiceLoop();
  ServiceLoop(const ServiceLoop&) = delete;
  ServiceLoop& operator=(const ServiceLoop&) = delete;

  // Registers the handler of a body type; Hello, Heartbeat, StatusRequest and Shutdown are
  // answered by the loop and cannot be overridden.
  void on(fb::Body type, Handler handler);
  // Polls another socket in the same loop (the frontend's client socket) and calls on_readable
  // when it has input; the callback must not block.
  void add_socket(zmq::socket_t& socket, std::function<void()> on_readable);
  // Called on every loop wake-up (at least every idle_tick_ms): timers, deadlines.
  void set_idle(std::function<void()> on_idle, int idle_tick_ms = 100);
  // While busy() is true (the frontend has steps to run) the loop checks its sockets without
  // sleeping and calls on_idle again at once, instead of waiting up to idle_tick_ms.
  void set_busy(std::function<bool()> busy) { busy_ = std::move(busy); }

  // The state reported in HeartbeatAck and status ("ready" once run() starts).
  void set_state(std::string state);
  // Extra fields merged into the StatusReply JSON.
  void set_status(std::function<nlohmann::json()> status);

  // Serves until Shutdown, SIGTERM/SIGINT (if handled) or stop().
  void run();
  void stop();  // thread-safe and async-signal-safe

  spdlog::logger& log() { return *logger_; }
  std::shared_ptr<spdlog::logger> logger() const { return logger_; }
  const ServiceOptions& options() const { return options_; }
  const std::string& run_dir() const { return run_dir_; }
  std::string_view name() const { return service_name(options_.id); }
  uint64_t uptime_ms() const;
  uint64_t requests_served() const { return requests_; }
  uint64_t requests_failed() const { return errors_; }

 private:
  void serve_control();  // drains the control socket
  msg::Bytes dispatch(const msg::Bytes& payload);
  nlohmann::json status_json() const;

  ServiceOptions options_;
  std::string run_dir_;
  std::string socket_path_;
  std::shared_ptr<spdlog::logger> logger_;
  zmq::socket_t router_;
  int wake_pipe_[2] = {-1, -1};
  std::map<fb::Body, Handler> handlers_;
  struct Extra {
    zmq::socket_t* socket;
    std::function<void()> on_readable;
  };
  std::vector<Extra> extra_;
  std::function<void()> on_idle_;
  int idle_tick_ms_ = 100;
  std::function<bool()> busy_;
  std::function<nlohmann::json()> status_;
  std::string state_ = "starting";
  uint64_t started_ms_ = 0;
  uint64_t epoch_ = 0;
  uint64_t requests_ = 0;
  uint64_t errors_ = 0;
  std::atomic<bool> stopping_{false};
};

// A service's whole main(): parses --stack, --run-dir, --model, --soc (and --log-stderr),
// honours DUET_CRASH_AT_START, builds the loop, lets `setup` register handlers and sockets, and
// runs it. Returns the process exit code (errors are logged and printed to stderr).
// add_options: the service's own flags (http_svc's --listen), added before parsing.
int service_main(int argc, char** argv, ServiceId id,
                 const std::function<void(ServiceLoop&)>& setup,
                 const std::function<void(CLI::App&)>& add_options = {});

}  // namespace duet
