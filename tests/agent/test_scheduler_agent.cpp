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

// Decoding requests: 1 reactive (context 10), 2, 3 and 4 proactive (contexts 400, 50, 90).
std::vector<std::unique_ptr<Request>> reactive_and_proactive_decoders() {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(decoding(2, Priority::proactive, 400, 1000));
  rs.push_back(decoding(3, Priority::proactive, 50, 1000));
  rs.push_back(decoding(4, Priority::proactive, 90, 1000));
  return rs;
}

void admit_all(Scheduler& s, std::vector<std::unique_ptr<Request>>& rs) {
  for (auto& r : rs) s.enqueue(r.get());
  s.admit([](Request*) {});
}

TEST(AgentScheduler, ProactiveDecodersAreCappedWhileReactiveRunsLongestContextsWait) {
  std::vector<std::unique_ptr<Request>> rs = reactive_and_proactive_decoders();
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

// SeqStep::decode marks a request's sampled token: an engine with a placement per phase runs a
// step of decode entries only in its decode placement, any step holding a prompt in its prefill
// one (puzzle/subgraph_plan.h).
TEST(AgentScheduler, DecodeEntriesAreMarkedSoAStepsPhaseIsKnown) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(decoding(2, Priority::reactive, 20, 1000));
  Scheduler s(8, 8);
  admit_all(s, rs);
  const StepBatch decode_only = s.build(64, 1001);
  ASSERT_EQ(decode_only.entries.size(), 2u);
  for (const SeqStep& e : decode_only.entries) EXPECT_TRUE(e.decode);
  // A one-token prompt is still a prefill entry, beside the decoders.
  auto one = prefilling(3, Priority::reactive, 1000);
  one->prompt = {7};
  s.enqueue(one.get());
  s.admit([](Request*) {});
  const StepBatch mixed = s.build(64, 1002);
  ASSERT_EQ(seqs(mixed), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE(mixed.entries[0].decode && mixed.entries[1].decode);
  EXPECT_FALSE(mixed.entries[2].decode);
  EXPECT_EQ(mixed.entries[2].tokens.size(), 1u);
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

// Overlap (AgentConfig::overlap, §4.5 ① compute slack): under `all` the proactive lane opens
// beside reactive DECODE (its prefill may run on the other device meanwhile) but stays gated
// while a reactive prompt is being prefilled; under `off` and `proactive` any running reactive
// request gates it.
TEST(AgentScheduler, OverlapAllOpensTheProactiveLaneBesideReactiveDecodeNotReactivePrefill) {
  using Overlap = agent::AgentConfig::Overlap;
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(1, Priority::reactive, 10, 1000));
  rs.push_back(prefilling(2, Priority::proactive, 900));
  rs[1]->proactive_lane = true;
  Scheduler s(8, 8);
  s.set_riding(true, 8);
  admit_all(s, rs);
  agent::AgentConfig cfg;
  for (Overlap o : {Overlap::off, Overlap::proactive}) {
    cfg.overlap = o;
    s.set_agent_config(cfg);
    EXPECT_FALSE(s.proactive_lane_open());
    EXPECT_TRUE(s.build(64, 1001, Lane::proactive).empty());
  }
  cfg.overlap = Overlap::all;
  s.set_agent_config(cfg);
  EXPECT_TRUE(s.proactive_lane_open());
  EXPECT_EQ(seqs(s.build(64, 1001, Lane::proactive)), (std::vector<uint64_t>{2}));
  // The main lane is unchanged: the reactive decoder alone (the prefill is the other engine's).
  EXPECT_EQ(seqs(s.build(64, 1001, Lane::main)), (std::vector<uint64_t>{1}));
  // A reactive prompt arrives: the prefill pipeline is reactive-first, the lane closes again.
  auto re_prefill = prefilling(3, Priority::reactive, 1000);
  s.enqueue(re_prefill.get());
  s.admit([](Request*) {});
  EXPECT_TRUE(s.reactive_prefill_present());
  EXPECT_FALSE(s.proactive_lane_open());
  EXPECT_TRUE(s.build(64, 1002, Lane::proactive).empty());
  // Its prompt done (decoding now): open again.
  re_prefill->n_prefilled = re_prefill->prompt.size();
  re_prefill->next_token = 5;
  EXPECT_TRUE(s.proactive_lane_open());
  EXPECT_EQ(seqs(s.build(64, 1003, Lane::proactive)), (std::vector<uint64_t>{2}));
}

// Algorithm 2 for real: with the two engines sharing one KV pool, the proactive lane's decoders
// decode in the main lane's steps (riding): with a reactive request, up to the cap (the longest
// context evicted) and after the reactive prefill; without one, all of them. The proactive lane
// then runs prefill only, and a request of a parked step never rides.
TEST(AgentScheduler, RidingProactiveDecodersJoinTheMainStepsUnderTheCap) {
  std::vector<std::unique_ptr<Request>> rs = reactive_and_proactive_decoders();
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
  // Reactive work done: every proactive decoder rides (no cap) and the lane prefills alone
  // (without carrying, the default).
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

// Carrying: with no reactive work and a proactive prefill due, the proactive decoders decode in
// that prefill step, after its prompt rows, the prompt chunk taking what they leave of the
// budget (as an FCFS step would); the main lane then has nothing to run. A reactive request, a
// parked step or no prefill to carry them: they ride in the main lane as before.
TEST(AgentScheduler, ProactiveDecodersAreCarriedInTheProactivePrefillStepWithoutReactiveWork) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(decoding(2, Priority::proactive, 400, 1000));
  rs.push_back(decoding(3, Priority::proactive, 50, 1000));
  rs.push_back(prefilling(6, Priority::proactive, 600));  // 8 prompt tokens
  for (auto& r : rs) r->proactive_lane = true;
  Scheduler s(8, 8);
  agent::AgentConfig cfg;
  cfg.carry_decoders = true;  // off by default (bench/agent/RESULTS.md measures it)
  s.set_agent_config(cfg);
  s.set_riding(true, 8);
  admit_all(s, rs);
  EXPECT_TRUE(s.build(64, 1001, Lane::main).empty());
  StepBatch carried = s.build(64, 1001, Lane::proactive);
  EXPECT_EQ(seqs(carried), (std::vector<uint64_t>{6, 2, 3}));
  ASSERT_EQ(carried.parts.size(), 3u);
  EXPECT_FALSE(carried.parts[0].decode);
  EXPECT_EQ(carried.parts[0].n_tokens, 8u);
  EXPECT_TRUE(carried.parts[1].decode);
  EXPECT_EQ(carried.parts[1].first_logit_row, 1u) << "the prompt's last row, then the decoders'";
  // A 6-token budget: the decoders keep their two rows, the prompt gets four.
  StepBatch short_step = s.build(6, 1001, Lane::proactive);
  EXPECT_EQ(seqs(short_step), (std::vector<uint64_t>{6, 2, 3}));
  EXPECT_EQ(short_step.parts[0].n_tokens, 4u);
  // A reactive request arrives: the lane is gated, the decoders ride in the main lane.
  auto re = decoding(1, Priority::reactive, 10, 1000);
  s.enqueue(re.get());
  s.admit([](Request*) {});
  EXPECT_TRUE(s.build(64, 1002, Lane::proactive).empty());
  EXPECT_EQ(seqs(s.build(64, 1002, Lane::main)), (std::vector<uint64_t>{1, 3, 2}));
  re->finish_reason = "stop";
  s.remove(re.get());
  // A parked step: it resumes on its own, the decoders ride in the main lane meanwhile.
  rs[2]->in_parked_step = true;
  EXPECT_EQ(seqs(s.build(64, 1003, Lane::main)), (std::vector<uint64_t>{2, 3}));
  rs[2]->in_parked_step = false;
  // No prompt left to prefill: nothing to carry them, the main lane decodes them.
  rs[2]->n_prefilled = rs[2]->prompt.size();
  rs[2]->next_token = 5;
  EXPECT_EQ(seqs(s.build(64, 1004, Lane::main)), (std::vector<uint64_t>{2, 3, 6}));
  EXPECT_TRUE(s.build(64, 1004, Lane::proactive).empty());
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

// Slack-aware piggybacking in the serving loop's scheduler: the frontend reports every main
// step's measured time; a step with reactive work takes riders only while its predicted time
// stays within (1 + slack) of the step without them, under the cap and the step's budget.
// Step times from the stack on this machine (frontend status main_step_ms_by_tokens, 2-core VM,
// 2026-11-22): 1 token 1.0 ms, 2-4 tokens (one 4-token program) 1.8 ms.
TEST(AgentScheduler, SlackRuleCutsRidersToWhatTheMeasuredStepTimesAllow) {
  auto make = [](double slack) {
    auto s = std::make_unique<Scheduler>(8, 8);
    agent::AgentConfig cfg;
    cfg.rider_slack = slack;
    s->set_agent_config(cfg);
    s->set_riding(true, 8);
    return s;
  };
  std::vector<std::unique_ptr<Request>> rs = reactive_and_proactive_decoders();
  for (size_t i = 1; i < rs.size(); ++i) rs[i]->proactive_lane = true;

  // Nothing measured yet: the reactive-only step goes first (and is measured).
  auto s = make(0.5);
  admit_all(*s, rs);
  EXPECT_EQ(seqs(s->build(64, 1001, Lane::main)), (std::vector<uint64_t>{1}));
  s->observe_main_step(1, 1000);
  // One rider (the shortest context) makes a 2-token step, never measured: tried.
  EXPECT_EQ(seqs(s->build(64, 1002, Lane::main)), (std::vector<uint64_t>{1, 3}));
  s->observe_main_step(2, 1800);
  // Measured: 1.8 ms against 1.0 ms is beyond a slack of 0.5: no rider, and a 3-token step
  // is not tried past a 2-token one that does not fit.
  EXPECT_EQ(seqs(s->build(64, 1003, Lane::main)), (std::vector<uint64_t>{1}));
  EXPECT_EQ(s->slack_refused(), 2u + 1u + 2u);

  // A larger slack (0.8) admits them: the same measured times, the cap still holds.
  auto wide = make(0.8);
  admit_all(*wide, rs);
  wide->observe_main_step(1, 1000);
  wide->observe_main_step(2, 1800);
  wide->observe_main_step(3, 1800);
  EXPECT_EQ(seqs(wide->build(64, 1001, Lane::main)), (std::vector<uint64_t>{1, 3, 4}));

  // A memory-bound device's measured times (a rider ~2%): slack 0.1 takes the cap's worth.
  auto flat = make(0.1);
  admit_all(*flat, rs);
  for (int n = 1; n <= 3; ++n) flat->observe_main_step(n, 1000 + 20 * (n - 1));
  EXPECT_EQ(seqs(flat->build(64, 1001, Lane::main)), (std::vector<uint64_t>{1, 3, 4}));
  EXPECT_EQ(flat->slack_refused(), 0u);

  // Without reactive work nothing is bounded: every proactive decoder decodes.
  rs[0]->finish_reason = "stop";
  s->remove(rs[0].get());
  EXPECT_EQ(seqs(s->build(64, 1004, Lane::main)), (std::vector<uint64_t>{2, 3, 4}));
}

// The reactive part of a step includes its prefill chunk: riders filling a prefill step's last,
// partial chunk ride for free when the step's measured time does not grow with them.
TEST(AgentScheduler, SlackRuleCountsTheReactivePrefillInTheBaseStep) {
  std::vector<std::unique_ptr<Request>> rs;
  rs.push_back(prefilling(1, Priority::reactive, 500));  // 8 prompt tokens
  rs.push_back(decoding(2, Priority::proactive, 40, 1000));
  rs.push_back(decoding(3, Priority::proactive, 60, 1000));
  for (size_t i = 1; i < rs.size(); ++i) rs[i]->proactive_lane = true;
  Scheduler s(8, 8);
  agent::AgentConfig cfg;
  cfg.rider_slack = 0.05;
  s.set_agent_config(cfg);
  s.set_riding(true, 8);
  admit_all(s, rs);
  // 8-10 tokens run one program: the same measured time.
  for (int n = 8; n <= 10; ++n) s.observe_main_step(n, 3000);
  EXPECT_EQ(seqs(s.build(64, 1001, Lane::main)), (std::vector<uint64_t>{1, 2, 3}));
  // A 9-token step measured 10% slower (a slack of 5%): the rule takes the largest count that
  // fits, so both still ride while 10 tokens measure 3.0 ms ...
  for (int i = 0; i < 8; ++i) s.observe_main_step(9, 3300);
  EXPECT_GT(*s.step_times().predict(9), 3150.0);
  EXPECT_EQ(seqs(s.build(64, 1002, Lane::main)), (std::vector<uint64_t>{1, 2, 3}));
  // ... and none once 10 tokens measure slower too.
  for (int i = 0; i < 8; ++i) s.observe_main_step(10, 3300);
  EXPECT_EQ(seqs(s.build(64, 1003, Lane::main)), (std::vector<uint64_t>{1}));
}

}  // namespace
}  // namespace duet::frontend
