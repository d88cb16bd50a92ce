#include "services/frontend/model_router.h"

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_models.h"

namespace duet::frontend {

namespace fbc = fb::client;

ModelRouter::ModelRouter(const std::string& run_dir) : socket_path_(client_socket_path(run_dir)) {
  make_private_dir(run_dir);
  socket_ = std::make_shared<zmq::socket_t>(msg::bind_router(socket_path_));
  // As a one-model frontend's: a send to a vanished client fails (EHOSTUNREACH), which is how a
  // disconnect mid-stream is noticed.
  socket_->set(zmq::sockopt::router_mandatory, true);
}

FrontendOptions ModelRouter::options_for(FrontendOptions options, const std::string& model_name) {
  options.model_name = model_name;
  options.shared_socket = socket_;
  options.dispatch = [this](msg::Envelope& env) { route(env); };
  return options;
}

void ModelRouter::add(std::unique_ptr<Frontend> frontend) {
  if (by_name(frontend->model_name()) && !frontends_.empty())
    throw Error(Errc::invalid_argument,
                "two models are named '" + frontend->model_name() + "' in one stack");
  frontends_.push_back(std::move(frontend));
  turns_ = ModelTurns(std::vector<int>(frontends_.size(), 0), turns_.aging_steps());
}

void ModelRouter::set_priorities(std::vector<int> ranks, int aging_steps) {
  if (ranks.size() != frontends_.size())
    throw Error(Errc::internal, "model router: " + std::to_string(ranks.size()) + " ranks for " +
                                    std::to_string(frontends_.size()) + " models");
  turns_ = ModelTurns(std::move(ranks), aging_steps);
}

bool ModelRouter::pump() {
  for (auto& f : frontends_) f->pump_io();
  std::vector<bool> ready(frontends_.size());
  for (size_t i = 0; i < frontends_.size(); ++i) ready[i] = frontends_[i]->has_work();
  // The chosen model steps; one whose work cannot run now (blocked on KV, say) steps nothing and
  // the next in the order gets the turn, so a blocked high-rank model holds no one up.
  std::vector<bool> untried = ready;
  for (int m = turns_.choose(untried); m >= 0; m = turns_.choose(untried)) {
    Frontend& f = *frontends_[static_cast<size_t>(m)];
    const uint64_t before = f.metrics().steps;
    f.step_once();
    if (f.metrics().steps != before) {
      turns_.record(static_cast<size_t>(m), ready);
      break;
    }
    untried[static_cast<size_t>(m)] = false;
  }
  return has_work();
}

void ModelRouter::pump_for(std::chrono::milliseconds budget) {
  const double end = now_ms() + double(budget.count());
  while (pump() && now_ms() < end) {
  }
}

bool ModelRouter::has_work() const {
  for (const auto& f : frontends_)
    if (f->has_work()) return true;
  return false;
}

uint64_t ModelRouter::steps() const {
  uint64_t n = 0;
  for (const auto& f : frontends_) n += f->metrics().steps;
  return n;
}

nlohmann::json ModelRouter::status() const {
  nlohmann::json s = frontends_.front()->status();
  if (frontends_.size() > 1) {
    nlohmann::json models = nlohmann::json::object();
    for (size_t i = 0; i < frontends_.size(); ++i) {
      models[frontends_[i]->model_name()] = frontends_[i]->status();
      models[frontends_[i]->model_name()]["turns"] = turns_.status(i);
    }
    s["models"] = std::move(models);
    s["model_priority_aging"] = turns_.aging_steps();
    s["unknown_model_refusals"] = unknown_model_refusals_;
  }
  s["default_model"] = frontends_.front()->model_name();
  return s;
}

Frontend* ModelRouter::by_name(std::string_view name) const {
  if (frontends_.empty()) return nullptr;
  if (name.empty()) return frontends_.front().get();
  for (const auto& f : frontends_)
    if (f->model_name() == name) return f.get();
  return nullptr;
}

Frontend* ModelRouter::holder_of(const std::vector<std::string>& routing, uint64_t id) const {
  for (const auto& f : frontends_)
    if (f->holds_request(routing, id)) return f.get();
  return nullptr;
}

std::string ModelRouter::names() const {
  std::string out;
  for (const auto& f : frontends_) out += (out.empty() ? "" : ", ") + f->model_name();
  return out;
}

void ModelRouter::route(msg::Envelope& env) {
  Frontend& fallback = *frontends_.front();
  const fbc::ClientMessage* m = nullptr;
  try {
    m = msg::verify_client(env.payload);
  } catch (const Error&) {
    fallback.handle(env);  // refuses it, as a one-model frontend does
    return;
  }
  std::vector<std::string> routing;
  for (auto& f : env.routing) routing.emplace_back(static_cast<const char*>(f.data()), f.size());
  const uint64_t id = m->request_id();
  // The model a message names; an unknown one is answered here.
  const flatbuffers::String* named = nullptr;
  Frontend* target = nullptr;
  switch (m->body_type()) {
    case fbc::ClientBody::Generate:
      named = m->body_as_Generate()->model();
      break;
    case fbc::ClientBody::Eval:
      named = m->body_as_Eval()->model();
      break;
    case fbc::ClientBody::Tokenize:
      named = m->body_as_Tokenize()->model();
      break;
    case fbc::ClientBody::Detokenize:
      named = m->body_as_Detokenize()->model();
      break;
    case fbc::ClientBody::Trace:
      named = m->body_as_Trace()->model();
      break;
    case fbc::ClientBody::Warmup:
      named = m->body_as_Warmup()->model();
      break;
    case fbc::ClientBody::Resume:
      named = m->body_as_Resume()->model();
      if (!named || named->size() == 0) {
        const uint64_t t = m->body_as_Resume()->request_id();
        target = holder_of(routing, t ? t : id);
      }
      break;
    case fbc::ClientBody::CloseSession:
      named = m->body_as_CloseSession()->model();
      if (!named || named->size() == 0)
        for (const auto& f : frontends_)
          if (f->holds_session(m->body_as_CloseSession()->session())) target = f.get();
      break;
    case fbc::ClientBody::Cancel: {
      const uint64_t t = m->body_as_Cancel()->request_id();
      target = holder_of(routing, t ? t : id);
      break;
    }
    case fbc::ClientBody::KeepAlive: {
      const uint64_t t = m->body_as_KeepAlive()->request_id();
      target = holder_of(routing, t ? t : id);
      break;
    }
    case fbc::ClientBody::Status:
      if (frontends_.size() > 1) {
        flatbuffers::FlatBufferBuilder fbb;
        auto body = fbc::CreateStatusReplyDirect(fbb, status().dump().c_str());
        fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::StatusReply, body.Union()),
                   fbc::ClientMessageIdentifier());
        msg::send_reply(*socket_, env,
                        std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
        return;
      }
      break;
    default:
      break;
  }
  if (named && named->size() > 0) {
    target = by_name(named->string_view());
    if (!target) {
      ++unknown_model_refusals_;
      const msg::Bytes error = msg::make_client_error(
          id, Errc::not_found, unknown_model_message(named->string_view(), names()));
      msg::send_reply(*socket_, env, error);
      return;
    }
  }
  (target ? *target : fallback).handle(env);
}

}  // namespace duet::frontend
