// A device service (gpu_svc, npu_svc) as a DeviceLink. RegisterProgram goes over a ZeroMQ
// DEALER (the control plane). Steps go through the step doorbell the engine attaches
// (shm/doorbell.h): start_step writes the request into the flags segment and publishes the ring
// flag, the device's listener thread wakes on it, and finish_step reads the report the device
// wrote before its done flag. That is one futex wake each way where a RunStep/StepDone pair
// crossed both processes' ZeroMQ I/O threads and the service loop (issue 7, stack overhead).
// Without a doorbell (no engine attached one) steps fall back to RunStep messages: sent without
// waiting, so both devices start at once; replies carry the request id (the step's seq) and a
// reply to an abandoned request is dropped.
#include <zmq.hpp>

#include "core/base/error.h"
#include "core/ipc/messaging.h"
#include "services/frontend/program_engine.h"
#include "shm/doorbell_step.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

// The device's own deadline for the step's cross-device waits: as long as the engine waits for
// the step (ProgramEngineOptions::step_timeout_ms). A 64-token step of a 1B model on a loaded
// 2-core machine takes over 10 s; a device that died is noticed through the stack epoch, not
// through this deadline.
constexpr uint32_t kDeviceStepDeadlineMs = 30000;

}  // namespace

msg::Bytes build_register_program(uint64_t request_id, uint32_t program_id,
                                  const fb::ProgramT& program) {
  flatbuffers::FlatBufferBuilder fbb(1 << 16);
  auto body = fb::CreateRegisterProgram(fbb, program_id, fb::Program::Pack(fbb, &program));
  return msg::finish_message(fbb, request_id, body);
}

msg::Bytes build_run_step(uint32_t program_id, const StepArgs& step) {
  flatbuffers::FlatBufferBuilder fbb(256);
  const fb::TensorRef tokens(fb::SegmentKind::Arena, fb::DTypeCode::F32, step.tokens_offset,
                             step.n_tokens, 4, 0);
  const fb::TensorRef tables(fb::SegmentKind::Arena, fb::DTypeCode::F32, step.page_tables_offset,
                             step.n_seqs, step.page_table_cols, 0);
  auto body = fb::CreateRunStep(fbb, program_id, step.seq, step.n_tokens, step.n_seqs, &tokens,
                                &tables, kDeviceStepDeadlineMs, step.first_op, step.preempt_flag,
                                step.preempt_token, step.epoch);
  return msg::finish_message(fbb, step.seq, body);
}

void check_registered(const std::string& device, std::span<const uint8_t> reply) {
  const fb::Message* m = msg::verify_control(reply);
  msg::throw_if_error(*m);
  if (m->body_type() != fb::Body::ProgramRegistered)
    throw Error(Errc::bad_format, device + ": unexpected reply to RegisterProgram");
}

DeviceLink::Report parse_step_reply(const std::string& device, std::span<const uint8_t> reply) {
  const fb::Message* m = msg::verify_control(reply);
  msg::throw_if_error(*m);
  if (const auto* failed = m->body_as_StepFailed())
    throw Error(msg::from_fb_code(failed->code()),
                device + ": " +
                    (failed->message() ? failed->message()->str() : std::string("step failed")));
  const auto* done = m->body_as_StepDone();
  if (!done) throw Error(Errc::bad_format, device + ": unexpected reply to RunStep");
  return DeviceLink::Report{done->measured_us(), done->modeled_us(),    done->wait_us(),
                            done->preempted(),   done->stopped_at_op(), done->ops_run()};
}

namespace {

class ServiceLink : public DeviceLink {
 public:
  ServiceLink(std::string name, std::string endpoint)
      : name_(std::move(name)), endpoint_(std::move(endpoint)) {
    reset();
  }

  std::string name() const override { return name_; }
  // gpu_svc and npu_svc honour RunStep.first_op and the preempt flag.
  bool supports_preemption() const override { return true; }

