// The supervisor's view of its services: heartbeats over each service's control socket, the
// stack's state (healthy / starting / degraded), its status JSON and the control socket
// (status, restart, down). See supervisor_impl.h.
#include "deploy/supervisor/supervisor_impl.h"

#include "core/base/enum_names.h"

namespace duet::supervisor {

namespace {

// Each a NUL-terminated literal, so state_name's callers may take its data() as a C string.
constexpr std::string_view kChildStateNames[] = {"stopped",      "starting",   "healthy",
                                                 "unresponsive", "restarting", "failed"};
static_assert(std::size(kChildStateNames) == static_cast<size_t>(ChildState::failed) + 1,
              "a name for every ChildState, in order");

}  // namespace

const char* state_name(ChildState s) {
  return enum_name(kChildStateNames, s, "unknown").data();
}

void Supervisor::Impl::heartbeat(Child& c, uint64_t now) {
  if (!c.running()) return;
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

std::string Supervisor::Impl::stack_state() const {
  if (stopping) return "stopping";
  bool all_healthy = true, degraded = false;
  for (const auto& c : children) {
    all_healthy = all_healthy && c.state == ChildState::healthy;
    degraded = degraded || c.state == ChildState::failed || c.state == ChildState::unresponsive;
  }
  return degraded ? "degraded" : all_healthy ? "healthy" : "starting";
}

void Supervisor::Impl::update_stack_state() {
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
        why += (why.empty() ? "" : "; ") + c.name + " " + state_name(c.state) + " (" + c.last_exit +
               ", log " + log_path(opt.run_dir, c.name) + ")";
    notify_ready_fd(opt.ready_fd, "degraded: " + why);
  }
}

void Supervisor::Impl::on_tick() {
  const uint64_t now = monotonic_ms();
  for (auto& c : children) heartbeat(c, now);
  serve_control();
  update_stack_state();
}

nlohmann::json Supervisor::Impl::status_json() const {
  const uint64_t now = monotonic_ms();
  nlohmann::json services = nlohmann::json::array();
  for (const auto& c : children) {
    nlohmann::json s = {{"name", c.name},
                        {"pid", c.pid},
                        {"state", state_name(c.state)},
                        {"uptime_ms", c.running() ? now - c.started_ms : 0},
                        {"adopted", c.adopted},
                        {"restarts", c.restarts},
                        {"heartbeat_age_ms", nullptr},
                        {"last_exit", c.last_exit},
                        {"log", log_path(opt.run_dir, c.name)}};
    if (c.running() && c.last_ack_ms != 0) s["heartbeat_age_ms"] = now - c.last_ack_ms;
    services.push_back(std::move(s));
  }
  nlohmann::json takeover = nullptr;
  if (opt.adopt)
    takeover = {{"from_supervisor_pid", opt.adopt_from},
                {"adopted", adopted_names},
                {"restarted", restarted_names}};
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
          {"takeover", std::move(takeover)},
          {"services", std::move(services)}};
}

msg::Bytes Supervisor::Impl::answer(const msg::Bytes& payload, bool& shutdown_after) {
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
        if (stopping) return msg::make_error_reply(rid, Errc::unavailable, "the stack is stopping");
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

void Supervisor::Impl::serve_control() {
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

}  // namespace duet::supervisor
