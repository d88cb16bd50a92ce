#include "core/ipc/client.h"

#include <sys/stat.h>

#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>

#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/model/utf8.h"

namespace duet::client {

namespace fbc = fb::client;
using Clock = std::chrono::steady_clock;

Priority parse_priority(std::string_view name) {
  if (name == "reactive") return Priority::reactive;
  if (name == "proactive") return Priority::proactive;
  throw Error(Errc::invalid_argument,
              "unknown priority '" + std::string(name) + "' (reactive or proactive)");
}

std::string_view priority_name(Priority p) {
  return p == Priority::reactive ? "reactive" : "proactive";
}

nlohmann::json to_json(const Stats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"generated_tokens", s.generated_tokens},
          {"ttft_ms", s.ttft_ms},
          {"tpot_ms", s.tpot_ms},
          {"tokens_per_s", s.tpot_ms > 0 ? 1000.0 / s.tpot_ms : 0.0},
          {"queue_ms", s.queue_ms},
          {"modeled_ttft_ms", s.modeled_ttft_ms},
          {"modeled_tpot_ms", s.modeled_tpot_ms},
          {"flag_wait_ms", s.flag_wait_ms},
          {"kv_bytes_copied", s.kv_bytes_copied},
          {"restarts_seen", s.restarts_seen},
          {"plan", s.plan},
          {"executed_plan", s.executed_plan},
          {"modeled_plan", s.modeled_plan},
          {"finish_reason", s.finish_reason}};
}

std::string stack_endpoint(std::string_view stack_id, const std::string& run_dir) {
  validate_stack_id(stack_id);
  const std::string dir = run_dir.empty() ? default_run_dir(stack_id) : run_dir;
  const std::string path = client_socket_path(dir);
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw Error(Errc::unavailable, "stack '" + std::string(stack_id) + "' has no frontend socket " +
                                       path + " (is it up? `duet stack up --stack " +
                                       std::string(stack_id) + "`)");
  return ipc_endpoint(path);
}

