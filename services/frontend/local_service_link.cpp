// The in-process device link: the service's own handlers, called on a worker thread with the
// very messages ServiceLink would send over ZeroMQ. Only the transport differs from the stack.
#include "core/base/error.h"
#include "services/frontend/program_engine.h"
#include "services/frontend/step_worker.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

class LocalServiceLink : public DeviceLink {
 public:
  LocalServiceLink(std::string name, ControlHandler register_program, ControlHandler run_step)
      : name_(std::move(name)),
        register_(std::move(register_program)),
        run_(std::move(run_step)),
        worker_(name_) {}

  std::string name() const override { return name_; }
  // gpu_svc and npu_svc honour RunStep.first_op and the preempt flag.
  bool supports_preemption() const override { return true; }

  void register_program(uint32_t program_id, const fb::ProgramT& program) override {
    const msg::Bytes request = build_register_program(next_id_++, program_id, program);
    // Between steps: a step started meanwhile waits for the registration.
    worker_.between_steps(
        [&] { check_registered(name_, register_(*msg::verify_control(request))); });
  }

  void start_step(uint32_t program_id, const StepArgs& step) override {
    worker_.start([this, request = build_run_step(program_id, step)] {
      try {
        return run_(*msg::verify_control(request));
      } catch (const Error& e) {
        return msg::make_error_reply(0, e.code(), e.what());
      }
    });
  }

  bool failed_early(uint64_t) override {
    return worker_.failed([](const msg::Bytes& reply) {
      return msg::verify_control(reply)->body_type() != fb::Body::StepDone;
    });
  }

  Report finish_step(uint64_t step_seq, Clock::time_point deadline) override {
    const msg::Bytes reply = worker_.finish(step_seq, deadline);
    return parse_step_reply(name_, reply);
  }

 private:
  std::string name_;
  ControlHandler register_, run_;
  uint64_t next_id_ = uint64_t{1} << 62;
  StepWorker<msg::Bytes> worker_;  // last: its thread starts once everything above exists
};

}  // namespace

std::unique_ptr<DeviceLink> make_local_service_link(std::string name,
                                                    ControlHandler register_program,
                                                    ControlHandler run_step) {
  return std::make_unique<LocalServiceLink>(std::move(name), std::move(register_program),
                                            std::move(run_step));
}

}  // namespace duet::frontend
