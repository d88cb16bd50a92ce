#pragma once
// ZeroMQ helpers for the control plane: endpoints, message builders, verification and a
// request/reply client with deadlines. Every control buffer is a duet.fb.Message
// (schemas/control.fbs) and every client buffer a duet.fb.client.ClientMessage
// (schemas/client.fbs); nothing reads one before verify_control/verify_client accepted it.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "core/program/program.h"
#include "schemas/client_generated.h"
#include "schemas/control_generated.h"

namespace duet::msg {

using Bytes = std::vector<uint8_t>;

// The process's one ZeroMQ context (created on first use).
zmq::context_t& context();

// Verifier limits: deep nesting and huge table counts are refused before any field is read.
inline constexpr uint32_t kMaxDepth = 32;
inline constexpr uint32_t kMaxTables = 1u << 16;
inline constexpr size_t kMaxMessageBytes = size_t{64} << 20;

// Returns the root of a buffer that passed flatbuffers::Verifier (identifier, depth, table count
// and size limits); throws Error(bad_format) naming the problem otherwise. The bytes must stay
// alive and unmoved while the result is used.
const fb::Message* verify_control(std::span<const uint8_t> bytes);
const fb::client::ClientMessage* verify_client(std::span<const uint8_t> bytes);

fb::Code to_fb_code(Errc code);
Errc from_fb_code(fb::Code code);  // codes this build does not know map to Errc::internal
fb::ServiceKind service_kind(ServiceId id);

// Finishes `body` into a Message with the control file identifier.
Bytes finish_message(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, fb::Body type,
                     flatbuffers::Offset<void> body);
template <class T>
Bytes finish_message(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id,
                     flatbuffers::Offset<T> body) {
  return finish_message(fbb, request_id, fb::BodyTraits<T>::enum_value, body.Union());
}

Bytes make_hello(uint64_t request_id, fb::ServiceKind service, int pid, const std::string& stack_id,
                 uint64_t epoch);
Bytes make_hello_ack(uint64_t request_id, fb::ServiceKind service, int pid, uint64_t epoch);
Bytes make_heartbeat(uint64_t request_id, uint64_t seq);
Bytes make_heartbeat_ack(uint64_t request_id, uint64_t seq, fb::ServiceKind service, int pid,
                         uint64_t uptime_ms, const std::string& state);
Bytes make_status_request(uint64_t request_id);
Bytes make_status_reply(uint64_t request_id, fb::ServiceKind service, const std::string& json);
Bytes make_shutdown(uint64_t request_id);
Bytes make_restart_service(uint64_t request_id, fb::ServiceKind service);
Bytes make_error_reply(uint64_t request_id, Errc code, const std::string& message);
Bytes make_client_error(uint64_t request_id, Errc code, const std::string& message);

// The StepArgs a RunStep carries (token table, page tables, preemption); Error(invalid_argument)
// when it names no token table or page tables. Every device service reads RunStep this way.
StepArgs step_args_of(const fb::RunStep& body);

// The StepDone a device service answers a RunStep with, from its runner's report (gpu_svc's and
// npu_svc's StepReport differ in extra fields, not in these), and the StepFailed for an error.
template <class Report>
Bytes make_step_done(uint64_t request_id, const fb::RunStep& body, const Report& r) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::OpTime>> times;
  times.reserve(r.ops.size());
  for (const auto& t : r.ops)
    times.push_back(fb::CreateOpTime(fbb, t.op_index, static_cast<float>(t.measured_us),
                                     static_cast<float>(t.modeled_us)));
  return finish_message(
      fbb, request_id,
      fb::CreateStepDoneDirect(fbb, body.program_id(), body.step_seq(),
                               static_cast<float>(r.measured_us), static_cast<float>(r.modeled_us),
                               static_cast<float>(r.wait_us), &times, r.next_op, r.preempted,
                               r.ops_run));
}
Bytes make_step_failed(uint64_t request_id, const fb::RunStep& body, const Error& e);

// Throws the ErrorReply carried by `m` as duet::Error (same code and message); no-op otherwise.
void throw_if_error(const fb::Message& m);

// A ROUTER bound at `socket_path` (mode 0600 after bind; the run dir is 0700 so no other user
// can race the chmod), linger 0, messages over kMaxMessageBytes dropped by ZeroMQ.
zmq::socket_t bind_router(const std::string& socket_path);
// A DEALER connected to `endpoint`, linger 0. With queue_until_connected false a send to a peer
// not connected yet fails at once (heartbeats) instead of waiting in the queue.
zmq::socket_t connect_dealer(const std::string& endpoint, bool queue_until_connected = false);

// One request as a ROUTER sees it: the routing frames to echo back, and the last frame (copied so
// that it is suitably aligned for flatbuffers).
struct Envelope {
  std::vector<zmq::message_t> routing;
  Bytes payload;
};
// Reads one multipart message without blocking; false when none is waiting.
bool try_recv_envelope(zmq::socket_t& router, Envelope& out);
// Sends `reply` back along the envelope's route without blocking (a vanished peer is not an error).
void send_reply(zmq::socket_t& router, Envelope& envelope, std::span<const uint8_t> reply);

// A verified reply: the bytes and the Message root inside them.
struct Reply {
  Bytes bytes;
  const fb::Message& message() const { return *flatbuffers::GetRoot<fb::Message>(bytes.data()); }
};

// Request/reply over a DEALER with deadlines and request ids. A reply whose id is not the
// outstanding request's is a late answer to an abandoned one and is dropped; after a timeout the
// socket is replaced, so a late reply cannot even reach the new one.
class RequestClient {
 public:
  explicit RequestClient(std::string endpoint);
  RequestClient(const RequestClient&) = delete;
  RequestClient& operator=(const RequestClient&) = delete;

  using Build = std::function<Bytes(uint64_t request_id)>;
  // Builds the request with a fresh id, sends it and returns the verified reply with that id. An
  // ErrorReply is thrown as duet::Error with its code; no reply by the deadline throws
  // Error(timeout); an unverifiable reply throws Error(bad_format).
  Reply call(const Build& build, std::chrono::milliseconds timeout);
  // Sends the bytes as they are and returns the last frame of the first reply, unverified (for
  // probing a service with malformed input).
  Bytes call_raw(std::span<const uint8_t> bytes, std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }

 private:
  void reset_socket();
  // Waits for one reply until the deadline; false on timeout.
  bool recv_until(std::chrono::steady_clock::time_point deadline, Bytes& out);

  std::string endpoint_;
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t next_request_id_ = 1;
};

}  // namespace duet::msg
