// kill -9 of a device service while requests decode from a shared prefix (issue 20 item 4): the
// supervisor restarts it, the step is re-run, and the sharers finish with the tokens of the run
// that computed the prefix itself; afterwards no KV page is held or shared (status and the
// segment agree).
#include <signal.h>

#include <atomic>
#include <thread>

#include "chaos_fixture.h"
#include "shm/kv_pages.h"

namespace duet::chaos {
namespace {

class KillSharedPrefix : public ChaosStack, public ::testing::WithParamInterface<const char*> {
 protected:
  // ~12 blocks of system prompt (+ 200 tokens within tiny-fortune's 512), then the question the
  // chaos tests ask.
  static std::string prompt() {
    std::string p;
    for (int i = 0; i < 18; ++i) p += "You are a fortune teller of the old kind. ";
    return p + kLongPrompt;
  }
  void expect_segment_holds_nothing() {
    std::string kv;
    for (const std::string& s : shm::list_stack_segments(id_))
      if (s.find("kv") != std::string::npos) kv = s;
    ASSERT_FALSE(kv.empty());
    shm::Segment seg = shm::Segment::open(kv, shm::Access::read_only);
    const shm::KvPages pages = shm::KvPages::attach(seg);
    EXPECT_TRUE(pages.owners().empty());
    EXPECT_EQ(pages.counts().used, 0u);
  }
};

TEST_P(KillSharedPrefix, DeviceKillDuringSharedPrefixDecodingKeepsTokensAndLeaksNoPage) {
  up(GetParam());
  // The first run computes the whole prompt (nothing is published yet) and publishes it.
  const client::GenerateResult clean = generate(prompt(), kFixedRunTokens, true);
  ASSERT_EQ(clean.ids.size(), size_t(kFixedRunTokens));
  const std::vector<std::string> victims = std::string(GetParam()) == "npu-only"
                                               ? std::vector<std::string>{"gpu_svc", "npu_svc"}
                                               : std::vector<std::string>{"gpu_svc"};
  for (const std::string& victim : victims) {
    SCOPED_TRACE(victim);
    const auto [pid, healthy] = service_state(victim);
    ASSERT_TRUE(pid > 0 && healthy);
    // Two sharers at once, the kill lands while both decode from the borrowed prefix.
    std::vector<client::GenerateResult> results(2);
    std::atomic<size_t> streamed{0};
    std::atomic<bool> killed{false};
    int max_shared = 0;
    std::vector<std::thread> clients;
    for (auto& result : results)
      clients.emplace_back([&] {
        client::Client c(endpoint());
        client::GenerateRequest req;
        req.prompt = prompt();
        req.max_tokens = kFixedRunTokens;
        req.ignore_eos = true;
        result = c.generate(
            req,
            [&](const client::Chunk& chunk) {
              streamed += chunk.ids.size();
              return true;
            },
            60s);
      });
    const auto deadline = Clock::now() + 30s;
    while (!killed && Clock::now() < deadline) {
      if (streamed >= size_t(kFixedRunTokens) / 2) {
        const nlohmann::json e = client::Client(endpoint()).status()["engine"];
        max_shared = e.value("kv_pages_shared", 0);
        EXPECT_EQ(kill(pid, SIGKILL), 0);
        killed = true;
      }
      std::this_thread::sleep_for(1ms);
    }
    for (auto& t : clients) t.join();
    ASSERT_TRUE(killed) << "the sharers finished before the kill";
    for (const auto& r : results) {
      EXPECT_EQ(r.ids, clean.ids) << "tokens differ after killing " << victim;
      EXPECT_EQ(r.stats.finish_reason, "length");
    }
    EXPECT_GT(max_shared, 0) << "no page was shared when " << victim << " died";
    std::printf("[chaos] plan %s: kill -9 %s with %d KV pages shared: tokens identical\n",
                GetParam(), victim.c_str(), max_shared);
    ASSERT_TRUE(wait_all_healthy({pid})) << victim << " did not come back";
    expect_no_kv_held();
    expect_segment_holds_nothing();
  }
  const nlohmann::json e = client::Client(endpoint()).status()["engine"];
  EXPECT_EQ(e["kv_prefix"]["hits"].get<size_t>(), 2 * victims.size()) << e.dump();
  EXPECT_EQ(e["kv_pages_shared"], 0) << e.dump();
  down_and_expect_nothing_left();
}

INSTANTIATE_TEST_SUITE_P(Plans, KillSharedPrefix, ::testing::Values("tensor", "npu-only"),
                         plan_case_name);

}  // namespace
}  // namespace duet::chaos
