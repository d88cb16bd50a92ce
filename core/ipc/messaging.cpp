#include "core/ipc/messaging.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace duet::msg {

zmq::context_t& context() {
  // Never destroyed: sockets owned by static objects may outlive main(), and zmq_ctx_term would
  // block on them.
  static auto* ctx = [] {
    // ZeroMQ's default of 1023 sockets a context is reached by a process that connects and drops
    // many clients quickly (closed sockets are reaped asynchronously, so they still count for a
    // while): a frontend restart resumes every client, an http_svc runs a connection per worker
    // thread, a test connects 1000 clients in a loop. Each socket holds descriptors too, so the
    // soft descriptor limit goes up to the hard one, as a service manager's LimitNOFILE would.
    rlimit fds{};
    if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur < fds.rlim_max) {
      fds.rlim_cur = fds.rlim_max;
      (void)::setrlimit(RLIMIT_NOFILE, &fds);
    }
    auto* c = new zmq::context_t(1);
    const int limit = c->get(zmq::ctxopt::socket_limit);
    c->set(zmq::ctxopt::max_sockets, std::min(limit, 16384));
    return c;
  }();
  return *ctx;
}

namespace {

flatbuffers::Verifier::Options verifier_options() {
  flatbuffers::Verifier::Options o;
  o.max_depth = kMaxDepth;
  o.max_tables = kMaxTables;
  return o;
}

void check_size(std::span<const uint8_t> bytes, const char* what) {
  if (bytes.size() < 8)
    throw Error(Errc::bad_format, std::string(what) + " of " + std::to_string(bytes.size()) +
                                      " bytes is too short to be a flatbuffer");
  if (bytes.size() > kMaxMessageBytes)
    throw Error(Errc::bad_format, std::string(what) + " of " + std::to_string(bytes.size()) +
                                      " bytes is over the " + std::to_string(kMaxMessageBytes) +
                                      "-byte limit");
}

// flatbuffers 2.0.8's Verifier checks a vector's length field for 4-byte alignment only, so the
// elements of an 8-byte vector may sit at 4 mod 8 in a hostile buffer, and reading them is
// undefined (found by fuzz_messages). A builder always aligns them: such a buffer is malformed.
// The only 8-byte vectors in the schemas are a Program's slot tables.
template <typename T>
void check_element_alignment(const flatbuffers::Vector<T>* v, const uint8_t* base,
                             const char* field) {
  if (v == nullptr) return;
  const auto at = static_cast<size_t>(reinterpret_cast<const uint8_t*>(v->Data()) - base);
  if (at % sizeof(T) != 0)
    throw Error(Errc::bad_format, std::string("control message: ") + field +
                                      "'s elements at byte " + std::to_string(at) +
                                      " are not aligned to " + std::to_string(sizeof(T)) +
                                      " bytes");
}

}  // namespace

const fb::Message* verify_control(std::span<const uint8_t> bytes) {
  check_size(bytes, "control message");
  if (!flatbuffers::BufferHasIdentifier(bytes.data(), fb::MessageIdentifier()))
    throw Error(Errc::bad_format, "not a control message (file identifier is not \"" +
                                      std::string(fb::MessageIdentifier()) + "\")");
  flatbuffers::Verifier v(bytes.data(), bytes.size(), verifier_options());
  if (!fb::VerifyMessageBuffer(v))
    throw Error(Errc::bad_format,
                "control message failed flatbuffers verification (bad offsets, sizes, nesting "
                "deeper than " +
                    std::to_string(kMaxDepth) + " or more than " + std::to_string(kMaxTables) +
                    " tables)");
  const fb::Message* m = fb::GetMessage(bytes.data());
  if (const auto* reg = m->body_as_RegisterProgram(); reg && reg->program()) {
    check_element_alignment(reg->program()->slot_offsets(), bytes.data(), "Program.slot_offsets");
    check_element_alignment(reg->program()->slot_sizes(), bytes.data(), "Program.slot_sizes");
  }
  return m;
}

const fb::client::ClientMessage* verify_client(std::span<const uint8_t> bytes) {
  check_size(bytes, "client message");
  if (!flatbuffers::BufferHasIdentifier(bytes.data(), fb::client::ClientMessageIdentifier()))
    throw Error(Errc::bad_format, "not a client message (file identifier is not \"" +
                                      std::string(fb::client::ClientMessageIdentifier()) + "\")");
  flatbuffers::Verifier v(bytes.data(), bytes.size(), verifier_options());
  if (!fb::client::VerifyClientMessageBuffer(v))
    throw Error(Errc::bad_format,
                "client message failed flatbuffers verification (bad offsets, sizes, nesting "
                "deeper than " +
                    std::to_string(kMaxDepth) + " or more than " + std::to_string(kMaxTables) +
                    " tables)");
  return fb::client::GetClientMessage(bytes.data());
}

