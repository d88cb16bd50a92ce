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
//   Trace                                 its `model`, as Generate's (`duet trace --model-name`)
//   anything else (malformed)             the default model, which answers as before
// The models' steps meet here: pump() reads, reaps and flushes every model, then runs ONE engine
// step, of the model model_turns.h picks among those with work: by rank (DUET_MODEL_PRIORITIES,
// 0 first; equal ranks take turns), aged so that no model waits more than a bounded number of
// steps. gpu_svc and npu_svc run the steps in the order they are rung, so this is the order on
// the shared devices.
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/ipc/messaging.h"
#include "services/frontend/frontend.h"
#include "services/frontend/model_turns.h"

namespace duet::frontend {

class ModelRouter {
 public:
  // Binds the client socket (0600) at client_socket_path(run_dir).
  explicit ModelRouter(const std::string& run_dir);
  ModelRouter(const ModelRouter&) = delete;
  ModelRouter& operator=(const ModelRouter&) = delete;

  // What each model's Frontend is built with: the router's socket and dispatch, and its name.
  FrontendOptions options_for(FrontendOptions options, const std::string& model_name);
  // The models in order; the first added is the default. Each starts at rank 0.
  void add(std::unique_ptr<Frontend> frontend);
  // Every model's rank, in the order added (0 steps first), and the aging (model_turns.h).
  void set_priorities(std::vector<int> ranks, int aging_steps);

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
  ModelTurns turns_{{}, kDefaultAgingSteps};
  static constexpr int kDefaultAgingSteps = 8;  // DUET_MODEL_PRIORITY_AGING's default
  uint64_t unknown_model_refusals_ = 0;
};

}  // namespace duet::frontend
