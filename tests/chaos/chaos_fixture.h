#pragma once
// A real stack for the chaos tests: `duet stack up` (supervisor + frontend, gpu_svc, npu_svc,
// solver_svc as processes), the supervisor's status for service pids, and a teardown that leaves
// no process, segment or run directory behind even when a test fails half way.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/client.h"
#include "core/messaging.h"
#include "core/run_dir.h"
#include "shm/segment.h"

namespace duet::chaos {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct CliResult {
  int rc;
  std::string out;  // stdout and stderr
};

inline CliResult run_duet(const std::string& args) {
  std::string cmd = "'" DUET_BINARY_DIR "/bin/duet' " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

// A prompt the tiny model answers at length (84 greedy tokens before EOS).
inline const std::string kLongPrompt = "Q: Why";

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class ChaosStack : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();
    for (char& c : name)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    id_ = "c_" + name.substr(0, 20) + "_" + std::to_string(getpid() % 100000);
    run_dir_ = default_run_dir(id_);
  }

  void TearDown() override {
    std::vector<int> pids;
    if (auto s = try_status()) {
      pids.push_back((*s)["pid"].get<int>());
      for (const auto& svc : (*s)["services"]) pids.push_back(svc["pid"].get<int>());
    }
    if (std::filesystem::exists(run_dir_)) run_duet("stack down --stack " + id_);
    for (int pid : pids)
      if (pid > 0 && process_alive(pid)) kill(pid, SIGKILL);
    shm::remove_stack_segments(id_);
    std::filesystem::remove_all(run_dir_);
  }

  void up(const std::string& plan = "") {
    CliResult r = run_duet("stack up --stack " + id_ + (plan.empty() ? "" : " --plan " + plan));
    ASSERT_EQ(r.rc, 0) << r.out;
  }

  // Down must leave nothing: no process of the stack, no segment, no socket or run directory.
  void down_and_expect_nothing_left() {
    std::vector<int> pids;
    if (auto s = try_status()) {
      pids.push_back((*s)["pid"].get<int>());
      for (const auto& svc : (*s)["services"]) pids.push_back(svc["pid"].get<int>());
    }
    CliResult r = run_duet("stack down --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(shm::list_stack_segments(id_).empty());
    EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "sockets, logs or the pid file remain";
    for (int pid : pids) EXPECT_FALSE(pid > 0 && process_alive(pid)) << "pid " << pid;
  }

  std::optional<nlohmann::json> try_status() {
    const std::string sock = supervisor_socket_path(run_dir_);
    if (!std::filesystem::exists(sock)) return std::nullopt;
    try {
      msg::RequestClient c(ipc_endpoint(sock));
      auto r = c.call([](uint64_t id) { return msg::make_status_request(id); }, 2000ms);
      return nlohmann::json::parse(r.message().body_as_StatusReply()->json()->str());
    } catch (const Error&) {
      return std::nullopt;
    }
  }

  // The pid of a service and whether the supervisor calls it healthy (0 when unknown).
  std::pair<int, bool> service_state(const std::string& name) {
    auto s = try_status();
    if (!s) return {0, false};
    for (const auto& svc : (*s)["services"])
      if (svc["name"] == name) return {svc["pid"].get<int>(), svc["state"] == "healthy"};
    return {0, false};
  }

  // Waits until every service is healthy, none with a pid in `dead`; false at the deadline.
  bool wait_all_healthy(const std::vector<int>& dead, std::chrono::milliseconds limit = 15s) {
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      bool ok = true;
      if (auto s = try_status()) {
        for (const auto& svc : (*s)["services"]) {
          const int pid = svc["pid"].get<int>();
          if (svc["state"] != "healthy" || std::find(dead.begin(), dead.end(), pid) != dead.end())
            ok = false;
        }
      } else {
        ok = false;
      }
      if (ok) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  std::string endpoint() { return client::stack_endpoint(id_); }

  client::GenerateResult generate(const std::string& prompt, int max_tokens = 200) {
    client::Client c(endpoint());
    client::GenerateRequest req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    return c.generate(req, {}, 60s);
  }

  std::string id_;
  std::string run_dir_;
};

}  // namespace duet::chaos
