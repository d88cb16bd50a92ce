#pragma once
// A real stack for the chaos tests: `duet stack up` (supervisor + frontend, gpu_svc, npu_svc,
// solver_svc as processes), the supervisor's status for service pids, and a teardown that leaves
// no process, segment or run directory behind even when a test fails half way
// (tests/support/stack_support.h).
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
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/ipc/client.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "shm/segment.h"
#include "tests/support/stack_support.h"

namespace duet::chaos {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test_support::CliResult;
using test_support::run_duet;

// A prompt the tiny model answers at length (84 greedy tokens before EOS).
inline const std::string kLongPrompt = "Q: Why";
// The greedy run: 200 tokens, past EOS (Generate.ignore_eos).
constexpr int kFixedRunTokens = 200;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

class ChaosStack : public ::testing::Test {
 protected:
  void SetUp() override {
    id_ = test_support::unique_stack_id("c_", 20);
    run_dir_ = default_run_dir(id_);
  }

  void TearDown() override { test_support::tear_down_stack(id_, run_dir_); }

  // `extra`: more `stack up` flags (the chaos run's --http PORT).
  void up(const std::string& plan = "", const std::string& extra = "") {
    CliResult r = run_duet("stack up --stack " + id_ + (plan.empty() ? "" : " --plan " + plan) +
                           (extra.empty() ? "" : " " + extra));
    ASSERT_EQ(r.rc, 0) << r.out;
  }

  // Down must leave nothing: no process of the stack, no segment, no socket or run directory.
  void down_and_expect_nothing_left() {
    const std::vector<int> pids = test_support::stack_pids(run_dir_);
    CliResult r = run_duet("stack down --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(shm::list_stack_segments(id_).empty());
    EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "sockets, logs or the pid file remain";
    for (int pid : pids) EXPECT_FALSE(pid > 0 && process_alive(pid)) << "pid " << pid;
  }

  std::optional<nlohmann::json> try_status() { return test_support::stack_status(run_dir_); }

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

  client::GenerateResult generate(const std::string& prompt, int max_tokens = 200,
                                  bool ignore_eos = false) {
    client::Client c(endpoint());
    client::GenerateRequest req;
    req.prompt = prompt;
    req.max_tokens = max_tokens;
    req.ignore_eos = ignore_eos;
    return c.generate(req, {}, 60s);
  }

  // The frontend's engine holds no sequence and every KV page is free again.
  void expect_no_kv_held() {
    client::Client c(endpoint());
    const nlohmann::json s = c.status();
    const nlohmann::json& e = s["engine"];
    ASSERT_TRUE(e.contains("kv_pages_total")) << s.dump();
    EXPECT_EQ(e["open_sequences"], 0) << e.dump();
    EXPECT_EQ(e["kv_pages_free"], e["kv_pages_total"]) << "KV pages leaked: " << e.dump();
    EXPECT_TRUE(s["running"].empty()) << s.dump();
  }

  std::set<std::string> segments() {
    const std::vector<std::string> v = shm::list_stack_segments(id_);
    return {v.begin(), v.end()};
  }

  std::string id_;
  std::string run_dir_;
};

}  // namespace duet::chaos
