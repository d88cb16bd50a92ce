// The request journal (services/frontend/request_journal.h): what a killed frontend's successor
// reads back is exactly the last committed progress of each request; a slot caught half-way
// through a write falls back to its previous copy, and one with no valid copy is discarded.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "services/frontend/request_journal.h"
#include "tests/support/error_code.h"

namespace duet::frontend {
namespace {

const RequestJournal::Geometry kGeometry{4, 64, RequestJournal::static_bytes_for(16, 256)};

// Journal memory that outlives the RequestJournal objects, as the shm segment outlives a
// killed frontend.
struct Memory {
  Memory() : bytes(RequestJournal::bytes_for(kGeometry)) {
    data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64)));
  }
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  uint64_t bytes;
  std::unique_ptr<uint8_t, Free> data;
};

JournalRecord request(uint64_t id) {
  JournalRecord r;
  r.routing = {std::string("\x01identity-of-a-client", 21)};
  r.client_request_id = id;
  r.seq_id = 100 + id;
  r.priority = 1;
  r.stream = true;
  r.ignore_eos = true;
  r.logprobs = 5;
  r.max_tokens = 20;
  r.max_positions = 30;
  r.heartbeat_ms = 1000;
  r.sampling = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 1234};
  r.stop = {"\n\n", "END"};
  r.prompt = {1, 2, 3, 4, 5};
  return r;
}

// (The progress views `generated`: keep it alive while the progress is used.)
JournalProgress progress(const std::vector<int32_t>& generated, int32_t pos) {
  JournalProgress p;
  p.generated = generated;
  p.n_prefilled = 5;
  p.pos = pos;
  p.next_token = generated.empty() ? std::nullopt : std::optional<int32_t>(generated.back());
  p.draws = generated.size();
  return p;
}

TEST(RequestJournal, ASuccessorReadsBackEveryRequestAtItsLastCommittedStep) {
  Memory mem;
  std::vector<int32_t> generated = {7, 8, 9};
  {
    RequestJournal writer(mem.data.get(), mem.bytes, kGeometry, true);
    const auto a = writer.begin(request(1));
    const auto b = writer.begin(request(2));
    ASSERT_TRUE(a && b);
    writer.update(*a, progress({7}, 5));
    writer.update(*a, progress({7, 8}, 6));
    writer.update(*a, progress(generated, 7));
    const std::vector<int32_t> last = {42};
    JournalProgress done = progress(last, 5);
    done.finish_reason = "stop";
    writer.update(*b, done);
  }  // killed: nothing is cleaned up
  RequestJournal successor(mem.data.get(), mem.bytes, kGeometry, false);
  std::vector<JournalRecord> got = successor.recover();
  ASSERT_EQ(got.size(), 2u);
  const JournalRecord& r = got[0].client_request_id == 1 ? got[0] : got[1];
  const JournalRecord want = request(1);
  EXPECT_EQ(r.state, JournalRecord::State::live);
  EXPECT_EQ(r.routing, want.routing);
  EXPECT_EQ(r.seq_id, want.seq_id);
  EXPECT_EQ(r.priority, 1);
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.logprobs, 5);
  EXPECT_EQ(r.max_tokens, 20);
  EXPECT_EQ(r.max_positions, 30);
  EXPECT_EQ(r.heartbeat_ms, 1000u);
  EXPECT_EQ(r.sampling.seed, 1234u);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
  EXPECT_EQ(r.stop, want.stop);
  EXPECT_EQ(r.prompt, want.prompt);
  EXPECT_EQ(r.generated, generated);
  EXPECT_EQ(r.pos, 7);
  EXPECT_EQ(r.next_token, std::optional<int32_t>(9));
  EXPECT_EQ(r.draws, 3u);
  const JournalRecord& f = got[0].client_request_id == 2 ? got[0] : got[1];
  EXPECT_EQ(f.state, JournalRecord::State::finished);
  EXPECT_EQ(f.finish_reason, "stop");
  EXPECT_EQ(f.generated, std::vector<int32_t>{42});

  // The successor goes on writing where the killed one stopped.
  successor.adopt(r);
  generated.push_back(10);
  successor.update(r.slot, progress(generated, 8));
  RequestJournal third(mem.data.get(), mem.bytes, kGeometry, false);
  got = third.recover();
  ASSERT_EQ(got.size(), 2u);
  for (const auto& x : got) {
    if (x.client_request_id == 1) {
      EXPECT_EQ(x.generated, generated);
    }
  }
}

