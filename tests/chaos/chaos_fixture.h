#pragma once
// A real stack for the chaos tests: `duet stack up` (supervisor + frontend, gpu_svc, npu_svc,
// solver_svc as processes), the supervisor's status for service pids, and a teardown that leaves
// no process, segment or run directory behind even when a test fails half way
// (tests/support/stack_support.h).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
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

// INSTANTIATE_TEST_SUITE_P's name of a case whose parameter is a plan: "npu-only" -> "npu_only"
// (a test name is [A-Za-z0-9_]).
inline std::string plan_case_name(const ::testing::TestParamInfo<const char*>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

// A fixed run (kLongPrompt, kFixedRunTokens past EOS) whose stream ran `at_mark` once a number
// of tokens had arrived (ChaosStack::run_with_mark).
struct MarkedRun {
  client::GenerateResult result;
  size_t received_at_mark = 0;              // tokens received when the mark ran
  std::optional<Clock::time_point> marked;  // when it ran; none: the run ended first
  std::vector<Clock::time_point> after;     // arrivals of the chunks that followed it

  // From the mark to the first chunk after the longest gap among the next 30 (0 without them):
  // chunks sampled before the mark may sit in the client's queue and arrive at once, so the
  // first token after a recovery is the one after the stall.
  double ms_to_resumed() const {
    if (!marked || after.empty()) return 0;
    double longest_gap_ms = -1, to_resumed_ms = 0;
    Clock::time_point previous = *marked;
    for (size_t i = 0; i < std::min<size_t>(after.size(), 30); ++i) {
      if (ms_between(previous, after[i]) > longest_gap_ms) {
        longest_gap_ms = ms_between(previous, after[i]);
        to_resumed_ms = ms_between(*marked, after[i]);
      }
      previous = after[i];
    }
    return to_resumed_ms;
  }
};

class ChaosStack : public test_support::StackFixture {
 protected:
  ChaosStack() : StackFixture("c_", 20) {}

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

  // The fixed run, streamed; `at_mark` runs (a kill, or nothing for a baseline) once
  // `mark_after` tokens have arrived.
  MarkedRun run_with_mark(size_t mark_after, const std::function<void()>& at_mark) {
    client::Client c(endpoint());
    client::GenerateRequest req;
    req.prompt = kLongPrompt;
    req.max_tokens = kFixedRunTokens;
    req.ignore_eos = true;
    MarkedRun run;
    size_t received = 0;
    run.result = c.generate(
        req,
        [&](const client::Chunk& chunk) {
          if (chunk.ids.empty()) return true;
          if (run.marked) run.after.push_back(Clock::now());
          received += chunk.ids.size();
          if (!run.marked && received >= mark_after) {
            at_mark();
            run.marked = Clock::now();
            run.received_at_mark = received;
          }
          return true;
        },
        60s);
    return run;
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
};

}  // namespace duet::chaos
