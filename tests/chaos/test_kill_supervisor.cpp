// kill -9 of the supervisor mid-generation (issue 22): its services keep running, so the request
// goes on; a device killed while no supervisor runs stays down until the next `duet stack up`
// adopts the stack and restarts it, and the request still completes with the undisturbed tokens.
// Kill-to-next-token of a supervisor kill alone (it is in no request's path) for bench/chaos.
#include <functional>

#include "chaos_fixture.h"

namespace duet::chaos {
namespace {

using SupervisorKill = ChaosStack;

TEST_F(SupervisorKill, ARequestOutlivesItsSupervisorAndADeviceKilledWhileNoneRuns) {
  constexpr size_t kKillAfterTokens = kFixedRunTokens / 2;
  up();
  const client::GenerateResult clean = generate(kLongPrompt, kFixedRunTokens, true);
  ASSERT_EQ(clean.ids.size(), size_t(kFixedRunTokens));
  const std::set<std::string> segments_before = segments();
  const nlohmann::json s = *try_status();
  const int supervisor_pid = s["pid"];
  const int gpu_pid = service_state("gpu_svc").first;
  ASSERT_GT(gpu_pid, 0);

  std::thread adopter;
  CliResult adoption;
  const MarkedRun run = run_with_mark(kKillAfterTokens, [&] {
    // Both kills between two tokens; the next `up` comes 500 ms later, from another thread, as
    // an operator's (or a unit's) restart would.
    EXPECT_EQ(kill(supervisor_pid, SIGKILL), 0);
    while (process_alive(supervisor_pid)) std::this_thread::sleep_for(1ms);
    EXPECT_EQ(kill(gpu_pid, SIGKILL), 0);
    adopter = std::thread([&] {
      std::this_thread::sleep_for(500ms);
      adoption = run_duet("stack up --stack " + id_);
    });
  });
  const client::GenerateResult& r = run.result;
  if (adopter.joinable()) adopter.join();
  ASSERT_TRUE(run.marked.has_value()) << "generation ended before the kill";
  ASSERT_LT(run.received_at_mark, size_t(kFixedRunTokens)) << "the kill came after the last token";
  EXPECT_EQ(r.ids, clean.ids) << "tokens differ after the supervisor and gpu_svc died";
  EXPECT_EQ(r.stats.finish_reason, "length");
  ASSERT_EQ(adoption.rc, 0) << adoption.out;
  EXPECT_NE(adoption.out.find("adopted 3 running services of dead supervisor pid " +
                              std::to_string(supervisor_pid)),
            std::string::npos)
      << adoption.out;
  std::printf(
      "[chaos] kill -9 supervisor + gpu_svc after token %zu of %d, `up` 500 ms later: %zu "
      "tokens, %.0f ms from the kills to the end\n",
      run.received_at_mark, kFixedRunTokens, r.ids.size(), ms_between(*run.marked, Clock::now()));
  ASSERT_TRUE(wait_all_healthy({gpu_pid})) << "gpu_svc did not come back";
  const nlohmann::json after = *try_status();
  EXPECT_EQ(after["takeover"]["restarted"], nlohmann::json::array({"gpu_svc"})) << after.dump();
  expect_no_kv_held();
  EXPECT_EQ(segments(), segments_before);
  EXPECT_EQ(generate(kLongPrompt, kFixedRunTokens, true).ids, clean.ids) << "a fresh request";
  down_and_expect_nothing_left();
}

class SupervisorKillMidGeneration : public ChaosStack,
                                    public ::testing::WithParamInterface<const char*> {};

// kill -9 of the supervisor alone once 100 of 200 tokens have streamed: the stream goes on with
// the undisturbed tokens, and the next `up` adopts all four services. Prints the time from the
// kill to the first token after the longest gap among the next 30 chunks (KillMidGeneration's
// measure) beside the same measure on an undisturbed run: the figure beside the device and
// frontend kills in bench/chaos/RESULTS.md.
TEST_P(SupervisorKillMidGeneration, TheStreamGoesOnWithTheSameTokens) {
  constexpr size_t kKillAfterTokens = kFixedRunTokens / 2;
  up(GetParam());
  // One 200-token run; at token 100 `at_mark` runs (the kill, or nothing for the baseline).
  auto run = [&](const std::function<void()>& at_mark) {
    const MarkedRun run = run_with_mark(kKillAfterTokens, at_mark);
    EXPECT_TRUE(run.marked.has_value() && !run.after.empty()) << "the run ended at the mark";
    return std::pair{run.result, run.ms_to_resumed()};
  };
  const auto [clean, baseline_ms] = run([] {});
  ASSERT_EQ(clean.ids.size(), size_t(kFixedRunTokens));
  const int supervisor_pid = (*try_status())["pid"];
  const auto [r, killed_ms] = run([&] { EXPECT_EQ(kill(supervisor_pid, SIGKILL), 0); });
  EXPECT_EQ(r.ids, clean.ids) << "tokens differ after the supervisor died";
  EXPECT_EQ(r.stats.finish_reason, "length");
  std::printf(
      "[chaos] plan %s: kill -9 supervisor after token %zu of %d: first token after the stall "
      "%.1f ms after the kill (the same measure without a kill: %.1f ms; TPOT %.2f ms; %zu "
      "tokens)\n",
      GetParam(), kKillAfterTokens, kFixedRunTokens, killed_ms, baseline_ms, r.stats.tpot_ms,
      r.ids.size());
  while (process_alive(supervisor_pid)) std::this_thread::sleep_for(1ms);
  const CliResult adoption =
      run_duet("stack up --stack " + id_ + " --plan " + std::string(GetParam()));
  ASSERT_EQ(adoption.rc, 0) << adoption.out;
  EXPECT_NE(adoption.out.find("adopted 4 running services of dead supervisor pid " +
                              std::to_string(supervisor_pid)),
            std::string::npos)
      << adoption.out;
  ASSERT_TRUE(wait_all_healthy({}));
  expect_no_kv_held();
  down_and_expect_nothing_left();
}

INSTANTIATE_TEST_SUITE_P(Plans, SupervisorKillMidGeneration, ::testing::Values("auto", "npu-only"),
                         plan_case_name);

}  // namespace
}  // namespace duet::chaos
