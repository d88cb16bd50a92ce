#include "services/frontend/async_step.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace duet::frontend {

AsyncStep::AsyncStep() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0)
    throw Error(Errc::internal, std::string("async step: eventfd: ") + std::strerror(errno));
}

AsyncStep::~AsyncStep() {
  if (future_.valid()) future_.wait();
  if (fd_ >= 0) close(fd_);
}

void AsyncStep::start(Engine& engine, std::vector<SeqStep> batch, bool resuming) {
  if (future_.valid()) throw Error(Errc::invalid_argument, "async step: a step is running");
  uint64_t drained = 0;
  (void)!read(fd_, &drained, sizeof drained);
  stats_ = StepStats{};
  future_ = std::async(std::launch::async, [this, &engine, batch = std::move(batch), resuming] {
    // Signalled however the step ends, so a waiting serving thread wakes at once.
    struct Signal {
      int fd;
      ~Signal() {
        const uint64_t one = 1;
        (void)!write(fd, &one, sizeof one);
      }
    } signal{fd_};
    return resuming ? engine.resume(&stats_) : engine.step_preemptible(batch, &stats_);
  });
}

bool AsyncStep::done() const {
  return future_.valid() && future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

void AsyncStep::wait(zmq::socket_t& socket, std::chrono::milliseconds timeout) {
  if (!future_.valid() || done()) return;
  zmq::pollitem_t items[2] = {{nullptr, fd_, ZMQ_POLLIN, 0},
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
