#pragma once
// One engine step running on a worker thread while the serving thread goes on (Agent.xpu
// overlap, issue 9: a proactive prefill step on the proactive engine beside the main engine's
// steps). The serving thread starts it, keeps serving, and collects it when it is over; when it
// has nothing else to do it waits for either the step or a client message, never spinning (the
// devices need the host's cores).
#include <future>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "services/frontend/engine.h"
#include "services/frontend/wake_fd.h"

namespace duet::frontend {

class AsyncStep {
 public:
  using Result = std::optional<std::vector<float>>;  // nullopt: preempted (parked)
  AsyncStep();
  ~AsyncStep();  // waits for a running step (the engine outlives this object)
  AsyncStep(const AsyncStep&) = delete;
  AsyncStep& operator=(const AsyncStep&) = delete;

  // Starts engine.step_preemptible(batch) (or engine.resume() when resuming) on a worker.
  // invalid_argument when a step is already running.
  void start(Engine& engine, std::vector<SeqStep> batch, bool resuming);
  bool running() const { return future_.valid(); }
  bool done() const;
  // Waits until the step is over or a message is readable on `socket`, at most `timeout`.
  void wait(zmq::socket_t& socket, std::chrono::milliseconds timeout);
  // The step's result and stats once done() (blocks until then); rethrows what it threw.
  Result collect(StepStats* stats);

 private:
  WakeFd wake_;  // the worker signals it when the step is over
  std::future<Result> future_;
  StepStats stats_;
};

}  // namespace duet::frontend
