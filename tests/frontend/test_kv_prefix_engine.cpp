// Prefix sharing in the program engine (issue 20 item 4; services/frontend/kv_share.h): a
// sequence borrows the published blocks its prompt starts with and computes only the rest, with
// the logits of a full prefill; writes into a borrowed page are refused; the last prompt token is
// always computed; cached blocks count as free for admission and are evicted when needed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"
#include "tests/support/error_code.h"
#include "tests/support/local_flags.h"

namespace duet::frontend {
namespace {

const std::string kStack = "kvprefix" + std::to_string(getpid());

std::unique_ptr<ProgramEngine> make_engine(const std::string& tag, bool sharing,
                                           uint32_t kv_pages = 0) {
  ProgramEngineOptions o;
  o.model_path = test_support::tiny_fortune_path("q8_0");
  o.stack_id = kStack;
  o.segment_tag = tag;
  o.plan_name = "gpu-only";
  o.buckets = {4, 32};
  o.max_seqs = 3;
  o.max_ctx = 128;
  o.kv_pages = kv_pages;
  o.prefix_sharing = sharing;
  return std::make_unique<ProgramEngine>(o, LlamaModel::load(o.model_path),
                                         make_interpreter_link("gpu"), nullptr);
}

std::vector<int32_t> tokens(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 250);
  return p;
}

// Prefills prompt[from..] of seq in steps of at most 32 tokens; the last step's logits.
std::vector<float> prefill(Engine& e, uint64_t seq, const std::vector<int32_t>& prompt,
                           int from = 0) {
  std::vector<float> logits;
  for (int pos = from; pos < static_cast<int>(prompt.size()); pos += 32) {
    const int n = std::min<int>(32, static_cast<int>(prompt.size()) - pos);
    logits = e.step(
        {{seq, std::vector<int32_t>(prompt.begin() + pos, prompt.begin() + pos + n), pos, true}},
        nullptr);
  }
  return logits;
}

using test_support::error_code_of;

TEST(KvPrefixEngine, ABorrowedPrefixGivesTheLogitsOfAFullPrefill) {
  std::vector<int32_t> system = tokens(40, 1);
  std::vector<int32_t> second(system.begin(), system.begin() + 32);  // two whole blocks
  for (int32_t t : tokens(10, 2)) second.push_back(t);

  auto unshared = make_engine("off", false);
  unshared->open_seq(9, 128);
  const std::vector<float> want = prefill(*unshared, 9, second);
  EXPECT_EQ(unshared->share_prefix(9, second), 0) << "sharing off";

  auto engine = make_engine("on", true);
  engine->open_seq(1, 128);
  prefill(*engine, 1, system);
  EXPECT_EQ(engine->status()["kv_prefix"]["published_blocks"], 2);

  engine->open_seq(2, 128);
  ASSERT_EQ(engine->share_prefix(2, second), 32);
  engine->reserve_seq(2, 64);
  const std::vector<float> got = prefill(*engine, 2, second, 32);
  ASSERT_EQ(got.size(), want.size());
  float max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) max_diff = std::max(max_diff, std::abs(got[i] - want[i]));
  EXPECT_LT(max_diff, 1e-4f) << "logits of the shared run differ from a full prefill";
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
            std::max_element(want.begin(), want.end()) - want.begin());

  nlohmann::json s = engine->status();
  EXPECT_EQ(s["kv_pages_shared"], 2) << s.dump();
  EXPECT_EQ(s["kv_pages_used"], 3 + 1) << "3 of sequence 1, 1 of its own: " << s.dump();
  EXPECT_EQ(s["kv_prefix"]["hit_tokens"], 32);
  engine->close_seq(1);
  s = engine->status();
  EXPECT_EQ(s["kv_pages_used"], 3) << "the borrowed blocks outlive their writer: " << s.dump();
  engine->close_seq(2);
  s = engine->status();
  EXPECT_EQ(s["kv_pages_used"], 0) << s.dump();
  EXPECT_EQ(s["kv_pages_shared"], 0) << s.dump();
  EXPECT_EQ(s["kv_pages_cached"], 2) << s.dump();
  EXPECT_EQ(s["kv_pages_free"], s["kv_pages_total"]) << s.dump();
}

TEST(KvPrefixEngine, NoStepWritesABorrowedPageAndTheLastPromptTokenIsComputed) {
  auto engine = make_engine("ro", true);
  const std::vector<int32_t> prompt = tokens(32, 3);
  engine->open_seq(1, 128);
  prefill(*engine, 1, prompt);
  engine->close_seq(1);

  engine->open_seq(2, 128);
  // The whole prompt is published, but its logits must come from a step: one block is kept.
  EXPECT_EQ(engine->share_prefix(2, prompt), 16);
  EXPECT_EQ(engine->share_prefix(2, prompt), 0) << "only an empty sequence borrows";
  prefill(*engine, 2, prompt, 16);  // its second block, in a page of its own
  const Errc rewrite = error_code_of([&] { engine->step({{2, {prompt[5]}, 5, true}}, nullptr); });
  EXPECT_EQ(rewrite, Errc::internal) << "position 5 is in a borrowed page";
  EXPECT_EQ(error_code_of([&] { engine->truncate_seq(2, 8); }), Errc::invalid_argument)
      << "the next write would land in the borrowed page";
  engine->truncate_seq(2, 16);  // a block boundary: fine
  engine->close_seq(2);
  EXPECT_EQ(engine->status()["kv_pages_used"], 0);
}

