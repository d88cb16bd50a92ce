#include "services/frontend/async_step.h"

#include "core/base/error.h"

namespace duet::frontend {

AsyncStep::AsyncStep() : wake_("async step") {}

AsyncStep::~AsyncStep() {
  if (future_.valid()) future_.wait();
}

void AsyncStep::start(Engine& engine, std::vector<SeqStep> batch, bool resuming) {
  if (future_.valid()) throw Error(Errc::invalid_argument, "async step: a step is running");
  wake_.drain();
  stats_ = StepStats{};
  future_ = std::async(std::launch::async, [this, &engine, batch = std::move(batch), resuming] {
    const WakeFd::SignalOnExit signal = wake_.signal_on_exit();
    return resuming ? engine.resume(&stats_) : engine.step_preemptible(batch, &stats_);
  });
}

bool AsyncStep::done() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void AsyncStep::wait(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  if (!future_.valid() || done()) return;
  zmq::pollitem_t items[2] = {{nullptr, wake_.fd(), ZMQ_POLLIN, 0},
                              {static_cast<void*>(socket), 0, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, 2, timeout);
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw;
  }
}

AsyncStep::Result AsyncStep::collect(StepStats* stats) {
  if (!future_.valid()) throw Error(Errc::invalid_argument, "async step: no step is running");
  Result r;
  try {
    r = future_.get();  // future_ is invalid from here, whatever it holds
  } catch (...) {
    if (stats) *stats = stats_;
    throw;
  }
  if (stats) *stats = stats_;
  return r;
}

}  // namespace duet::frontend
