// ReferenceEngine and Scheduler on their own: a batched step gives each sequence exactly what
// its own ReferenceForward gives, KV is accounted and freed, and the scheduler batches decode
// tokens and chunked prefills in priority order within the engine's budget.
#include <gtest/gtest.h>

#include "frontend_fixture.h"
#include "services/frontend/scheduler.h"

namespace duet::frontend::testing {
namespace {

std::vector<float> last_row(const std::vector<float>& all, size_t row, size_t n_vocab) {
  return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(row * n_vocab),
                            all.begin() + static_cast<std::ptrdiff_t>((row + 1) * n_vocab));
}

TEST(ReferenceEngine, BatchedStepEqualsOneForwardPerSequence) {
  const LlamaModel& m = tiny_model();
  const size_t n_vocab = static_cast<size_t>(m.hp().n_vocab);
  ReferenceEngine engine(m);
  engine.open_seq(7, 64);
  engine.open_seq(9, 64);
  const std::vector<int32_t> a = {1, 703, 1975, 9}, b = {1, 42, 43};
  StepStats stats;
  // Sequence 7 prefills in two entries of one step; sequence 9 in one.
  const auto logits = engine.step(
      {{7, {a[0], a[1]}, 0, false}, {7, {a[2], a[3]}, 2, true}, {9, b, 0, true}}, &stats);
  ASSERT_EQ(logits.size(), 2 * n_vocab);
  EXPECT_EQ(stats.n_tokens, 7u);
  EXPECT_EQ(stats.kv_bytes_copied, 0u);
  ReferenceForward fa(m), fb(m);
  EXPECT_EQ(last_row(logits, 0, n_vocab), fa.forward(a, false));
  EXPECT_EQ(last_row(logits, 1, n_vocab), fb.forward(b, false));
  // A decode step appends at the sequence's next position.
  const auto next = engine.step({{9, {5}, 3, true}}, nullptr);
  EXPECT_EQ(next, fb.forward(std::vector<int32_t>{5}, false));
  EXPECT_EQ(engine.position(9), 4);
}

TEST(ReferenceEngine, OneTokenEntriesGiveEveryPositionsLogits) {
  const LlamaModel& m = tiny_model();
  ReferenceEngine engine(m);
  engine.open_seq(1, 8);
  const std::vector<int32_t> ids = {1, 100, 200, 300};
  std::vector<SeqStep> batch;
  for (int i = 0; i < 4; ++i) batch.push_back({1, {ids[size_t(i)]}, i, true});
  ReferenceForward f(m);
  EXPECT_EQ(engine.step(batch, nullptr), f.forward(ids, true));
}

TEST(ReferenceEngine, KvBudgetIsEnforcedAndFreedAtOnce) {
  const LlamaModel& m = tiny_model();
  ReferenceEngineOptions o;
  ReferenceEngine probe(m);
  o.max_kv_bytes = 2 * probe.kv_bytes_for(100);
  ReferenceEngine engine(m, o);
  engine.open_seq(1, 100);
  engine.open_seq(2, 100);
  try {
    engine.open_seq(3, 100);
    FAIL() << "a third sequence fit in a budget of two";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy);
    EXPECT_NE(std::string(e.what()).find("KV cache full"), std::string::npos) << e.what();
  }
  engine.close_seq(1);
  EXPECT_EQ(engine.kv_bytes_in_use(), engine.kv_bytes_for(100));
  engine.open_seq(3, 100);
  engine.close_seq(12345);  // unknown ids are ignored
  EXPECT_EQ(engine.open_seqs(), 2u);
}

TEST(ReferenceEngine, StepPastReservedPositionsIsAnError) {
  ReferenceEngine engine(tiny_model());
  engine.open_seq(1, 2);
  try {
    engine.step({{1, {1, 2, 3}, 0, true}}, nullptr);
    FAIL() << "three tokens fit in two positions";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
  }
  try {
    engine.step({{99, {1}, 0, true}}, nullptr);
    FAIL() << "an unopened sequence stepped";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
  }
}

Request make_request(Priority p, size_t prompt_len, bool decoding = false) {
  Request r;
  r.priority = p;
  r.prompt.assign(prompt_len, 5);
  if (decoding) {
    r.n_prefilled = prompt_len;
    r.next_token = 7;
  }
  return r;
}

