// solver_svc unreachable, through real processes (`duet stack up`: supervisor, frontend, gpu_svc,
// npu_svc, solver_svc): the frontend keeps serving with the gpu-only plan and its status says so;
// once the solver answers again the frontend re-plans and serves the solver's plans.
//
// "Down" is SIGSTOP: the process lives (the supervisor reports it unresponsive and does not
// restart it behind the test's back) but answers nothing, which is what a hung or overloaded
// solver looks like to the frontend. Every wait polls against a deadline; no fixed sleeps.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "shm/segment.h"
#include "tests/support/scoped_env.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test_support::CliResult;
using test_support::run_duet;

class SolverFallback : public test_support::StackFixture {
 protected:
  SolverFallback() : StackFixture("sfb_", 12) {}
  void TearDown() override {
    if (stopped_pid_ > 0) kill(stopped_pid_, SIGCONT);  // a stopped process ignores SIGTERM
    StackFixture::TearDown();
  }

  int service_pid(const std::string& name) {
    if (auto s = test_support::stack_status(run_dir_))
      for (const auto& svc : (*s)["services"])
        if (svc["name"] == name) return svc["pid"].get<int>();
    return 0;
  }

  client::GenerateResult generate(int max_tokens) {
    client::Client c(client::stack_endpoint(id_));
    client::GenerateRequest req;
    req.prompt = "Q: Why";
    req.max_tokens = max_tokens;
    return c.generate(req, {}, 120s);
  }

  // The main engine's status (plan_sources, solver_fallback, note).
  nlohmann::json engine_status() {
    client::Client c(client::stack_endpoint(id_));
    return c.status(10s).value("engine", nlohmann::json::object());
  }

  static bool all_sources_start_with(const nlohmann::json& engine, const std::string& prefix) {
    const nlohmann::json sources = engine.value("plan_sources", nlohmann::json::object());
    if (sources.empty()) return false;
    for (const auto& [bucket, source] : sources.items())
      if (source.get<std::string>().rfind(prefix, 0) != 0) return false;
    return true;
  }

  test_support::TempDir cache_{"duet-solver-fallback"};
  // The stack's solver_svc inherits it.
  test_support::ScopedEnv cache_dir_{"DUET_CACHE_DIR", cache_.path().c_str()};
  int stopped_pid_ = 0;
};

TEST_F(SolverFallback, ServesGpuOnlyWhileTheSolverIsDownAndItsPlansOnceItIsBack) {
  // Without the warm-up: the engine is built by the first request, after the solver stops.
  const CliResult up = run_duet("stack up --plan tensor --no-warmup --timeout 60 --stack " + id_);
  ASSERT_EQ(up.rc, 0) << up.out;
  const int solver = service_pid("solver_svc");
  ASSERT_GT(solver, 0);
  ASSERT_EQ(kill(solver, SIGSTOP), 0);
  stopped_pid_ = solver;

  // The first request builds the engine while the solver answers nothing: every bucket falls back
  // to gpu-only after the frontend's solver deadline, and the request is still served.
  const client::GenerateResult down_run = generate(6);
  EXPECT_EQ(down_run.stats.generated_tokens, 6u);
  const nlohmann::json down = engine_status();
  EXPECT_TRUE(down.value("solver_fallback", false)) << down.dump();
  EXPECT_NE(down.value("note", "").find("solver_svc was unreachable"), std::string::npos)
      << down.dump();
  EXPECT_TRUE(all_sources_start_with(down, "gpu-only fallback")) << down.dump();

  // Solver back: requests keep coming; once the fallback engine is idle and old enough the
  // frontend asks again and serves the solver's plans.
  ASSERT_EQ(kill(solver, SIGCONT), 0);
  stopped_pid_ = 0;
  const auto deadline = Clock::now() + 90s;
  nlohmann::json back;
  bool replanned = false;
  int served = 0;
  while (!replanned && Clock::now() < deadline) {
    const client::GenerateResult r = generate(2);
    EXPECT_EQ(r.stats.generated_tokens, 2u);
    ++served;
    back = engine_status();
    replanned = !back.value("solver_fallback", true) && all_sources_start_with(back, "solver_svc");
    if (!replanned) std::this_thread::sleep_for(100ms);  // poll interval, not a wait for an event
  }
  EXPECT_TRUE(replanned) << "after " << served << " requests: " << back.dump();
  EXPECT_EQ(back.value("note", ""), "") << back.dump();
  EXPECT_EQ(service_pid("solver_svc"), solver) << "the solver came back, it was not replaced";
}

}  // namespace
}  // namespace duet
