#pragma once
// Several models in one stack (issue 25): one client socket (<run-dir>/frontend.sock), one
// Frontend per model behind it, each with its own engines (programs and weights in gpu_svc and
// npu_svc, told apart by the engine instance), its own KV pool (its share of the stack's budget,
// core/model/kv_budget.h plan_kv_pools), scheduler, sessions, metrics and request journal. The
// router reads nothing itself: whichever model's frontend reads a message hands it here
// (FrontendOptions::dispatch) and the router gives it to the model it names:
//   Generate, Eval, Tokenize, Detokenize  by their `model` ("" = the first model, the default);
//                                         an unknown name gets Error(not_found) naming it and the
//                                         served models, and nothing else changes
//   Cancel, KeepAlive                     the model holding the request (client id, request id)
//   Resume, CloseSession                  their `model`, else the model holding the request or
//                                         session (older clients send none)
//   Status                                the default model's status (as a one-model stack's),
//                                         plus "models": every model's status by name
//   anything else (Trace, malformed)      the default model, which answers as before
// pump() runs each model's frontend once in turn (at most one step each), so requests of
// different models interleave step by step on the shared devices.
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/ipc/messaging.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

class ModelRouter {
 public:
  // Binds the client socket (0600) at client_socket_path(run_dir).
  explicit ModelRouter(const std::string& run_dir);
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  // What each model's Frontend is built with: the router's socket and dispatch, and its name.
  FrontendOptions options_for(FrontendOptions options, const std::string& model_name);
  // The models in order; the first added is the default.
  void add(std::unique_ptr<Frontend> frontend);

  bool pump();  // every model's frontend once; true while any has work
  void pump_for(std::chrono::milliseconds budget);
  bool has_work() const;
  uint64_t steps() const;  // over every model
  nlohmann::json status() const;
  zmq::socket_t& socket() { return *socket_; }
  const std::string& socket_path() const { return socket_path_; }
  size_t size() const { return frontends_.size(); }
  Frontend& model(size_t i) { return *frontends_.at(i); }

  // Hands one message to the model it is for (see above).
  void route(msg::Envelope& env);

 private:
  Frontend* by_name(std::string_view name) const;  // "" = the default; nullptr: unknown
  Frontend* holder_of(const std::vector<std::string>& routing, uint64_t id) const;
  std::string names() const;

  std::string socket_path_;
  std::shared_ptr<zmq::socket_t> socket_;
  std::vector<std::unique_ptr<Frontend>> frontends_;
  uint64_t unknown_model_refusals_ = 0;
};

}  // namespace duet::frontend