namespace {

std::vector<int32_t> to_ids(const flatbuffers::Vector<int32_t>* v) {
  return v ? std::vector<int32_t>(v->begin(), v->end()) : std::vector<int32_t>{};
}

std::string to_str(const flatbuffers::String* s) {
  return s ? s->str() : std::string();
}

TokenProb to_token_prob(const fbc::TokenProb* p) {
  TokenProb t;
  if (!p) return t;
  t.id = p->id();
  t.logprob = p->logprob();
  if (p->bytes()) t.bytes.assign(p->bytes()->begin(), p->bytes()->end());
  return t;
}

std::vector<TokenLogprob> to_logprobs(
    const flatbuffers::Vector<flatbuffers::Offset<fbc::TokenLogprob>>* v) {
  std::vector<TokenLogprob> out;
  if (!v) return out;
  out.reserve(v->size());
  for (const fbc::TokenLogprob* l : *v) {
    TokenLogprob t;
    t.chosen = to_token_prob(l->chosen());
    if (l->top())
      for (const fbc::TokenProb* p : *l->top()) t.top.push_back(to_token_prob(p));
    out.push_back(std::move(t));
  }
  return out;
}

Event decode_event(const std::vector<uint8_t>& bytes) {
  const fbc::ClientMessage* m = msg::verify_client(bytes);
  Event e;
  e.request_id = m->request_id();
  switch (m->body_type()) {
    case fbc::ClientBody::TokenChunk: {
      const auto* c = m->body_as_TokenChunk();
      e.kind = Event::Kind::chunk;
      e.chunk = {e.request_id, to_ids(c->ids()), to_str(c->text()), to_logprobs(c->logprobs())};
      return e;
    }
    case fbc::ClientBody::Done: {
      const auto* d = m->body_as_Done();
      e.kind = Event::Kind::done;
      e.done.request_id = e.request_id;
      e.done.text = to_str(d->text());
      e.done.ids = to_ids(d->ids());
      e.done.logprobs = to_logprobs(d->logprobs());
      e.done.prompt_logprobs = to_logprobs(d->prompt_logprobs());
      if (const auto* s = d->stats()) {
        e.done.stats = {s->prompt_tokens(),
                        s->generated_tokens(),
                        s->ttft_ms(),
                        s->tpot_ms(),
                        s->queue_ms(),
                        s->modeled_ttft_ms(),
                        s->modeled_tpot_ms(),
                        s->flag_wait_ms(),
                        s->kv_bytes_copied(),
                        s->restarts_seen(),
                        to_str(s->plan()),
                        to_str(s->finish_reason()),
                        to_str(s->executed_plan()),
                        to_str(s->modeled_plan())};
      }
      return e;
    }
    case fbc::ClientBody::Error: {
      const auto* x = m->body_as_Error();
      e.kind = Event::Kind::error;
      if (x->request_id()) e.request_id = x->request_id();
      e.code = msg::from_fb_code(static_cast<fb::Code>(x->code()));
      e.message = to_str(x->message());
      return e;
    }
    case fbc::ClientBody::EvalReply: {
      const auto* r = m->body_as_EvalReply();
      e.kind = Event::Kind::eval;
      e.eval.n_tokens = r->n_tokens();
      e.eval.n_vocab = r->n_vocab();
      if (r->logits()) e.eval.logits.assign(r->logits()->begin(), r->logits()->end());
      if (e.eval.logits.size() != size_t(e.eval.n_tokens) * e.eval.n_vocab)
        throw Error(Errc::bad_format, "EvalReply carries " + std::to_string(e.eval.logits.size()) +
                                          " logits for " + std::to_string(e.eval.n_tokens) + " x " +
                                          std::to_string(e.eval.n_vocab));
      return e;
    }
    case fbc::ClientBody::StatusReply:
      e.kind = Event::Kind::status;
      e.json = to_str(m->body_as_StatusReply()->json());
      return e;
    case fbc::ClientBody::TraceReply:
      e.kind = Event::Kind::status;  // JSON, as status
      e.json = to_str(m->body_as_TraceReply()->json());
      return e;
    case fbc::ClientBody::WarmupReply:
      e.kind = Event::Kind::status;
      e.json = to_str(m->body_as_WarmupReply()->json());
      return e;
    case fbc::ClientBody::TokenizeReply: {
      const auto* r = m->body_as_TokenizeReply();
      e.kind = Event::Kind::tokenize;
      e.tokenize.ids = to_ids(r->ids());
      if (r->pieces())
        for (const auto* p : *r->pieces()) e.tokenize.pieces.push_back(to_str(p));
      return e;
    }
    case fbc::ClientBody::DetokenizeReply:
      e.kind = Event::Kind::detokenize;
      e.json = to_str(m->body_as_DetokenizeReply()->text());
      return e;
    default:
      throw Error(Errc::bad_format, std::string("the frontend sent an unexpected ") +
                                        fbc::EnumNameClientBody(m->body_type()));
  }
}

std::vector<uint8_t> finish(flatbuffers::FlatBufferBuilder& fbb, uint64_t id, fbc::ClientBody type,
                            flatbuffers::Offset<void> body) {
  fbb.Finish(fbc::CreateClientMessage(fbb, id, type, body), fbc::ClientMessageIdentifier());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

std::chrono::milliseconds left_until(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace

Client::Client(std::string endpoint) : endpoint_(std::move(endpoint)) {
  socket_ = std::make_unique<zmq::socket_t>(msg::context(), zmq::socket_type::dealer);
  socket_->set(zmq::sockopt::linger, 0);
  // A stable identity, so that a restarted frontend that adopted this client's requests finds
  // the connection again (16 random bytes; ZeroMQ reserves ids that start with a zero byte).
  std::random_device rd;
  std::string identity(16, '\0');
  for (char& ch : identity) ch = static_cast<char>(rd() & 0xFF);
  identity[0] = static_cast<char>(1 + (static_cast<unsigned char>(identity[0]) % 255));
  socket_->set(zmq::sockopt::routing_id, zmq::buffer(identity));
  // Its connect/disconnect events, read between frames (read_monitor): the frontend went away
  // and came back, so the requests in flight are resumed. Set up before connect so the first
  // connect is seen too.
  static std::atomic<uint64_t> monitors{0};
  const std::string monitor_addr =
      "inproc://duet-client-monitor-" + std::to_string(getpid()) + "-" + std::to_string(monitors++);
  if (zmq_socket_monitor(socket_->handle(), monitor_addr.c_str(),
                         ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw Error(Errc::internal,
                std::string("client: cannot monitor its socket: ") + zmq_strerror(zmq_errno()));
  monitor_ = std::make_unique<zmq::socket_t>(msg::context(), zmq::socket_type::pair);
  monitor_->set(zmq::sockopt::linger, 0);
  monitor_->connect(monitor_addr);
  // Requests sent before the connection is up wait in the pipe instead of failing (the option
  // must be set before connect: it decides whether the pipe exists before the peer answers).
  socket_->set(zmq::sockopt::immediate, false);
  socket_->set(zmq::sockopt::reconnect_ivl, 20);
  socket_->set(zmq::sockopt::reconnect_ivl_max, 200);
  socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(msg::kMaxMessageBytes));
  socket_->set(zmq::sockopt::sndtimeo, 2000);  // a send waits this long for room, then fails
  socket_->connect(endpoint_);
}

Client::~Client() {
  if (socket_) zmq_socket_monitor(socket_->handle(), nullptr, 0);
}

void Client::read_monitor() {
  for (;;) {
    zmq::message_t event;
    if (!monitor_->recv(event, zmq::recv_flags::dontwait)) return;
    uint16_t what = 0;
    if (event.size() >= sizeof what) std::memcpy(&what, event.data(), sizeof what);
    while (event.more()) {  // the endpoint frame
      event = zmq::message_t();
      if (!monitor_->recv(event, zmq::recv_flags::none)) break;
    }
    if (what == ZMQ_EVENT_DISCONNECTED) {
      if (!lost_since_) lost_since_ = Clock::now();
    } else if (what == ZMQ_EVENT_CONNECTED && lost_since_) {
      lost_since_.reset();
      ++reconnects_;
      resume_all();
    }
  }
}

void Client::resume_all() {
  for (auto& [id, f] : inflight_) {
    f.resuming = true;
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fbc::CreateResume(fbb, id, f.ids_received, f.text_bytes,
                                  f.model.empty() ? 0 : fbb.CreateString(f.model));
    send(finish(fbb, id, fbc::ClientBody::Resume, body.Union()));
    ++resumes_sent_;
  }
}

std::optional<Event> Client::track(Event e) {
  auto it = inflight_.find(e.request_id);
  if (it == inflight_.end()) return e;
  InFlight& f = it->second;
  switch (e.kind) {
    case Event::Kind::chunk:
      f.resuming = false;
      f.ids_received += static_cast<uint32_t>(e.chunk.ids.size());
      f.text_bytes += e.chunk.text.size();
      if (e.chunk.ids.empty() && e.chunk.text.empty()) return std::nullopt;  // a Resume's ack
      return e;
    case Event::Kind::error:
      if (f.resuming && e.code == Errc::unavailable) return std::nullopt;  // a KeepAlive's answer
      if (f.resuming && e.code == Errc::not_found && f.ids_received == 0 && f.text_bytes == 0) {
        // The restarted frontend never saw it, and nothing of it arrived: sending it again
        // repeats and loses nothing.
        f.resuming = false;
        send(f.generate);
        return std::nullopt;
      }
      inflight_.erase(it);
      return e;
    case Event::Kind::done:
      inflight_.erase(it);
      return e;
    default:
      return e;
  }
}

std::optional<Event> Client::expire_lost() {
  if (!lost_since_ || inflight_.empty() || Clock::now() - *lost_since_ < resume_timeout_)
    return std::nullopt;
  Event e;
  e.kind = Event::Kind::error;
  e.request_id = inflight_.begin()->first;
  e.code = Errc::unavailable;
  e.message = "request " + std::to_string(e.request_id) + ": the frontend at " + endpoint_ +
              " went away and no frontend came back within " +
              std::to_string(resume_timeout_.count()) + " ms to resume it";
  inflight_.erase(inflight_.begin());
  return e;
}

std::optional<Event> Client::receive(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    if (auto lost = expire_lost()) return lost;
    auto frame = recv_frame(left_until(deadline));
    if (!frame) return expire_lost();
    if (auto e = track(decode_event(*frame))) return e;
    if (Clock::now() >= deadline) return std::nullopt;
  }
}

void Client::send(const std::vector<uint8_t>& bytes) {
  zmq::message_t m(bytes.data(), bytes.size());
  if (!socket_->send(m, zmq::send_flags::none))
    throw Error(Errc::unavailable, "cannot send to the frontend at " + endpoint_ +
                                       " within 2 s (its queue is full or it is not accepting "
                                       "connections)");
}

std::optional<std::vector<uint8_t>> Client::recv_frame(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    zmq::pollitem_t items[2] = {{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0},
                                {static_cast<void*>(*monitor_), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, left_until(deadline));
    if (items[1].revents & ZMQ_POLLIN) read_monitor();
    const auto& item = items[0];
    if (item.revents & ZMQ_POLLIN) {
      zmq::message_t frame;
      if (socket_->recv(frame, zmq::recv_flags::dontwait)) {
        while (frame.more()) {  // keep the last frame of a multipart message
          frame = zmq::message_t();
          if (!socket_->recv(frame, zmq::recv_flags::none)) break;
        }
        const auto* p = static_cast<const uint8_t*>(frame.data());
        return std::vector<uint8_t>(p, p + frame.size());
      }
    }
    if (Clock::now() >= deadline) return std::nullopt;
  }
}

uint64_t Client::submit(const GenerateRequest& r) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto sampling = fbc::CreateSamplingParams(fbb, r.sampling.temperature, r.sampling.top_k,
                                            r.sampling.top_p, r.sampling.seed);
  std::vector<flatbuffers::Offset<flatbuffers::String>> stops;
  for (const auto& s : r.stop) stops.push_back(fbb.CreateString(s));
  std::vector<flatbuffers::Offset<fbc::ChatMessage>> messages;
  for (const auto& m : r.messages)
    messages.push_back(fbc::CreateChatMessageDirect(fbb, m.role.c_str(), m.content.c_str()));
  const bool text = r.prompt_ids.empty() && r.messages.empty();
  InFlight& f = inflight_[id];
  f.model = r.model.empty() ? model_ : r.model;
  auto body = fbc::CreateGenerateDirect(
      fbb, text ? r.prompt.c_str() : nullptr, r.prompt_ids.empty() ? nullptr : &r.prompt_ids,
      sampling, r.max_tokens, stops.empty() ? nullptr : &stops,
      static_cast<fbc::Priority>(r.priority), r.stream, r.plan.c_str(), r.session, r.heartbeat_ms,
      r.ignore_eos, messages.empty() ? nullptr : &messages,
      r.chat_template.empty() ? nullptr : r.chat_template.c_str(), r.parse_special,
      f.model.empty() ? nullptr : f.model.c_str(), r.logprobs, r.prompt_logprobs);
  f.generate = finish(fbb, id, fbc::ClientBody::Generate, body.Union());
  try {
    send(f.generate);
  } catch (...) {
    inflight_.erase(id);
    throw;
  }
  return id;
}

void Client::cancel(uint64_t request_id) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateCancel(fbb, request_id);
  send(finish(fbb, request_id, fbc::ClientBody::Cancel, body.Union()));
}

void Client::keep_alive(uint64_t request_id) {
  // While a Resume is unanswered: its answer must be the last word on the request (track()).
  if (auto it = inflight_.find(request_id); it != inflight_.end() && it->second.resuming) return;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateKeepAlive(fbb, request_id);
  send(finish(fbb, request_id, fbc::ClientBody::KeepAlive, body.Union()));
}

std::optional<Event> Client::next_event(std::chrono::milliseconds timeout) {
  if (!pending_.empty()) {
    Event e = std::move(pending_.front());
    pending_.pop_front();
    return e;
  }
  return receive(timeout);
}

Event Client::wait_for(uint64_t request_id, Clock::time_point deadline, const char* what) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    if (it->request_id == request_id) {
      Event e = std::move(*it);
      pending_.erase(it);
      return e;
    }
  for (;;) {
    std::optional<Event> e = receive(left_until(deadline));
    if (!e) {
      if (Clock::now() < deadline) continue;
      throw Error(Errc::timeout, std::string("no ") + what + " reply from the frontend at " +
                                     endpoint_ + " before the deadline");
    }
    if (e->request_id == request_id) return std::move(*e);
    pending_.push_back(std::move(*e));
  }
}