TEST(Scheduler, ReactiveIsAdmittedBeforeProactiveAndQueueIsBounded) {
  Scheduler s(/*max_running=*/2, /*max_queue=*/3);
  Request p1 = make_request(Priority::proactive, 4), p2 = make_request(Priority::proactive, 4);
  Request r1 = make_request(Priority::reactive, 4), r2 = make_request(Priority::reactive, 4);
  s.enqueue(&p1);
  s.enqueue(&p2);
  s.enqueue(&r1);
  try {
    s.enqueue(&r2);
    FAIL() << "a fourth request fit in a queue of three";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy);
  }
  const auto admitted = s.admit([](Request*) {});
  ASSERT_EQ(admitted.size(), 2u);
  EXPECT_EQ(admitted[0], &r1);
  EXPECT_EQ(admitted[1], &p1);
  EXPECT_EQ(s.queued(Priority::proactive), 1u);
}

TEST(Scheduler, KvFullLeavesTheRequestFirstInItsQueue) {
  Scheduler s(4, 4);
  Request a = make_request(Priority::reactive, 4), b = make_request(Priority::reactive, 4);
  s.enqueue(&a);
  s.enqueue(&b);
  EXPECT_THROW(s.admit([](Request*) { throw Error(Errc::busy, "full"); }), Error);
  EXPECT_EQ(s.queued(), 2u);
  EXPECT_EQ(s.running(), 0u);
}

TEST(Scheduler, StepCarriesEveryDecodeTokenThenChunkedPrefill) {
  Scheduler s(8, 8);
  Request d1 = make_request(Priority::proactive, 3, true),
          d2 = make_request(Priority::reactive, 3, true);
  Request long_prompt = make_request(Priority::proactive, 50),
          short_prompt = make_request(Priority::reactive, 5);
  for (Request* r : {&d1, &d2, &long_prompt, &short_prompt}) s.enqueue(r);
  s.admit([](Request*) {});
  const StepBatch b = s.build(/*max_step_tokens=*/16);
  // Decode tokens first (reactive first), then prefill: reactive, then as much of the long
  // proactive prompt as the budget leaves.
  ASSERT_EQ(b.parts.size(), 4u);
  EXPECT_EQ(b.parts[0].request, &d2);
  EXPECT_EQ(b.parts[1].request, &d1);
  EXPECT_EQ(b.parts[2].request, &short_prompt);
  EXPECT_EQ(b.parts[2].n_tokens, 5u);
  EXPECT_EQ(b.parts[3].request, &long_prompt);
  EXPECT_EQ(b.parts[3].n_tokens, 9u);
  EXPECT_FALSE(b.entries[3].want_logits);  // not its last chunk
  EXPECT_TRUE(b.entries[2].want_logits);
  EXPECT_EQ(b.n_logit_rows, 3u);
}

TEST(Scheduler, MoreDecodersThanBudgetRotateSoNoneStarves) {
  Scheduler s(8, 8);
  std::vector<Request> rs;
  rs.reserve(3);
  for (int i = 0; i < 3; ++i) rs.push_back(make_request(Priority::reactive, 2, true));
  for (auto& r : rs) s.enqueue(&r);
  s.admit([](Request*) {});
  std::map<Request*, int> served;
  for (int step = 0; step < 3; ++step)
    for (const auto& p : s.build(2).parts) ++served[p.request];
  for (auto& r : rs) EXPECT_EQ(served[&r], 2);
}

// An eval asks for every position's logits: an entry per position. The engines take
// max_running entries a step, so its chunk is what the step's other entries leave of them.
TEST(Scheduler, AnEvalsChunkIsCutToTheEntriesAStepHas) {
  Scheduler s(/*max_running=*/4, 8);
  Request d = make_request(Priority::reactive, 3, true);
  Request e = make_request(Priority::reactive, 20);
  e.kind = RequestKind::eval;
  Request p = make_request(Priority::proactive, 6);
  for (Request* r : {&d, &e, &p}) s.enqueue(r);
  s.admit([](Request*) {});
  const StepBatch b = s.build(/*max_step_tokens=*/64);
  ASSERT_EQ(b.parts.size(), 2u);  // the decoder and 3 of the eval's positions; p waits
  EXPECT_EQ(b.parts[1].request, &e);
  EXPECT_EQ(b.parts[1].n_tokens, 3u);
  EXPECT_EQ(b.entries.size(), 4u);
  EXPECT_EQ(b.n_logit_rows, 4u);
}

}  // namespace
}  // namespace duet::frontend::testing
