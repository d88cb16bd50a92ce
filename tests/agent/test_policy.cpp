// The Agent.xpu rules one by one (services/frontend/agent_policy.h): pure logic, no devices.
#include <gtest/gtest.h>

#include "core/base/error.h"
#include "services/frontend/agent_policy.h"
#include "services/frontend/proactive_time.h"

namespace duet::frontend::agent {
namespace {

Job reactive(uint64_t id, double t, int len = 10) {
  return {id, Flow::reactive, t, len, false};
}
Job proactive(uint64_t id, double t, int len = 10) {
  return {id, Flow::proactive, t, len, false};
}

std::vector<uint64_t> ids(const std::vector<Job>& jobs) {
  std::vector<uint64_t> out;
  for (const Job& j : jobs) out.push_back(j.id);
  return out;
}

TEST(AgentPolicy, ReactivePrefillIsFifoAndGoesBeforeProactive) {
  AgentQueues q({3, 1000, 32});
  q.push_prefill(proactive(1, 0));
  q.push_prefill(reactive(2, 1));
  q.push_prefill(proactive(3, 2));
  q.push_prefill(reactive(4, 3));
  std::vector<uint64_t> order;
  while (auto j = q.pop_prefill(10)) order.push_back(j->id);
  EXPECT_EQ(order, (std::vector<uint64_t>{2, 4, 1, 3}));
}

TEST(AgentPolicy, AgingPromotesAProactiveJobAheadOfLaterReactiveOnes) {
  AgentQueues q({3, 1000, 32});
  q.push_prefill(proactive(1, 0));
  q.push_prefill(reactive(2, 500));
  EXPECT_EQ(q.pop_prefill(600)->id, 2u);  // not aged yet: reactive first
  q.push_prefill(reactive(3, 900));
  q.push_prefill(reactive(4, 1200));
  EXPECT_EQ(q.age(1100), 1);  // waited 1100 ms > 1000
  EXPECT_EQ(q.age(1100), 0);  // promotion is sticky, counted once
  // Enqueued at 0: ahead of the reactive jobs enqueued at 900 and 1200.
  const auto first = q.pop_prefill(1300);
  EXPECT_EQ(first->id, 1u);
  EXPECT_TRUE(first->promoted);
  EXPECT_EQ(q.pop_prefill(1300)->id, 3u);
  EXPECT_EQ(q.pop_prefill(1300)->id, 4u);
  EXPECT_FALSE(q.pop_prefill(1300).has_value());
}

TEST(AgentPolicy, ReactiveNeverPreemptsReactiveNorAPromotedJob) {
  EXPECT_TRUE(should_preempt(proactive(1, 0), true));
  EXPECT_FALSE(should_preempt(proactive(1, 0), false));
  EXPECT_FALSE(should_preempt(reactive(1, 0), true));
  Job promoted = proactive(1, 0);
  promoted.promoted = true;
  EXPECT_FALSE(should_preempt(promoted, true));
}

// A toy cost: the NPU does a 32-token chunk in 1 ms, the GPU in 3 ms; linear in tokens.
double toy_cost(int tokens, Device d) {
  return tokens * (d == Device::npu ? 1000.0 : 3000.0) / 32;
}

TEST(AgentPolicy, ElasticBindingBalancesChunksWhenDecodeIsIdle) {
  // 8 chunks + 16 tokens: i NPU chunks take i ms; the GPU takes 3 (8 - i) + 1.5 ms: i = 6 balances.
  const ElasticBinding b = elastic_binding(8 * 32 + 16, false, 32, toy_cost);
  EXPECT_EQ(b.n_chunks, 8);
  EXPECT_EQ(b.npu_chunks, 6);
  EXPECT_EQ(b.npu_tokens, 192);
  EXPECT_EQ(b.gpu_tokens, 80);
  EXPECT_DOUBLE_EQ(b.defer_us, 0);
  const Plan p = elastic_plan(b);
  EXPECT_EQ(p.at(MatmulRole::q).strategy, Strategy::activation_split);
  EXPECT_EQ(p.at(MatmulRole::down).npu_tokens, 192);
}

TEST(AgentPolicy, ElasticBindingPutsEveryChunkOnTheNpuAndDefersTheRemainderWhenDecodeIsBusy) {
  const ElasticBinding b = elastic_binding(8 * 32 + 16, true, 32, toy_cost);
  EXPECT_EQ(b.npu_chunks, 8);
  EXPECT_EQ(b.gpu_tokens, 16);
  EXPECT_DOUBLE_EQ(b.defer_us, 8000 - 1500);  // the GPU remainder ends with the NPU's chunks
  // Shorter than a chunk: all on the GPU; exact chunks with decode busy: all on the NPU.
  EXPECT_EQ(elastic_plan(elastic_binding(20, true, 32, toy_cost)).name, "gpu-only");
  EXPECT_EQ(elastic_plan(elastic_binding(64, true, 32, toy_cost)).name, Plan::npu_only().name);
  EXPECT_THROW(elastic_binding(0, true, 32, toy_cost), Error);
  EXPECT_THROW(elastic_binding(10, true, 0, toy_cost), Error);
}

TEST(AgentPolicy, PrefillGoesFirstOnTheGpu) {
  EXPECT_EQ(gpu_next(true, true), Stage::prefill);
  EXPECT_EQ(gpu_next(false, true), Stage::decode);
  EXPECT_EQ(gpu_next(false, false), Stage::none);
}

TEST(AgentPolicy, MemoryBoundWorkOfDifferentClassesDoesNotOverlap) {
  const Work reactive_decode{Flow::reactive, true}, proactive_decode{Flow::proactive, true};
  const Work proactive_gemm{Flow::proactive, false};
  EXPECT_FALSE(may_overlap(reactive_decode, proactive_decode));
  EXPECT_FALSE(may_overlap(proactive_decode, reactive_decode));
  EXPECT_TRUE(may_overlap(reactive_decode, proactive_gemm));
  EXPECT_TRUE(may_overlap(proactive_decode, proactive_decode));
  EXPECT_TRUE(may_overlap(reactive_decode, reactive_decode));
}

TEST(AgentPolicy, DecodeBatchAdmitsEveryReactiveAndCapsProactiveEvictingTheLongest) {
  const std::vector<Job> current{reactive(1, 0), proactive(2, 0, 300), proactive(3, 0, 50)};
  const std::vector<Job> new_reactive{reactive(4, 5)};
  const std::vector<Job> new_proactive{proactive(5, 5, 80), proactive(6, 6, 50)};
  const DecodeBatch b = reactive_first_batch(current, new_reactive, new_proactive, 3);
  // Reactive 1 and 4, then the shortest proactive (3: 50 tokens, enqueued before 6) up to 3.
  EXPECT_EQ(ids(b.batch), (std::vector<uint64_t>{1, 4, 3}));
  EXPECT_EQ(ids(b.evicted), (std::vector<uint64_t>{6, 5, 2}));
  // Reactive jobs alone exceed the cap: every one is admitted, no proactive one.
  const DecodeBatch many = reactive_first_batch({reactive(1, 0), reactive(2, 0), reactive(3, 0)},
                                                {reactive(4, 0)}, {proactive(5, 0)}, 3);
  EXPECT_EQ(many.batch.size(), 4u);
  EXPECT_EQ(ids(many.evicted), (std::vector<uint64_t>{5}));
}

TEST(AgentPolicy, DecodeBatchHasNoCapWithoutReactiveWorkAndPromotedJobsBypassIt) {
  std::vector<Job> pro;
  for (uint64_t i = 1; i <= 6; ++i) pro.push_back(proactive(i, 0, int(i)));
  EXPECT_EQ(reactive_first_batch({}, {}, pro, 3).batch.size(), 6u);
  Job promoted = proactive(9, 0, 1000);
  promoted.promoted = true;
  const DecodeBatch b =
      reactive_first_batch({reactive(1, 0), reactive(2, 0), reactive(3, 0)}, {}, {promoted}, 3);
  EXPECT_EQ(ids(b.batch), (std::vector<uint64_t>{1, 2, 3, 9}));
  EXPECT_TRUE(b.evicted.empty());
  EXPECT_THROW(reactive_first_batch({}, {}, {}, -1), Error);
  // A reactive request still prefilling counts as present: the cap holds.
  EXPECT_EQ(reactive_first_batch({}, {}, pro, 3, true).batch.size(), 3u);
}

// Slack-aware piggybacking (§4.5): the step time model is what an engine measured, per token
// count, as an exponentially weighted mean.
TEST(AgentPolicy, StepTimeModelFollowsTheMeasuredStepsPerTokenCount) {
  StepTimeModel m(0.5);
  EXPECT_FALSE(m.predict(1).has_value()) << "nothing measured yet";
  m.observe(1, 1000);
  EXPECT_DOUBLE_EQ(*m.predict(1), 1000);  // the first sample is the mean
  m.observe(1, 2000);
  EXPECT_DOUBLE_EQ(*m.predict(1), 1500);  // then half old, half new
  m.observe(4, 1800);
  EXPECT_FALSE(m.predict(2).has_value()) << "a count never measured is not guessed";
  EXPECT_EQ(m.samples(1), 2u);
  EXPECT_EQ(m.samples(4), 1u);
  EXPECT_EQ(m.max_tokens_seen(), 4);
  EXPECT_THROW(m.observe(0, 10), Error);
  EXPECT_THROW(m.observe(1, -1), Error);
  EXPECT_THROW(StepTimeModel(0), Error);
}

// The same rule admits what the device's measured step times allow: a memory-bound device (a
// few more decode rows cost next to nothing) takes the cap's worth, this CPU backend (1 decoder
// 1.0 ms, 2-4 tokens in the 4-token program 1.8 ms: bench/agent/RESULTS.md) takes none at a
// small slack and all at a large one.
TEST(AgentPolicy, SlackRidersAdmitWhatTheMeasuredStepTimesAllow) {
  StepTimeModel memory_bound;
  for (int n = 1; n <= 4; ++n) memory_bound.observe(n, 1000 + 20 * (n - 1));
  EXPECT_EQ(slack_riders(memory_bound, 1, 3, 0.1), 3);
  EXPECT_EQ(slack_riders(memory_bound, 1, 3, 0.03), 1);  // 1020 fits 1030, 1040 does not
  StepTimeModel cpu;
  cpu.observe(1, 1000);
  for (int n = 2; n <= 4; ++n) cpu.observe(n, 1800);
  EXPECT_EQ(slack_riders(cpu, 1, 3, 0.5), 0);
  EXPECT_EQ(slack_riders(cpu, 1, 3, 0.8), 3);
  EXPECT_EQ(slack_riders(cpu, 2, 2, 0.0), 2) << "within one program a rider is free";
  EXPECT_EQ(slack_riders(cpu, 1, 3, std::numeric_limits<double>::infinity()), 3);
  // No reactive work in the step: nothing to bound.
  EXPECT_EQ(slack_riders(cpu, 0, 5, 0.0), 5);
  // The reactive-only step never measured: no rider (that step gets measured first).
  EXPECT_EQ(slack_riders(cpu, 7, 3, 0.5), 0);
  // A count above the measured ones is tried once when every smaller count fits ...
  EXPECT_EQ(slack_riders(cpu, 3, 3, 0.1), 2);  // 4 fits, 5 unknown: tried, 6 not yet
  // ... and not past one that does not fit.
  StepTimeModel steep;
  steep.observe(1, 1000);
  steep.observe(2, 3000);
  EXPECT_EQ(slack_riders(steep, 1, 3, 0.5), 0);
  EXPECT_THROW(slack_riders(cpu, 1, 1, -0.1), Error);
  EXPECT_THROW(slack_riders(cpu, 1, -1, 0.5), Error);
}

// The frontend's time book (proactive_time.h): every millisecond with proactive work pending
// lands in exactly one `by what ran` bucket (the gap between steps as `no step`), the `while`
// buckets mark why the proactive engine waited, and time with nothing proactive pending counts
// nowhere.
TEST(ProactiveTime, BooksPendingTimeByWhatRanAndWhy) {
  using duet::frontend::ProactiveState;
  using duet::frontend::ProactiveTimeBook;
  using duet::frontend::StepKind;
  ProactiveTimeBook b;
  ProactiveState idle;                                         // nothing proactive
  ProactiveState gated{true, true, true, true, false, false};  // prompt due, reactive runs
  ProactiveState parked = gated;
  parked.parked = true;
  ProactiveState flowing{true, true, true, false, false, true};  // a step in flight beside
  b.on_step(0, 4, idle, StepKind::main_reactive, gated);         // not pending: nothing
  b.on_step(5, 7, gated, StepKind::main_reactive, parked);       // gap 1 ms (gated) + 2 ms reactive
  b.on_step(7, 8, parked, StepKind::main_shared, flowing);
  b.on_step(10, 13, flowing, StepKind::main_proactive, flowing);  // gap 2 ms + 3 ms
  b.on_step(13, 20, flowing, StepKind::proactive_lane, idle);
  b.on_step(30, 31, idle, StepKind::none, idle);  // the gap after `idle`: nothing
  EXPECT_DOUBLE_EQ(b.pending_ms, 1 + 2 + 1 + 2 + 3 + 7);
  EXPECT_DOUBLE_EQ(b.no_step_ms, 1 + 2);
  EXPECT_DOUBLE_EQ(b.main_reactive_only_ms, 2);
  EXPECT_DOUBLE_EQ(b.main_shared_ms, 1);
  EXPECT_DOUBLE_EQ(b.main_proactive_ms, 3);
  EXPECT_DOUBLE_EQ(b.proactive_lane_ms, 7);
  EXPECT_DOUBLE_EQ(b.pending_ms, b.no_step_ms + b.main_reactive_only_ms + b.main_shared_ms +
                                     b.main_proactive_ms + b.proactive_lane_ms);
  EXPECT_DOUBLE_EQ(b.decoders_held_ms, 2);  // the reactive-only step while decoders waited
  EXPECT_DOUBLE_EQ(b.gated_prefill_ms, 1 + 2 + 1);
  EXPECT_DOUBLE_EQ(b.parked_ms, 1);
  EXPECT_DOUBLE_EQ(b.overlapped_ms, 2 + 3 + 7);
  EXPECT_EQ(b.reactive_only_steps, 1u);
  EXPECT_DOUBLE_EQ(b.to_json()["pending"].get<double>(), b.pending_ms);
}

}  // namespace
}  // namespace duet::frontend::agent