GenerateResult Client::generate(const GenerateRequest& request,
                                const std::function<bool(const Chunk&)>& on_chunk,
                                std::chrono::milliseconds timeout) {
  const uint64_t id = submit(request);
  const auto deadline = Clock::now() + timeout;
  const auto beat = std::chrono::milliseconds(std::max<uint32_t>(request.heartbeat_ms / 3, 1));
  auto next_beat = Clock::now() + beat;
  bool cancelled = false;
  for (;;) {
    if (Clock::now() >= deadline && !cancelled) {
      inflight_.erase(id);
      cancel(id);
      throw Error(Errc::timeout, "generate: no Done from the frontend at " + endpoint_ +
                                     " within " + std::to_string(timeout.count()) + " ms");
    }
    if (request.heartbeat_ms > 0 && Clock::now() >= next_beat) {
      keep_alive(id);
      next_beat = Clock::now() + beat;
    }
    const auto wait =
        std::min(left_until(deadline),
                 request.heartbeat_ms > 0 ? left_until(next_beat) : std::chrono::milliseconds(100));
    std::optional<Event> e;
    // Events of other requests of this client wait in pending_.
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (it->request_id == id) {
        e = std::move(*it);
        pending_.erase(it);
        break;
      }
    if (!e) {
      e = receive(std::max(wait, std::chrono::milliseconds(1)));
      if (!e) continue;
      if (e->request_id != id) {
        pending_.push_back(std::move(*e));
        continue;
      }
    }
    switch (e->kind) {
      case Event::Kind::chunk:
        if (on_chunk && !cancelled && !on_chunk(e->chunk)) {
          cancel(id);
          cancelled = true;
        }
        break;
      case Event::Kind::done:
        return std::move(e->done);
      case Event::Kind::error:
        throw Error(e->code, e->message);
      default:
        throw Error(Errc::bad_format, "generate: the frontend answered with something else");
    }
  }
}