TEST(KvPrefixEngine, CachedBlocksCountAsFreeForAdmissionAndAreEvictedWhenNeeded) {
  auto engine = make_engine("evict", true, 8);  // 8 pages: one 128-position sequence
  engine->open_seq(1, 128);
  prefill(*engine, 1, tokens(40, 4));
  engine->close_seq(1);
  nlohmann::json s = engine->status();
  EXPECT_EQ(s["kv_pages_cached"], 2);
  EXPECT_EQ(s["kv_pages_free"], 8);

  engine->open_seq(3, 128);
  engine->reserve_seq(3, 128);  // the whole pool: the cached pages are promised too
  prefill(*engine, 3, tokens(128, 5));
  s = engine->status();
  EXPECT_EQ(s["kv_prefix"]["evictions"], 2) << s.dump();
  EXPECT_EQ(s["kv_pages_used"], 8) << s.dump();
  engine->close_seq(3);

  // A borrower may not take a cached page that is promised as free to someone else.
  engine->open_seq(4, 128);
  prefill(*engine, 4, tokens(40, 6));
  engine->close_seq(4);  // 2 cached blocks of tokens(40, 6)
  engine->open_seq(5, 128);
  engine->reserve_seq(5, 128);  // promised all 8 pages
  engine->open_seq(6, 128);
  EXPECT_EQ(engine->share_prefix(6, tokens(40, 6)), 0) << "its pages are promised to 5";
  EXPECT_EQ(engine->status()["kv_prefix"]["not_borrowed_promised"], 1);
  engine->close_seq(5);
  engine->close_seq(6);
}

// What a restarted frontend (issue 22) finds: the segment alone gives every sequence's page table,
// borrowed chain included, and the prefix index; adopted sequences go on sharing.
TEST(KvPrefixEngine, ARestartedFrontendAttachesThePoolWithItsSharingState) {
  auto engine = make_engine("restart", true);
  const std::vector<int32_t> prompt = tokens(40, 7);
  engine->open_seq(1, 128);
  prefill(*engine, 1, prompt);
  engine->open_seq(2, 128);
  ASSERT_EQ(engine->share_prefix(2, prompt), 32);
  prefill(*engine, 2, prompt, 32);

  std::shared_ptr<KvPool> pool = KvPool::attach(ProgramEngine::kv_name(kStack, "restart"));
  std::lock_guard lock(pool->mu);
  EXPECT_EQ(pool->index.size(), 2u);
  const std::vector<uint32_t> one = pool->pages->pages_of(1), two = pool->pages->pages_of(2);
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(std::vector<uint32_t>(two.begin(), two.begin() + 2),
            std::vector<uint32_t>(one.begin(), one.begin() + 2))
      << "sequence 2's table starts with 1's published blocks";
  pool->adopt_seq(2, 128, 40);
  EXPECT_EQ(pool->seqs.at(2).pages, 3u);
  EXPECT_EQ(pool->seqs.at(2).blocks_done, 2u);
  EXPECT_EQ(error_code_of([&] { pool->adopt_seq(3, 128, 20); }), Errc::out_of_range)
      << "holds nothing";
  const uint64_t live[] = {2};
  EXPECT_EQ(pool->pages->reclaim_except(live), 3u);
  EXPECT_EQ(pool->pages->counts().shared, 2u) << "2 still borrows 1's blocks";
  pool->seqs.emplace(4, KvPool::Sequence{128, 0});
  EXPECT_EQ(pool->share_prefix(4, prompt), 32) << "the rebuilt index matches";
}

// A frontend killed after a step published the block it completed and before its journal
// recorded that step: the restarted one adopts the sequence at the journal's n_past, inside the
// published block, and re-runs the step, which writes there again. Adoption unpublishes that
// block (nobody borrowed it) so the write is allowed; the blocks before it stay published.
TEST(KvPrefixEngine, AnAdoptedSequenceMayRewriteTheBlockItsLastStepPublished) {
  auto engine = make_engine("rerun", true);
  engine->open_seq(1, 128);
  prefill(*engine, 1, tokens(32, 8));  // positions 0..31 in one step: blocks 0 and 1 published
  std::shared_ptr<KvPool> pool = KvPool::attach(ProgramEngine::kv_name(kStack, "rerun"));
  std::lock_guard lock(pool->mu);
  const std::vector<uint32_t> table = pool->pages->pages_of(1);
  ASSERT_EQ(table.size(), 2u);
  ASSERT_NE(pool->pages->hash_of(table[1]), 0u);
  EXPECT_FALSE(pool->pages->writable_by(table[1], 1));
  pool->adopt_seq(1, 128, 31);  // the journal lags the step that wrote position 31
  EXPECT_TRUE(pool->pages->writable_by(table[1], 1)) << "the re-run step writes position 31 here";
  EXPECT_NE(pool->pages->hash_of(table[0]), 0u) << "block 0 stays published";
  EXPECT_EQ(pool->seqs.at(1).blocks_done, 1u);
  EXPECT_EQ(pool->pages->pages_of(1), table);
}

}  // namespace
}  // namespace duet::frontend
