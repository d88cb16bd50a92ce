#pragma once
// Runs one engine step on a worker thread while the serving thread keeps reading the client
// socket (Agent.xpu, issue 9): that is how a reactive request arriving during a long proactive
// step is noticed while the step runs, and preempts it at the next op boundary. The ZeroMQ socket
// stays on the serving thread; the worker only runs the engine step.
#include <deque>
#include <functional>
#include <optional>
#include <vector>
#include <zmq.hpp>

#include "core/ipc/messaging.h"
#include "services/frontend/wake_fd.h"

namespace duet::frontend {

class StepWatch {
 public:
  using Work = std::function<std::optional<std::vector<float>>()>;
  StepWatch();
  StepWatch(const StepWatch&) = delete;
  StepWatch& operator=(const StepWatch&) = delete;

  // Runs `work` on a worker thread and, until it returns, moves the messages arriving on `socket`
  // into `held` (at most max_held; later ones wait in the socket) after showing each to
  // `on_message`. Returns what `work` returned, or rethrows what it threw. The wait ends when
  // work does (the engine's step deadline bounds it).
  std::optional<std::vector<float>> run(
      const Work& work, zmq::socket_t& socket, std::deque<msg::Envelope>& held, size_t max_held,
      const std::function<void(const msg::Envelope&)>& on_message);

 private:
  WakeFd wake_;  // the worker signals it when the step is over
};

}  // namespace duet::frontend