TEST(RequestJournal, AHalfWrittenCopyIsNeverTrustedThePreviousOneIs) {
  Memory mem;
  uint32_t slot = 0;
  {
    RequestJournal writer(mem.data.get(), mem.bytes, kGeometry, true);
    slot = *writer.begin(request(1));
    writer.update(slot, progress({7}, 5));
    writer.update(slot, progress({7, 8}, 6));
  }
  // A writer killed in the middle of the next update: the copy it was writing has its commit
  // word zeroed and half its fields; here the fields are garbage with a stale commit instead,
  // which the copy's crc must catch.
  uint8_t* slot_base = mem.data.get() + 64 +
                       slot * ((RequestJournal::bytes_for(kGeometry) - 64) / kGeometry.n_slots);
  // Copies alternate A (begin), B, A: the newest is copy A; scribble over its progress fields.
  std::memset(slot_base + 16, 0x5A, 40);
  RequestJournal successor(mem.data.get(), mem.bytes, kGeometry, false);
  const std::vector<JournalRecord> got = successor.recover();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].generated, std::vector<int32_t>{7}) << "the older, intact copy";
  EXPECT_EQ(got[0].pos, 5);
}

TEST(RequestJournal, ASlotWithNoValidCopyIsDiscardedAndFreed) {
  Memory mem;
  uint32_t slot = 0;
  {
    RequestJournal writer(mem.data.get(), mem.bytes, kGeometry, true);
    slot = *writer.begin(request(1));
    writer.update(slot, progress({7}, 5));
  }
  // The ids both copies check are damaged (a write torn across the static area or the ids).
  const uint64_t slot_bytes = (RequestJournal::bytes_for(kGeometry) - 64) / kGeometry.n_slots;
  uint8_t* ids = mem.data.get() + 64 + slot * slot_bytes + 256 + kGeometry.static_bytes;
  ids[0] ^= 0xFF;
  RequestJournal successor(mem.data.get(), mem.bytes, kGeometry, false);
  EXPECT_TRUE(successor.recover().empty());
  EXPECT_EQ(successor.live_slots(), 0u);
  // ...and the slot is usable again.
  EXPECT_TRUE(successor.begin(request(2)).has_value());
}

TEST(RequestJournal, RequestsThatDoNotFitAreNotJournaledAndSlotsAreBounded) {
  Memory mem;
  RequestJournal j(mem.data.get(), mem.bytes, kGeometry, true);
  JournalRecord big = request(1);
  big.max_tokens = 60;  // 5 + 60 ids > 64 per slot
  EXPECT_FALSE(j.begin(big).has_value());
  for (uint64_t id = 1; id <= kGeometry.n_slots; ++id) ASSERT_TRUE(j.begin(request(id)));
  EXPECT_FALSE(j.begin(request(99)).has_value()) << "every slot is live";
  EXPECT_EQ(j.live_slots(), kGeometry.n_slots);
  // A finished record gives its slot to a new request.
  const std::vector<int32_t> last = {3};
  JournalProgress done = progress(last, 5);
  done.finish_reason = "length";
  j.update(0, done);
  EXPECT_EQ(j.begin(request(99)), std::optional<uint32_t>(0));
}

TEST(RequestJournal, AnotherGeometrysSegmentIsRefused) {
  Memory mem;
  RequestJournal j(mem.data.get(), mem.bytes, kGeometry, true);
  RequestJournal::Geometry other = kGeometry;
  other.max_ids = 32;
  EXPECT_EQ(
      test_support::error_code_of([&] { RequestJournal(mem.data.get(), mem.bytes, other, false); }),
      Errc::bad_format);
}

// What a step pays per request for being resumable (printed; bench/chaos/RESULTS.md).
TEST(RequestJournal, AnUpdateCostsAFractionOfADecodeStep) {
  Memory mem;
  RequestJournal j(mem.data.get(), mem.bytes, kGeometry, true);
  const uint32_t slot = *j.begin(request(1));
  std::vector<int32_t> generated;
  constexpr int kRounds = 20000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kRounds; ++i) {
    if (generated.size() < 20) generated.push_back(i);
    j.update(slot, progress(generated, 4 + static_cast<int32_t>(generated.size())));
  }
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      kRounds;
  std::printf("[journal] one update (128-byte copy, crc32s, new ids): %.0f ns\n", ns);
  EXPECT_LT(ns, 20000) << "a journal update must not cost a decode step's time";
}

}  // namespace
}  // namespace duet::frontend