  bool wants_doorbell() const override { return true; }
  void attach_doorbell(const shm::DoorbellBell& bell) override { bell_ = bell; }

  void register_program(uint32_t program_id, const fb::ProgramT& program) override {
    flatbuffers::FlatBufferBuilder fbb(1 << 16);
    const uint64_t id = next_id_++;
    auto body = fb::CreateRegisterProgram(fbb, program_id, fb::Program::Pack(fbb, &program));
    const uint64_t epoch = bell_.valid() ? bell_.epoch() : 0;  // before: a restart after it shows
    send(msg::finish_message(fbb, id, body));
    const msg::Bytes reply = receive(id, Clock::now() + std::chrono::seconds(10));
    const fb::Message* m = msg::verify_control(reply);
    msg::throw_if_error(*m);
    const auto* registered = m->body_as_ProgramRegistered();
    if (!registered) throw Error(Errc::bad_format, name_ + ": unexpected reply to RegisterProgram");
    // Every service of this repo serves doorbells: one that does not would never start a step.
    if (program.doorbell && !registered->doorbell())
      throw Error(Errc::unsupported, name_ + ": registered program " + std::to_string(program_id) +
                                         " but does not serve its step doorbell");
    registered_epoch_ = epoch;
  }

  void start_step(uint32_t program_id, const StepArgs& step) override {
    if (!bell_.valid()) {
      send(build_run_step(program_id, step));
      return;
    }
    // A service restarted since the programs were registered (every restart moves the stack
    // epoch): a restarted one has neither the programs nor a listener on this doorbell, and a
    // ring would go unanswered until the step deadline. Fail now; the engine registers the
    // programs again (recover) and re-runs the step. The engine starts the GPU first and
    // registers it first, so it never rings one device and then fails on the other.
    if (step.epoch != 0 && step.epoch != registered_epoch_)
      throw Error(Errc::unavailable, name_ + ": the stack epoch moved from " +
                                         std::to_string(registered_epoch_) + " to " +
                                         std::to_string(step.epoch) +
                                         " since its programs were registered (a restart)");
    ring_ = bell_.ring(shm::doorbell_request_of(program_id, step, kDeviceStepDeadlineMs));
    ring_seq_ = step.seq;
    ring_epoch_ = step.epoch;
  }

  bool failed_early(uint64_t step_seq) override {
    if (bell_.valid()) {
      if (step_seq != ring_seq_) return false;
      const std::optional<shm::DoorbellReport> r = bell_.report(ring_);
      return r && r->code != 0;
    }
    // A reply already taken is a failure only if it is not a StepDone: a device that finished its
    // part while the engine still waits on the other one has not failed (issue 9 fix: this read
    // as a failure, and the step was re-run as after a device crash).
    if (!early_.empty()) {
      const fb::Message* m = msg::verify_control(early_);
      return m->request_id() == step_seq && m->body_type() != fb::Body::StepDone;
    }
    zmq::message_t frame;
    while (socket_->recv(frame, zmq::recv_flags::dontwait)) {
      msg::Bytes bytes(static_cast<const uint8_t*>(frame.data()),
                       static_cast<const uint8_t*>(frame.data()) + frame.size());
      try {
        const fb::Message* m = msg::verify_control(bytes);
        if (m->request_id() != step_seq) continue;
        early_ = std::move(bytes);
        return m->body_type() != fb::Body::StepDone;
      } catch (const Error&) {
      }
    }
    return false;
  }

  Report finish_step(uint64_t step_seq, Clock::time_point deadline) override {
    if (bell_.valid()) return finish_rung_step(step_seq, deadline);
    msg::Bytes reply;
    if (!early_.empty() && msg::verify_control(early_)->request_id() == step_seq)
      reply = std::move(early_);
    else
      reply = receive(step_seq, deadline);
    early_.clear();
    return parse_step_reply(name_, reply);
  }

