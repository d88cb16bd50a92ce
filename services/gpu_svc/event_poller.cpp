#include "services/gpu_svc/event_poller.h"

namespace duet::gpu {

EventPoller::EventPoller() : thread_([this] { run(); }) {}

EventPoller::~EventPoller() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void EventPoller::watch(cl_event e, std::function<void(cl_int)> done) {
  clRetainEvent(e);
  {
    std::lock_guard lock(m_);
    watched_.push_back({e, std::move(done), CL_QUEUED});
  }
  cv_.notify_all();
}

void EventPoller::run() {
  std::vector<Watched> finished;
  std::unique_lock lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !watched_.empty(); });
    if (watched_.empty()) return;  // stopping, nothing left to finish
    for (size_t i = 0; i < watched_.size();) {
      cl_int status = CL_QUEUED;
      if (clGetEventInfo(watched_[i].event, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status,
                         &status, nullptr) != CL_SUCCESS)
        status = CL_INVALID_EVENT;  // reported to done as a failure
      if (status == CL_COMPLETE || status < 0) {
        watched_[i].status = status;
        finished.push_back(std::move(watched_[i]));
        watched_[i] = std::move(watched_.back());
        watched_.pop_back();
      } else {
        ++i;
      }
    }
    // Outside the lock: a done function may take its time, and the runner may watch more.
    lock.unlock();
    for (Watched& w : finished) {
      w.done(w.status);
      clReleaseEvent(w.event);
    }
    finished.clear();
    std::this_thread::yield();
    lock.lock();
  }
}

}  // namespace duet::gpu
