// The serving loop's scheduler with the Agent.xpu rules (issue 9): reactive
// prefill FIFO, proactive decoders capped while a reactive request runs
// (longest contexts wait), aging.
#include <gtest/gtest.h>

#include <memory>

#include "services/frontend/scheduler.h"

namespace duet::frontend {
namespace {

std::unique_ptr<Request> decoding(uint64_t seq, Priority p, int32_t pos, double last_token_ms) {
  auto r = std::make_unique<Request>();
  r->seq_id = seq;
  r->priority = p;
  r->prompt = {1, 2};
  r->n_prefilled = 2;
  r->pos = pos;
  r->next_token = 5;
  r->last_token_ms = last_token_ms;
  return r;
}

std::unique_ptr<Request> prefilling(uint64_t seq, Priority p, double arrived_ms) {
  auto r = std::make_unique<Request>();
  r->seq_id = seq;
  r->priority = p;
  r->prompt = std::vector<int32_t>(8, 7);
  r->arrived_ms = arrived_ms;
  return r;
}

std::vector<uint64_t> seqs(const StepBatch& b) {
  std::vector<uint64_t> out;
  for (const SeqStep& s : b.entries) out.push_back(s.seq_id);
  return out;
}

void admit_all(Scheduler& s, std::vector<std::unique_ptr<Request>>& rs) {
  for (auto& r : rs) s.enqueue(r.get());
  s.admit([](Request*) {});
}

TEST(AgentScheduler, ProactiveDecodersAreCappedWhileReactiveRunsLongestContextsWait) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(decoding(2, Priority::proactive, 400, 1000));
  rs.push_back(decoding(3, Priority::proactive, 50, 1000));
  rs.push_back(decoding(4, Priority::proactive, 90, 1000));
  Scheduler s(8, 8);
  admit_all(s, rs);
  // Reactive 1, then the two shortest proactive contexts: 3 entries in all (the
  // cap).
  EXPECT_EQ(seqs(s.build(64, 1001)), (std::vector<uint64_t>{1, 3, 4}));
  // Once the reactive request is done, every proactive decoder runs.
  rs[0]->finish_reason = "stop";
  rs[0]->next_token.reset();
  EXPECT_EQ(seqs(s.build(64, 1002)).size(), 3u);
  s.remove(rs[0].get());
  EXPECT_EQ(seqs(s.build(64, 1003)), (std::vector<uint64_t>{2, 3, 4}));
}

TEST(AgentScheduler, AgedProactiveDecoderBypassesTheCap) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 0));
  rs.push_back(decoding(2, Priority::proactive, 20, 0));
  rs.push_back(decoding(3, Priority::proactive, 30, 0));
  rs.push_back(decoding(4, Priority::proactive, 900,
                        0));  // longest: evicted, until it ages
  Scheduler s(8, 8);
  agent::AgentConfig cfg;
  cfg.aging_ms = 5000;
  s.set_agent_config(cfg);
  admit_all(s, rs);
  EXPECT_EQ(seqs(s.build(64, 100)), (std::vector<uint64_t>{1, 2, 3}));
  rs[1]->last_token_ms = rs[2]->last_token_ms = 5000;  // served; 4 has waited since 0
  // 4 has waited 6 s: promoted, it joins whatever the cap; it still counts
  // toward it.
  EXPECT_EQ(seqs(s.build(64, 6000)), (std::vector<uint64_t>{1, 4, 2}));
}

TEST(AgentScheduler, ReactivePrefillIsFifoAndAgedProactiveJoinsByArrival) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(prefilling(1, Priority::proactive, 0));
  rs.push_back(prefilling(2, Priority::reactive, 100));
  rs.push_back(prefilling(3, Priority::reactive, 200));
  Scheduler s(8, 8);
  admit_all(s, rs);
  // Budget for two chunks of 8: reactive 2 then 3 (FIFO); proactive 1 waits.
  EXPECT_EQ(seqs(s.build(16, 300)), (std::vector<uint64_t>{2, 3}));
  // Past the aging threshold (30 s by default) proactive 1 goes first: it
  // arrived first.
  EXPECT_EQ(seqs(s.build(16, 40000)), (std::vector<uint64_t>{1, 2}));
}

}  // namespace
}  // namespace duet::frontend