 private:
  Report finish_rung_step(uint64_t step_seq, Clock::time_point deadline) {
    if (step_seq != ring_seq_)
      throw Error(Errc::internal, name_ + ": step " + std::to_string(step_seq) +
                                      " was not started (the last rung was " +
                                      std::to_string(ring_seq_) + ")");
    bool epoch_changed = false;
    const std::optional<shm::DoorbellReport> r =
        bell_.wait_report(ring_, deadline, ring_epoch_, &epoch_changed);
    if (!r) {
      // A device that died mid-step never reports; the supervisor's epoch bump says so at once.
      if (epoch_changed)
        throw Error(Errc::unavailable, name_ + ": the stack epoch changed before step " +
                                           std::to_string(step_seq) + " reported");
      throw Error(Errc::timeout,
                  name_ + ": no report for step " + std::to_string(step_seq) + " in time");
    }
    if (r->seq != step_seq)
      throw Error(Errc::internal, name_ + ": report of step " + std::to_string(r->seq) +
                                      " for step " + std::to_string(step_seq));
    if (r->code != 0) throw Error(static_cast<Errc>(r->code), name_ + ": " + r->message);
    return Report{r->measured_us, r->modeled_us, r->wait_us, r->preempted, r->next_op, r->ops_run};
  }

  void reset() {  // Queue until connected: a device that is (re)starting gets the request once it
                  // binds; every
    // wait below has a deadline, so a device that never comes back still fails the step.
    socket_ = std::make_unique<zmq::socket_t>(msg::connect_dealer(endpoint_, true));
  }

  void send(const msg::Bytes& bytes) {
    if (!socket_->send(zmq::buffer(bytes), zmq::send_flags::dontwait))
      throw Error(Errc::unavailable, name_ + ": cannot send (service down?)");
  }

  // The reply with request id `id`; others (late replies to abandoned requests) are dropped.
  msg::Bytes receive(uint64_t id, Clock::time_point deadline) {
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
      if (left.count() <= 0 || zmq::poll(&item, 1, left) == 0) {
        reset();  // a late reply must never be read as the answer to a later request
        throw Error(Errc::timeout,
                    name_ + ": no reply to request " + std::to_string(id) + " in time");
      }
      zmq::message_t frame;
      if (!socket_->recv(frame, zmq::recv_flags::dontwait)) continue;
      msg::Bytes bytes(static_cast<const uint8_t*>(frame.data()),
                       static_cast<const uint8_t*>(frame.data()) + frame.size());
      try {
        if (msg::verify_control(bytes)->request_id() == id) return bytes;
      } catch (const Error&) {
        // An unverifiable frame is dropped; the deadline still bounds the wait.
      }
    }
  }

  std::string name_;
  std::string endpoint_;
  std::unique_ptr<zmq::socket_t> socket_;
  msg::Bytes early_;        // a reply failed_early() read before finish_step asked for it
  shm::DoorbellBell bell_;  // the step doorbell (invalid: RunStep messages)
  uint64_t ring_ = 0, ring_seq_ = 0, ring_epoch_ = 0;  // the step last started
  uint64_t registered_epoch_ = 0;         // the stack epoch when programs were last registered
  uint64_t next_id_ = uint64_t{1} << 62;  // never collides with step seqs
};

}  // namespace

int32_t doorbell_hold_flag(const fb::ProgramT& program, const fb::ProgramT& other) {
  if (program.ops.empty() || program.ops.back()->publish_flag < 0) return -1;
  const auto flag = static_cast<uint32_t>(program.ops.back()->publish_flag);
  // Holding a flag the other device waits on would put the report on that device's path.
  for (const auto& op : other.ops)
    for (uint32_t waited : op->wait_flags)
      if (waited == flag) return -1;
  return static_cast<int32_t>(flag);
}

std::unique_ptr<DeviceLink> make_service_link(std::string name, std::string endpoint) {
  return std::make_unique<ServiceLink>(std::move(name), std::move(endpoint));
}

}  // namespace duet::frontend
