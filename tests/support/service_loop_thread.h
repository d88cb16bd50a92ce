#pragma once
// A real ServiceLoop on its own thread inside a test process, set up the way the supervisor
// starts a service (its own run dir, its control socket) but with SIGTERM/SIGINT left to the
// test. The tests of core/ipc/service and of each service's handlers (npu_svc, solver_svc, the
// profiler's measured mode) register handlers on loop() as the service's main does, start() it
// and talk to it over endpoint(). Header-only.
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "core/ipc/run_dir.h"
#include "core/ipc/service.h"

namespace duet::test_support {

class ServiceLoopThread {
 public:
  // A loop of service `id` for stack `stack_id` whose run dir is `run_dir` (created by the loop).
  ServiceLoopThread(ServiceId id, const std::string& stack_id, const std::string& run_dir,
                    const std::string& model_path = "") {
    ServiceOptions o;
    o.id = id;
    o.stack_id = stack_id;
    o.run_dir = run_dir;
    o.model_path = model_path;
    o.handle_signals = false;
    loop_ = std::make_unique<ServiceLoop>(std::move(o));
  }
  ~ServiceLoopThread() { stop(); }
  ServiceLoopThread(const ServiceLoopThread&) = delete;
  ServiceLoopThread& operator=(const ServiceLoopThread&) = delete;

  ServiceLoop& loop() { return *loop_; }
  // Serves on a thread of its own until stop(), a Shutdown request or the destructor.
  void start() {
    thread_ = std::thread([this] { loop_->run(); });
  }
  // Waits for run() to return by itself (after a Shutdown request).
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  void stop() {
    loop_->stop();
    join();
  }
  // Where a msg::RequestClient reaches the loop's control socket.
  std::string endpoint() const {
    return ipc_endpoint(control_socket_path(loop_->run_dir(), loop_->options().id));
  }

 private:
  std::unique_ptr<ServiceLoop> loop_;
  std::thread thread_;
};

}  // namespace duet::test_support