nlohmann::json Client::trace(uint64_t number, std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateTrace(fbb, number, model_.empty() ? 0 : fbb.CreateString(model_));
  send(finish(fbb, id, fbc::ClientBody::Trace, body.Union()));
  return json_reply(id, timeout, "trace");
}

nlohmann::json Client::warmup(std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateWarmup(fbb, model_.empty() ? 0 : fbb.CreateString(model_));
  send(finish(fbb, id, fbc::ClientBody::Warmup, body.Union()));
  return json_reply(id, timeout, "warmup");
}

nlohmann::json Client::status(std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateStatus(fbb);
  send(finish(fbb, id, fbc::ClientBody::Status, body.Union()));
  return json_reply(id, timeout, "status");
}

nlohmann::json Client::json_reply(uint64_t id, std::chrono::milliseconds timeout,
                                  const char* what) {
  Event e = wait_for(id, Clock::now() + timeout, what);
  if (e.kind == Event::Kind::error) throw Error(e.code, e.message);
  if (e.kind != Event::Kind::status)
    throw Error(Errc::bad_format,
                std::string(what) + ": the frontend answered with something else");
  try {
    return nlohmann::json::parse(e.json);
  } catch (const nlohmann::json::exception& x) {
    throw Error(Errc::bad_format,
                std::string(what) + ": the frontend's JSON is malformed: " + x.what());
  }
}