fb::Code to_fb_code(Errc code) {
  return static_cast<fb::Code>(static_cast<int>(code));
}

Errc from_fb_code(fb::Code code) {
  int c = static_cast<int>(code);
  if (c < static_cast<int>(Errc::ok) || c > static_cast<int>(Errc::internal)) return Errc::internal;
  return static_cast<Errc>(c);
}

fb::ServiceKind service_kind(ServiceId id) {
  switch (id) {
    case ServiceId::frontend:
      return fb::ServiceKind::Frontend;
    case ServiceId::gpu:
      return fb::ServiceKind::Gpu;
    case ServiceId::npu:
      return fb::ServiceKind::Npu;
    case ServiceId::solver:
      return fb::ServiceKind::Solver;
    case ServiceId::http:
      return fb::ServiceKind::Http;
  }
  throw Error(Errc::internal, "unknown service id");
}

Bytes finish_message(flatbuffers::FlatBufferBuilder& fbb, uint64_t request_id, fb::Body type,
                     flatbuffers::Offset<void> body) {
  fb::MessageBuilder mb(fbb);
  mb.add_request_id(request_id);
  mb.add_body_type(type);
  mb.add_body(body);
  fb::FinishMessageBuffer(fbb, mb.Finish());
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

Bytes make_hello(uint64_t request_id, fb::ServiceKind service, int pid, const std::string& stack_id,
                 uint64_t epoch) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fb::CreateHelloDirect(fbb, service, pid, stack_id.c_str(), epoch, "duet-0.1");
  return finish_message(fbb, request_id, body);
}

Bytes make_hello_ack(uint64_t request_id, fb::ServiceKind service, int pid, uint64_t epoch) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateHelloAck(fbb, service, pid, epoch));
}

Bytes make_heartbeat(uint64_t request_id, uint64_t seq) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateHeartbeat(fbb, seq));
}

Bytes make_heartbeat_ack(uint64_t request_id, uint64_t seq, fb::ServiceKind service, int pid,
                         uint64_t uptime_ms, const std::string& state) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fb::CreateHeartbeatAckDirect(fbb, seq, service, pid, uptime_ms, state.c_str());
  return finish_message(fbb, request_id, body);
}

Bytes make_status_request(uint64_t request_id) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateStatusRequest(fbb));
}

Bytes make_status_reply(uint64_t request_id, fb::ServiceKind service, const std::string& json) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateStatusReplyDirect(fbb, service, json.c_str()));
}

Bytes make_shutdown(uint64_t request_id) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateShutdown(fbb));
}

Bytes make_restart_service(uint64_t request_id, fb::ServiceKind service) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id, fb::CreateRestartService(fbb, service));
}

Bytes make_error_reply(uint64_t request_id, Errc code, const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fb::CreateErrorReplyDirect(fbb, to_fb_code(code), message.c_str());
  return finish_message(fbb, request_id, body);
}

Bytes make_client_error(uint64_t request_id, Errc code, const std::string& message) {
  flatbuffers::FlatBufferBuilder fbb;
  auto err =
      fb::client::CreateErrorDirect(fbb, request_id, static_cast<int>(code), message.c_str());
  fb::client::ClientMessageBuilder mb(fbb);
  mb.add_request_id(request_id);
  mb.add_body_type(fb::client::ClientBody::Error);
  mb.add_body(err.Union());
  fb::client::FinishClientMessageBuffer(fbb, mb.Finish());
  return Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

StepArgs step_args_of(const fb::RunStep& body) {
  if (!body.tokens() || !body.page_tables())
    throw Error(Errc::invalid_argument, "RunStep without the token table or page tables");
  StepArgs step{body.step_seq(),
                body.n_tokens(),
                body.n_seqs(),
                body.tokens()->offset(),
                body.page_tables()->offset(),
                body.page_tables()->cols()};
  step.first_op = body.first_op();
  step.preempt_flag = body.preempt_flag();
  step.preempt_token = body.preempt_token();
  step.epoch = body.epoch();
  return step;
}

Bytes make_step_failed(uint64_t request_id, const fb::RunStep& body, const Error& e) {
  flatbuffers::FlatBufferBuilder fbb;
  return finish_message(fbb, request_id,
                        fb::CreateStepFailedDirect(fbb, body.program_id(), body.step_seq(),
                                                   to_fb_code(e.code()), e.what()));
}

void throw_if_error(const fb::Message& m) {
  if (const auto* e = m.body_as_ErrorReply()) {
    std::string text = e->message() ? e->message()->str() : "(no message)";
    throw Error(from_fb_code(e->code()), text);
  }
}

zmq::socket_t bind_router(const std::string& socket_path) {
  zmq::socket_t s(context(), zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxMessageBytes));
  // A reply to a peer that vanished is dropped instead of blocking or raising.
  s.set(zmq::sockopt::router_mandatory, false);
  s.bind(ipc_endpoint(socket_path));
  if (chmod(socket_path.c_str(), 0600) != 0)
    throw Error(Errc::io, "cannot chmod 0600 '" + socket_path + "': " + std::strerror(errno));
  return s;
}

