#pragma once
// Runs a function when an OpenCL event completes, noticed by polling from a thread of its own.
// On a discrete GPU the runner publishes a cross-device flag this way instead of through
// clSetEventCallback: NVIDIA's completion callbacks came milliseconds late on the H100, and the
// NPU waited for them (bench/gpu/RESULTS.md, 2026-11-28). The thread sleeps while nothing is
// watched; a destroyed poller first finishes what it watches (each event completes or fails).
#include <CL/cl.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace duet::gpu {

class EventPoller {
 public:
  EventPoller();
  ~EventPoller();
  EventPoller(const EventPoller&) = delete;
  EventPoller& operator=(const EventPoller&) = delete;

  // Calls done(status) from the poller's thread once `e` is CL_COMPLETE (status CL_COMPLETE) or
  // has failed (its negative status). Retains e for as long as it waits.
  void watch(cl_event e, std::function<void(cl_int status)> done);

 private:
  struct Watched {
    cl_event event;
    std::function<void(cl_int)> done;
    cl_int status;  // CL_COMPLETE or the failure, once finished
  };
  void run();

  std::mutex m_;
  std::condition_variable cv_;
  std::vector<Watched> watched_;  // guarded by m_
  bool stop_ = false;             // guarded by m_
  std::thread thread_;
};

}  // namespace duet::gpu