EvalResult Client::eval(const std::vector<int32_t>& ids, const std::string& plan,
                        const std::string& model_path, std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateEvalDirect(fbb, &ids, plan.c_str(), model_path.c_str(),
                                    model_.empty() ? nullptr : model_.c_str());
  send(finish(fbb, id, fbc::ClientBody::Eval, body.Union()));
  Event e = wait_for(id, Clock::now() + timeout, "eval");
  if (e.kind == Event::Kind::error) throw Error(e.code, e.message);
  if (e.kind != Event::Kind::eval)
    throw Error(Errc::bad_format, "eval: the frontend answered with something else");
  return std::move(e.eval);
}

void Client::close_session(uint64_t session, std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateCloseSession(fbb, session, model_.empty() ? 0 : fbb.CreateString(model_));
  send(finish(fbb, id, fbc::ClientBody::CloseSession, body.Union()));
  Event e = wait_for(id, Clock::now() + timeout, "close-session");
  if (e.kind == Event::Kind::error) throw Error(e.code, e.message);
}

TokenizeResult Client::tokenize(const std::string& text, bool add_special, bool parse_special,
                                std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateTokenize(fbb, fbb.CreateString(text), add_special, parse_special,
                                  model_.empty() ? 0 : fbb.CreateString(model_));
  send(finish(fbb, id, fbc::ClientBody::Tokenize, body.Union()));
  Event e = wait_for(id, Clock::now() + timeout, "tokenize");
  if (e.kind == Event::Kind::error) throw Error(e.code, e.message);
  if (e.kind != Event::Kind::tokenize)
    throw Error(Errc::bad_format, "tokenize: the frontend answered with something else");
  return std::move(e.tokenize);
}

