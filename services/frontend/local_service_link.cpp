// The in-process device link: the service's own handlers, called on a worker thread with the
// very messages ServiceLink would send over ZeroMQ. Only the transport differs from the stack.
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "services/frontend/program_engine.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

class LocalServiceLink : public DeviceLink {
 public:
  LocalServiceLink(std::string name, ControlHandler register_program, ControlHandler run_step)
      : name_(std::move(name)),
        register_(std::move(register_program)),
        run_(std::move(run_step)),
        worker_([this] { loop(); }) {}
  ~LocalServiceLink() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  std::string name() const override { return name_; }
  // gpu_svc and npu_svc honour RunStep.first_op and the preempt flag.
  bool supports_preemption() const override { return true; }

  void register_program(uint32_t program_id, const fb::ProgramT& program) override {
    const msg::Bytes request = build_register_program(next_id_++, program_id, program);
    std::lock_guard lock(mu_);  // never while a step runs
    check_registered(name_, register_(*msg::verify_control(request)));
  }

  void start_step(uint32_t program_id, const StepArgs& step) override {
    std::lock_guard lock(mu_);
    request_ = build_run_step(program_id, step);
    reply_.reset();
    cv_.notify_all();
  }

  bool failed_early(uint64_t) override {
    std::lock_guard lock(mu_);
    if (!reply_) return false;
    return msg::verify_control(*reply_)->body_type() != fb::Body::StepDone;
  }

  Report finish_step(uint64_t step_seq, Clock::time_point deadline) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return reply_.has_value(); }))
      throw Error(Errc::timeout,
                  name_ + ": step " + std::to_string(step_seq) + " did not report in time");
    msg::Bytes reply = std::move(*reply_);
    reply_.reset();
    return parse_step_reply(name_, reply);
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || request_.has_value(); });
      if (stop_) return;
      msg::Bytes request = std::move(*request_);
      request_.reset();
      lock.unlock();
      msg::Bytes reply;
      try {
        reply = run_(*msg::verify_control(request));
      } catch (const Error& e) {
        reply = msg::make_error_reply(0, e.code(), e.what());
      }
      lock.lock();
      reply_ = std::move(reply);
      cv_.notify_all();
    }
  }

  std::string name_;
  ControlHandler register_, run_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<msg::Bytes> request_, reply_;
  uint64_t next_id_ = uint64_t{1} << 62;
  std::thread worker_;  // last: starts once everything above exists
};

}  // namespace

std::unique_ptr<DeviceLink> make_local_service_link(std::string name,
                                                    ControlHandler register_program,
                                                    ControlHandler run_step) {
  return std::make_unique<LocalServiceLink>(std::move(name), std::move(register_program),
                                            std::move(run_step));
}

}  // namespace duet::frontend
