#pragma once
// A shell command run from a test: its exit status and everything it printed to stdout (a
// command that wants stderr too says 2>&1). Header-only.
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace duet::test_support {

struct CliResult {
  int rc;           // the exit status; 128 + the signal when a signal ended it; -1: no shell
  std::string out;  // stdout
};

inline CliResult run_shell(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

}  // namespace duet::test_support
