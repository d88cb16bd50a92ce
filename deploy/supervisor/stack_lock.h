#pragma once
// One supervisor per stack id: an flock'ed pid file in the run dir. While a supervisor lives the
// lock is held, so a second `up` fails with the holder's pid; when it died without cleaning up
// (kill -9) the lock is free and the new supervisor either adopts its services that still run
// (core/ipc/stack_record.h) or, when none does, reclaims what it left: sockets and
// /dev/shm/duet-<stack>-* segments.
#include <string>

namespace duet::supervisor {

class StackLock {
 public:
  // Creates the run dir (0700) and takes the lock. Throws Error(busy) naming the live supervisor's
  // pid when another holds it.
  StackLock(std::string stack_id, std::string run_dir);
  ~StackLock();  // releases the lock (does not remove anything)
  StackLock(const StackLock&) = delete;
  StackLock& operator=(const StackLock&) = delete;

  // What a dead predecessor left: its pid (0 if none) and how many segments and sockets went.
  int stale_pid() const { return stale_pid_; }
  int reclaimed_segments() const { return reclaimed_segments_; }
  int reclaimed_sockets() const { return reclaimed_sockets_; }

  // Removes every segment and socket of the stack (a dead predecessor's, none of them adopted).
  void reclaim();

  // Removes the run dir and everything in it, the pid file last, still holding the lock.
  void remove_run_dir();

 private:
  std::string stack_id_;
  std::string run_dir_;
  std::string pid_path_;
  int fd_ = -1;
  int stale_pid_ = 0;
  int reclaimed_segments_ = 0;
  int reclaimed_sockets_ = 0;
};

// The pid recorded in a stack's pid file, or 0 when there is none.
int read_supervisor_pid(const std::string& run_dir);

}  // namespace duet::supervisor
