#pragma once
// Real child processes for the shm tests: fork(), run a function, _exit with its result.
// The child never returns into googletest; the parent reaps it with a deadline.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <thread>

#include "shm/segment.h"

namespace duet::shm::testing {

inline constexpr int kChildThrew = 120;

// Runs fn in a child process; its return value is the child's exit code.
inline pid_t fork_child(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int code = kChildThrew;
    try {
      code = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d threw: %s\n", getpid(), e.what());
    }
    _exit(code);
  }
  return pid;
}

struct ChildExit {
  bool exited = false;  // exited normally (code is valid)
  int code = -1;
  int signal = 0;          // killed by this signal
  bool timed_out = false;  // still running at the deadline (then killed)
};

// Reaps pid, waiting at most `timeout`; a child still running then is SIGKILLed.
inline ChildExit wait_child(pid_t pid,
                            std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  ChildExit out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0) return out;
    if (std::chrono::steady_clock::now() >= deadline) {
      out.timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFEXITED(status)) {
    out.exited = true;
    out.code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    out.signal = WTERMSIG(status);
  }
  return out;
}

// A stack id of its own per test process, its segments removed before and after each test.
inline std::string test_stack_id() {
  return "shmtest" + std::to_string(getpid());
}

}  // namespace duet::shm::testing

namespace duet::shm {
// What every real-process shm test uses, without a using-declaration in each file.
using testing::fork_child;
using testing::wait_child;
}  // namespace duet::shm