zmq::socket_t connect_dealer(const std::string& endpoint, bool queue_until_connected) {
  zmq::socket_t s(context(), zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::immediate, !queue_until_connected);
  s.set(zmq::sockopt::reconnect_ivl, 20);
  s.set(zmq::sockopt::reconnect_ivl_max, 200);
  s.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxMessageBytes));
  s.connect(endpoint);
  return s;
}

bool try_recv_envelope(zmq::socket_t& router, Envelope& out) {
  out.routing.clear();
  out.payload.clear();
  zmq::message_t frame;
  if (!router.recv(frame, zmq::recv_flags::dontwait)) return false;
  // Every frame but the last is routing (the peer identity, and a REQ's empty delimiter).
  while (frame.more()) {
    out.routing.push_back(std::move(frame));
    frame = zmq::message_t();
    if (!router.recv(frame, zmq::recv_flags::none)) break;  // parts of one message arrive together
  }
  const auto* p = static_cast<const uint8_t*>(frame.data());
  out.payload.assign(p, p + frame.size());
  return true;
}

void send_reply(zmq::socket_t& router, Envelope& envelope, std::span<const uint8_t> reply) {
  if (envelope.routing.empty()) return;  // nothing to route back to
  try {
    for (auto& r : envelope.routing) {
      zmq::message_t copy(r.data(), r.size());
      if (!router.send(copy, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    }
    zmq::message_t body(reply.data(), reply.size());
    (void)router.send(body, zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // A peer that disconnected mid-reply (EHOSTUNREACH) loses its reply; the loop goes on.
  }
}

RequestClient::RequestClient(std::string endpoint) : endpoint_(std::move(endpoint)) {
  reset_socket();
}

void RequestClient::reset_socket() {
  // Requests may be sent before the connection is up: they wait for it (the deadline bounds it).
  socket_ = std::make_unique<zmq::socket_t>(connect_dealer(endpoint_, true));
}

bool RequestClient::recv_until(std::chrono::steady_clock::time_point deadline, Bytes& out) {
  for (;;) {
    // Rounded up: poll may wake a fraction of a millisecond early.
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, left);
    if (!(item.revents & ZMQ_POLLIN)) continue;
    zmq::message_t frame;
    if (!socket_->recv(frame, zmq::recv_flags::dontwait)) continue;
    while (frame.more()) {  // keep the last frame of a multipart reply
      frame = zmq::message_t();
      if (!socket_->recv(frame, zmq::recv_flags::none)) break;
    }
    const auto* p = static_cast<const uint8_t*>(frame.data());
    out.assign(p, p + frame.size());
    return true;
  }
}

Reply RequestClient::call(const Build& build, std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  Bytes request = build(id);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  zmq::message_t m(request.data(), request.size());
  if (!socket_->send(m, zmq::send_flags::dontwait)) {
    reset_socket();
    throw Error(Errc::unavailable, "cannot queue a request to " + endpoint_);
  }
  Reply reply;
  for (;;) {
    if (!recv_until(deadline, reply.bytes)) {
      reset_socket();
      throw Error(Errc::timeout, "no reply from " + endpoint_ + " within " +
                                     std::to_string(timeout.count()) + " ms");
    }
    const fb::Message* msg = nullptr;
    try {
      msg = verify_control(reply.bytes);
    } catch (const Error& e) {
      throw Error(Errc::bad_format, "reply from " + endpoint_ + ": " + e.what());
    }
    if (msg->request_id() != id) continue;  // a late answer to an earlier request
    throw_if_error(*msg);
    return reply;
  }
}

Bytes RequestClient::call_raw(std::span<const uint8_t> bytes, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  zmq::message_t m(bytes.data(), bytes.size());
  if (!socket_->send(m, zmq::send_flags::dontwait)) {
    reset_socket();
    throw Error(Errc::unavailable, "cannot queue a request to " + endpoint_);
  }
  Bytes out;
  if (!recv_until(deadline, out)) {
    reset_socket();
    throw Error(Errc::timeout, "no reply from " + endpoint_ + " within " +
                                   std::to_string(timeout.count()) + " ms");
  }
  return out;
}

}  // namespace duet::msg