std::string Client::detokenize(const std::vector<int32_t>& ids, std::chrono::milliseconds timeout) {
  const uint64_t id = next_request_id_++;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateDetokenizeDirect(fbb, &ids, model_.empty() ? nullptr : model_.c_str());
  send(finish(fbb, id, fbc::ClientBody::Detokenize, body.Union()));
  Event e = wait_for(id, Clock::now() + timeout, "detokenize");
  if (e.kind == Event::Kind::error) throw Error(e.code, e.message);
  if (e.kind != Event::Kind::detokenize)
    throw Error(Errc::bad_format, "detokenize: the frontend answered with something else");
  return std::move(e.json);
}

std::optional<std::vector<uint8_t>> Client::call_raw(std::span<const uint8_t> bytes,
                                                     std::chrono::milliseconds timeout) {
  send(std::vector<uint8_t>(bytes.begin(), bytes.end()));
  return recv_frame(timeout);
}

int run_generate_on_stack(const StackGenerateArgs& args) {
  Client c(stack_endpoint(args.stack_id, args.run_dir));
  GenerateRequest req = args.request;
  req.stream = !args.json;
  const GenerateResult r = c.generate(
      req,
      [](const Chunk& chunk) {
        std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
        std::fflush(stdout);
        return true;
      },
      std::chrono::seconds(args.timeout_s));
  if (args.json) {
    nlohmann::json j = {{"text", r.text}, {"ids", r.ids}, {"stats", to_json(r.stats)}};
    if (args.request.logprobs >= 0) {
      auto prob = [](const TokenProb& p) {
        std::string text;
        utf8::decode_replacing_invalid(p.bytes, true, text);
        return nlohmann::json{{"id", p.id}, {"token", text}, {"logprob", p.logprob}};
      };
      nlohmann::json lps = nlohmann::json::array();
      for (const TokenLogprob& t : r.logprobs) {
        nlohmann::json e = prob(t.chosen);
        e["top"] = nlohmann::json::array();
        for (const TokenProb& p : t.top) e["top"].push_back(prob(p));
        lps.push_back(e);
      }
      j["logprobs"] = lps;  // of the last logprobs.size() ids
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("\n");
    std::fprintf(stderr,
                 "prompt: %u tokens, TTFT %.1f ms; generated: %u tokens, TPOT %.2f ms (%.1f "
                 "tok/s); queue %.1f ms; plan %s; finish %s\n",
                 r.stats.prompt_tokens, r.stats.ttft_ms, r.stats.generated_tokens, r.stats.tpot_ms,
                 r.stats.tpot_ms > 0 ? 1000.0 / r.stats.tpot_ms : 0.0, r.stats.queue_ms,
                 r.stats.plan.c_str(), r.stats.finish_reason.c_str());
    if (!r.stats.modeled_plan.empty())
      std::fprintf(stderr, "executed: %s; modelled on the SoC: %s, TTFT %.1f ms, TPOT %.2f ms\n",
                   r.stats.executed_plan.c_str(), r.stats.modeled_plan.c_str(),
                   r.stats.modeled_ttft_ms, r.stats.modeled_tpot_ms);
  }
  return 0;
}

int run_eval_on_stack(const StackEvalArgs& args) {
  static_assert(std::endian::native == std::endian::little,
                "logits files are little-endian float32");
  Client c(stack_endpoint(args.stack_id, args.run_dir));
  c.set_model(args.model_name);
  const auto start = Clock::now();
  const EvalResult r =
      c.eval(args.ids, args.plan, args.model_path, std::chrono::seconds(args.timeout_s));
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::ofstream out(args.logits_out, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(r.logits.data()),
            static_cast<std::streamsize>(r.logits.size() * sizeof(float)));
  out.close();
  if (!out) throw Error(Errc::io, args.logits_out + ": cannot write the logits file");
  std::fprintf(stderr, "eval: %u positions x %u logits -> %s (%.1f tok/s through the stack)\n",
               r.n_tokens, r.n_vocab, args.logits_out.c_str(), double(r.n_tokens) / seconds);
  return 0;
}

}  // namespace duet::client
