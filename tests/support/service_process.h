#pragma once
// One device service process (gpu_svc, npu_svc), started the way the supervisor starts it and
// stopped (SIGTERM, then reaped) when it goes: for tests that drive services without a
// supervisor. Header-only: DUET_BINARY_DIR is defined per test executable.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace duet::test_support {

class ServiceProcess {
 public:
  // build/bin/<which>_svc of stack `stack` in `run_dir`; --model's directory is the only one
  // the service maps models from.
  ServiceProcess(const std::string& which, const std::string& stack, const std::string& run_dir,
                 const std::string& model) {
    const std::string exe = std::string(DUET_BINARY_DIR) + "/bin/" + which + "_svc";
    std::vector<std::string> args = {exe,       "--stack", stack,   "--run-dir", run_dir,
                                     "--model", model,     "--soc", "sd8gen3"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, exe.c_str(), nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~ServiceProcess() { stop(SIGTERM); }
  ServiceProcess(const ServiceProcess&) = delete;
  ServiceProcess& operator=(const ServiceProcess&) = delete;

  // Sends `sig` and reaps the process (a no-op once stopped).
  void stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // -1 when the spawn failed or after stop().
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

}  // namespace duet::test_support
