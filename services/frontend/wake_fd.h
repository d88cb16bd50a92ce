#pragma once
// An eventfd that a worker thread signals when its engine step ends, so that the serving thread,
// polling it beside the client socket, wakes at once instead of on a timer (StepWatch,
// AsyncStep). The object owns the descriptor.
#include <cstdint>

namespace duet::frontend {

class WakeFd {
 public:
  // Throws Error(internal) naming `owner` when the eventfd cannot be made.
  explicit WakeFd(const char* owner);
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fd() const { return fd_; }
  // Clears a signal: the next poll waits for the next one.
  void drain() const;

  // Signals the descriptor when it goes out of scope: however the worker's step ends, returned
  // or thrown, the serving thread wakes.
  struct SignalOnExit {
    int fd;
    ~SignalOnExit();
  };
  SignalOnExit signal_on_exit() const { return {fd_}; }

 private:
  int fd_ = -1;
};

}  // namespace duet::frontend
