// The serving loop's scheduler with the Agent.xpu rules (issue 9): reactive
// prefill FIFO, proactive decoders capped while a reactive request runs
// (longest contexts wait), aging.
#include <gtest/gtest.h>

#include <map>
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

TEST(AgentScheduler, ProactiveLaneIsGatedWhileReactiveRunsAgedWorkExcepted) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(decoding(2, Priority::proactive, 20, 1000));
  rs.push_back(prefilling(3, Priority::proactive, 900));
  rs.push_back(decoding(4, Priority::proactive, 30, 0));  // waiting since 0: ages first
  for (size_t i = 1; i < rs.size(); ++i) rs[i]->proactive_lane = true;
  Scheduler s(8, 8);
  agent::AgentConfig cfg;
  cfg.aging_ms = 5000;
  s.set_agent_config(cfg);
  admit_all(s, rs);
  // The main lane holds only what is on the main engine: reactive 1, no proactive rider.
  EXPECT_EQ(seqs(s.build(64, 1001, Lane::main)), (std::vector<uint64_t>{1}));
  // Reactive 1 runs: the proactive lane is held (contention gating) ...
  EXPECT_TRUE(s.reactive_present());
  EXPECT_TRUE(s.build(64, 1001, Lane::proactive).empty());
  // ... except for work that aged: 4 (waiting 5.5 s) goes alone.
  EXPECT_EQ(seqs(s.build(64, 5500, Lane::proactive)), (std::vector<uint64_t>{4}));
  // Reactive 1 done: the whole lane runs, decoders then the prefill chunk.
  rs[0]->finish_reason = "stop";
  EXPECT_FALSE(s.reactive_present());
  EXPECT_EQ(seqs(s.build(64, 1002, Lane::proactive)), (std::vector<uint64_t>{2, 4, 3}));
  EXPECT_TRUE(s.build(64, 1002, Lane::main).empty());
}

// Algorithm 2 for real: with the two engines sharing one KV pool, the proactive lane's decoders
// decode in the main lane's steps (riding): with a reactive request, up to the cap (the longest
// context evicted) and after the reactive prefill; without one, all of them. The proactive lane
// then runs prefill only, and a request of a parked step never rides.
TEST(AgentScheduler, RidingProactiveDecodersJoinTheMainStepsUnderTheCap) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(decoding(2, Priority::proactive, 400, 1000));
  rs.push_back(decoding(3, Priority::proactive, 50, 1000));
  rs.push_back(decoding(4, Priority::proactive, 90, 1000));
  rs.push_back(prefilling(5, Priority::reactive, 500));
  rs.push_back(prefilling(6, Priority::proactive, 600));
  for (Request* r : {rs[1].get(), rs[2].get(), rs[3].get(), rs[5].get()}) r->proactive_lane = true;
  Scheduler s(8, 8);
  s.set_riding(true, 8);
  admit_all(s, rs);
  // Reactive decoder 1, reactive prefill 5, then the riders: the batch (1, 3, 4) reaches the
  // cap of 3 and 2 (the longest context) waits. Proactive prefill 6 is not on this engine.
  EXPECT_EQ(seqs(s.build(64, 1001, Lane::main)), (std::vector<uint64_t>{1, 5, 3, 4}));
  // The proactive lane is gated and carries no decoder.
  EXPECT_TRUE(s.build(64, 1001, Lane::proactive).empty());
  // A short budget goes to the reactive work first: riders take what is left.
  EXPECT_EQ(seqs(s.build(9, 1001, Lane::main)), (std::vector<uint64_t>{1, 5}));
  EXPECT_EQ(seqs(s.build(10, 1001, Lane::main)), (std::vector<uint64_t>{1, 5, 3}));
  // Reactive work done: every proactive decoder rides (no cap), the lane prefills alone.
  for (Request* r : {rs[0].get(), rs[4].get()}) {
    r->finish_reason = "stop";
    s.remove(r);
  }
  EXPECT_EQ(seqs(s.build(64, 1002, Lane::main)), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(seqs(s.build(64, 1002, Lane::proactive)), (std::vector<uint64_t>{6}));
  // A decoder whose step is parked waits for that step.
  rs[2]->in_parked_step = true;
  EXPECT_EQ(seqs(s.build(64, 1003, Lane::main)), (std::vector<uint64_t>{2, 4}));
}

TEST(AgentScheduler, RidersNeverExceedTheMainEnginesSequencesAndTakeTurns) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));  // the main lane's one request
  for (uint64_t i = 2; i <= 4; ++i) {
    rs.push_back(decoding(i, Priority::proactive, 20, 1000));
    rs.back()->proactive_lane = true;
  }
  Scheduler s(8, 8);
  agent::AgentConfig cfg;
  cfg.decode_cap = 8;  // the cap is not what limits here
  s.set_agent_config(cfg);
  s.set_riding(true, 3);  // the main engine takes 3 sequences a step
  admit_all(s, rs);
  std::map<uint64_t, int> rode;
  for (int step = 0; step < 6; ++step) {
    const StepBatch b = s.build(64, 1001, Lane::main);
    ASSERT_LE(b.entries.size(), 3u);
    ASSERT_EQ(b.entries.front().seq_id, 1u);
    for (size_t i = 1; i < b.entries.size(); ++i) ++rode[b.entries[i].seq_id];
  }
  // Two riders a step over six steps: each of the three rode four times.
  EXPECT_EQ(rode, (std::map<uint64_t, int>{{2, 4}, {3, 4}, {4, 4}}));
}

TEST(AgentScheduler, QueuedReactiveWithoutASlotDoesNotStallTheProactiveLane) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(prefilling(1, Priority::proactive, 0));
  rs[0]->proactive_lane = true;
  Scheduler s(1, 8);  // one running request at a time
  admit_all(s, rs);
  auto reactive = prefilling(2, Priority::reactive, 10);
  s.enqueue(reactive.get());
  s.admit([](Request*) {});  // no room: it stays queued
  EXPECT_EQ(s.queued(Priority::reactive), 1u);
  // The running proactive request must go on: it is what frees the slot.
  EXPECT_FALSE(s.reactive_present());
  EXPECT_EQ(seqs(s.build(64, 20, Lane::proactive)), (std::vector<uint64_t>{1}));
}

TEST(AgentScheduler, EachLaneHasItsOwnSlotsSoProactiveWorkNeverBlocksAReactiveAdmission) {
  Scheduler s(2, 8);  // two running requests per engine
  s.set_lane_of([](const Request& r) {
    return r.priority == Priority::proactive ? Lane::proactive : Lane::main;
  });
  std::vector<std::unique_ptr<Request>> rs;
  for (uint64_t i = 1; i <= 3; ++i) rs.push_back(prefilling(i, Priority::proactive, double(i)));
  rs.push_back(prefilling(4, Priority::reactive, 10));
  for (auto& r : rs) s.enqueue(r.get());
  const std::vector<Request*> admitted = s.admit([](Request*) {});
  // Reactive 4 first (its lane is empty), then two proactive: the third waits for its lane.
  ASSERT_EQ(admitted.size(), 3u);
  EXPECT_EQ(admitted[0]->seq_id, 4u);
  EXPECT_EQ(s.queued(Priority::proactive), 1u);
  EXPECT_FALSE(s.can_admit());
  auto late = prefilling(5, Priority::reactive, 20);
  s.enqueue(late.get());
  EXPECT_TRUE(s.can_admit());  // the main lane still has a slot
  EXPECT_EQ(s.admit([](Request*) {}).size(), 1u);
}

}  // namespace
}  // namespace duet::frontend
