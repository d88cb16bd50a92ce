// KV pages shared between sequences (issue 20 item 4): blocks published and matched by their
// tokens, borrowed chains in page tables, cached pages evicted least recently used first, the
// sharing state recovered from the segment after a kill -9, and the invariant that a shared page
// is never written by two sequences (a randomised run of many sequences checks it at every write).
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <random>
#include <set>

#include "core/base/error.h"
#include "shm/kv_pages.h"
#include "shm/segment.h"
#include "tests/shm/child_process.h"
#include "tests/support/error_code.h"

namespace duet::shm {
namespace {

using Pages = std::vector<uint32_t>;
using Tokens = std::vector<int32_t>;

using test_support::error_code_of;

const Tokens kSystem = {1, 10, 11, 12, 13, 14, 15, 16};  // two blocks of 4 tokens

class KvSharingTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kPages = 8;
  static constexpr uint32_t kTokens = 4;  // per page
  static constexpr uint64_t kPageBytes = 256;
  void SetUp() override {
    remove_stack_segments(stack);
    segment = Segment::create(name, KvPages::bytes_for(kPages, kPageBytes, kTokens),
                              Lifetime::unlink_on_destroy);
  }
  void TearDown() override { remove_stack_segments(stack); }
  KvPages fresh() { return KvPages::format(segment, kPages, kPageBytes, kTokens); }
  // Owner 7 has 3 pages and published the system prompt in the first two; owner 9 borrows
  // those two and has one page of its own (page 3).
  KvPages writer_and_borrower() {
    KvPages kv = fresh();
    kv.alloc(3, 7);
    kv.publish(7, 0, KvPages::kNoPage, std::span(kSystem).first(kTokens));
    kv.publish(7, 1, 0, std::span(kSystem).subspan(kTokens));
    kv.borrow(9, Pages{0, 1});
    kv.alloc(1, 9);
    return kv;
  }
  // Matches prompt block by block as the frontend does: the borrowable chain.
  static Pages match(const KvPages& kv, const Tokens& prompt) {
    Pages chain;
    uint64_t hash = 0;
    for (size_t b = 0; (b + 1) * kTokens <= prompt.size(); ++b) {
      std::span<const int32_t> block(prompt.data() + b * kTokens, kTokens);
      hash = KvPages::block_hash(hash, block);
      const uint32_t page =
          kv.find_block(hash, chain.empty() ? KvPages::kNoPage : chain.back(), block);
      if (page == KvPages::kNoPage) break;
      chain.push_back(page);
    }
    return chain;
  }
  const std::string stack = testing::test_stack_id();
  const std::string name = segment_name(stack, "kv");
  Segment segment;
};

TEST_F(KvSharingTest, ABorrowerReadsTheWritersBlocksAndWritesOnlyItsOwnPages) {
  KvPages kv = fresh();
  EXPECT_EQ(kv.alloc(3, 7), (Pages{0, 1, 2}));  // sequence 7: the system prompt and a question
  kv.publish(7, 0, KvPages::kNoPage, std::span(kSystem).first(kTokens));
  kv.publish(7, 1, 0, std::span(kSystem).subspan(kTokens));
  EXPECT_FALSE(kv.writable_by(0, 7)) << "a published page is read-only, even for its writer";
  EXPECT_TRUE(kv.writable_by(2, 7));

  Tokens prompt = kSystem;
  prompt.insert(prompt.end(), {20, 21, 22});
  const Pages chain = match(kv, prompt);
  EXPECT_EQ(chain, (Pages{0, 1}));
  kv.borrow(9, chain);
  EXPECT_EQ(kv.pages_of(9), (Pages{0, 1})) << "the page table starts with the borrowed chain";
  EXPECT_EQ(kv.alloc(1, 9), (Pages{3}));
  EXPECT_EQ(kv.pages_of(9), (Pages{0, 1, 3}));
  EXPECT_EQ(kv.owners(), (std::vector<uint64_t>{7, 9}));
  EXPECT_EQ(kv.refs_of(0), 1u);
  EXPECT_FALSE(kv.writable_by(1, 9));
  EXPECT_TRUE(kv.writable_by(3, 9));
  const KvPages::Counts c = kv.counts();
  EXPECT_EQ(c.used, 4u);
  EXPECT_EQ(c.shared, 2u);
  EXPECT_EQ(c.free, 4u);

  // Same hash is not enough: the parent page and the tokens must match too.
  const uint64_t h0 = KvPages::block_hash(0, std::span(kSystem).first(kTokens));
  const uint64_t h1 = KvPages::block_hash(h0, std::span(kSystem).subspan(kTokens));
  EXPECT_EQ(kv.find_block(h1, 0, std::span(kSystem).subspan(kTokens)), 1u);
  EXPECT_EQ(kv.find_block(h1, 2, std::span(kSystem).subspan(kTokens)), KvPages::kNoPage);
  const Tokens other = {10, 11, 12, 99};
  EXPECT_EQ(kv.find_block(h1, 0, other), KvPages::kNoPage);
  EXPECT_EQ(kv.find_block(h1, 0, std::span(kSystem).subspan(kTokens), 1), 1u) << "a good hint";
  EXPECT_EQ(kv.find_block(h1, 0, std::span(kSystem).subspan(kTokens), 2), KvPages::kNoPage);

  // Misuse is refused, naming it.
  EXPECT_EQ(error_code_of([&] { kv.publish(9, 0, KvPages::kNoPage, std::span(kSystem).first(4)); }),
            Errc::invalid_argument)
      << "a borrower cannot publish its writer's page";
  EXPECT_EQ(error_code_of([&] { kv.borrow(9, chain); }), Errc::invalid_argument) << "twice";
  const Pages broken = {1, 0};
  EXPECT_EQ(error_code_of([&] { kv.borrow(11, broken); }), Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { kv.publish(7, 2, 1, Tokens{1, 2}); }), Errc::invalid_argument);
}

TEST_F(KvSharingTest, PagesOutliveTheirWriterWhileBorrowedAndAreCachedWhenTheLastUserEnds) {
  KvPages kv = writer_and_borrower();
  EXPECT_EQ(kv.free_owner(7), 3u);
  EXPECT_EQ(kv.owner_of(0), KvPages::kCached);
  EXPECT_EQ(kv.owner_of(2), KvPages::kFree) << "its unpublished page is freed at once";
  EXPECT_EQ(kv.pages_of(9), (Pages{0, 1, 3})) << "the borrower keeps reading them";
  EXPECT_EQ(kv.counts().used, 3u);

  EXPECT_EQ(kv.free_owner(9), 3u);
  KvPages::Counts c = kv.counts();
  EXPECT_EQ(c.used, 0u) << "no page outlives its last user as used";
  EXPECT_EQ(c.cached, 2u);
  EXPECT_EQ(c.shared, 0u);
  EXPECT_EQ(kv.available(), kPages);
  EXPECT_TRUE(kv.owners().empty());

  // A later request with the same prefix finds the cached blocks...
  EXPECT_EQ(match(kv, kSystem), (Pages{0, 1}));
  // ...until the pool needs them: alloc takes free pages first, then evicts the cached ones.
  EXPECT_EQ(kv.alloc(6, 11).size(), 6u);
  EXPECT_EQ(kv.evictions(), 0u);
  EXPECT_EQ(kv.alloc(2, 11).size(), 2u);
  EXPECT_EQ(kv.evictions(), 2u);
  EXPECT_TRUE(match(kv, kSystem).empty());
  EXPECT_EQ(error_code_of([&] { kv.alloc(1, 12); }), Errc::busy);
}

TEST_F(KvSharingTest, EvictionTakesTheLeastRecentlyUsedLeafFirstAndItsOrphansWithIt) {
  KvPages kv = fresh();
  const Tokens a = {1, 2, 3, 4, 5, 6, 7, 8};
  const Tokens b = {9, 9, 9, 9};
  kv.alloc(2, 7);  // pages 0, 1: a's two blocks
  kv.publish(7, 0, KvPages::kNoPage, std::span(a).first(4));
  kv.publish(7, 1, 0, std::span(a).subspan(4));
  kv.alloc(1, 8);  // page 2: b
  kv.publish(8, 2, KvPages::kNoPage, b);
  kv.free_owner(7);
  kv.free_owner(8);  // b's page was used last
  kv.alloc(5, 20);   // the free pages
  EXPECT_EQ(kv.alloc(1, 21), (Pages{1})) << "a's deeper block goes first";
  EXPECT_EQ(match(kv, a), (Pages{0}));
  EXPECT_EQ(match(kv, b), (Pages{2}));
  kv.borrow(22, Pages{2});  // touch b: a's first block is now the oldest
  kv.free_owner(22);
  EXPECT_EQ(kv.alloc(1, 23), (Pages{0}));
  EXPECT_EQ(match(kv, b), (Pages{2}));
  EXPECT_EQ(kv.evictions(), 2u);
}

TEST_F(KvSharingTest, TruncateNeverLeavesTheAppendPositionInASharedPage) {
  KvPages kv = writer_and_borrower();
  EXPECT_EQ(error_code_of([&] { kv.truncate(9, 6); }), Errc::invalid_argument)
      << "position 6 is in borrowed page 1";
  EXPECT_EQ(error_code_of([&] { kv.truncate(7, 2); }), Errc::invalid_argument)
      << "position 2 is in page 0, which 9 borrows";
  kv.truncate(9, 4);  // a block boundary: block 1 is dropped from its chain
  EXPECT_EQ(kv.pages_of(9), (Pages{0}));
  EXPECT_EQ(kv.refs_of(1), 0u);
  EXPECT_EQ(kv.borrowed_blocks(9), 1u);
  kv.truncate(7, 6);  // nobody borrows page 1 now: 7 may rewrite it
  EXPECT_TRUE(kv.writable_by(1, 7));
  EXPECT_EQ(kv.pages_of(7), (Pages{0, 1}));
  EXPECT_EQ(kv.owner_of(2), KvPages::kFree);
}

TEST_F(KvSharingTest, ARestartedFrontendFindsOwnersBorrowsAndPublishedBlocksInTheSegment) {
  fresh();
  pid_t frontend = testing::fork_child([&] {
    Segment mine = Segment::open(name);
    KvPages kv = KvPages::attach(mine);
    kv.alloc(3, 101);
    kv.publish(101, 0, KvPages::kNoPage, std::span(kSystem).first(kTokens));
    kv.publish(101, 1, 0, std::span(kSystem).subspan(kTokens));
    kv.borrow(102, Pages{0, 1});
    kv.alloc(1, 102);
    kv.borrow(103, Pages{0});
    kill(getpid(), SIGKILL);
    return 0;
  });
  ASSERT_EQ(testing::wait_child(frontend).signal, SIGKILL);
  KvPages kv = KvPages::attach(segment);
  EXPECT_EQ(kv.owners(), (std::vector<uint64_t>{101, 102, 103}));
  EXPECT_EQ(kv.pages_of(102), (Pages{0, 1, 3}));
  EXPECT_EQ(kv.pages_of(103), (Pages{0}));
  EXPECT_EQ(kv.published().size(), 2u);
  EXPECT_EQ(match(kv, kSystem), (Pages{0, 1})) << "the index is rebuilt from the segment";
  const uint64_t live[] = {102};
  EXPECT_EQ(kv.reclaim_except(live), 4u);  // 101's three pages, 103's borrowed one
  EXPECT_EQ(kv.refs_of(0), 1u);
  EXPECT_EQ(kv.owner_of(0), KvPages::kCached);
  EXPECT_EQ(kv.pages_of(102), (Pages{0, 1, 3}));
  kv.free_owner(102);
  EXPECT_EQ(kv.counts().used, 0u);
  EXPECT_EQ(kv.available(), kPages);
}

// Many sequences grow token by token from prompts with common prefixes; each matches what is
// published, borrows it, appends where its page table says and publishes its complete blocks.
// At every write the page must be the writer's alone, and no page is ever written by two
// sequences between its allocation and its reuse.
TEST_F(KvSharingTest, NoPageIsEverWrittenByTwoSequences) {
  KvPages kv = fresh();
  std::mt19937 rng(20);
  struct Seq {
    Tokens tokens;  // the whole prompt + output
    size_t n_past = 0;
  };
  std::map<uint64_t, Seq> live;
  std::map<uint32_t, std::set<uint64_t>> writers;  // since the page was last allocated
  uint64_t next_id = 1;
  int writes = 0, borrows = 0;
  for (int it = 0; it < 3000; ++it) {
    if (live.size() < 3 && rng() % 3 == 0) {
      Seq s;
      const int n = 4 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) s.tokens.push_back(i < 8 ? (rng() % 4 ? i : 50) : rng() % 5);
      const uint64_t id = next_id++;
      Pages chain = match(kv, s.tokens);
      if (chain.size() * kTokens >= s.tokens.size()) chain.pop_back();  // one token to compute
      kv.borrow(id, chain);
      borrows += chain.empty() ? 0 : 1;
      s.n_past = chain.size() * kTokens;
      live[id] = s;
    } else if (!live.empty()) {
      auto seq = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      const uint64_t id = seq->first;
      Seq& s = seq->second;
      if (s.n_past == s.tokens.size() || rng() % 20 == 0) {
        kv.free_owner(id);
        live.erase(seq);
        continue;
      }
      Pages table = kv.pages_of(id);
      const size_t block = s.n_past / kTokens;
      if (block == table.size()) {
        try {
          kv.alloc(1, id);
        } catch (const Error&) {
          continue;  // full: another sequence ends first
        }
        table = kv.pages_of(id);
        writers[table[block]].clear();
      }
      const uint32_t page = table[block];
      ASSERT_TRUE(kv.writable_by(page, id)) << "sequence " << id << " writes page " << page;
      writers[page].insert(id);
      ASSERT_EQ(writers[page].size(), 1u) << "page " << page << " written by two sequences";
      ++writes;
      if (++s.n_past % kTokens == 0)
        kv.publish(id, page, block == 0 ? KvPages::kNoPage : table[block - 1],
                   std::span(s.tokens).subspan(block * kTokens, kTokens));
    }
  }
  EXPECT_GT(writes, 1000);
  EXPECT_GT(borrows, 20) << "the run shared prefixes";
  for (auto& [id, s] : live) kv.free_owner(id);
  EXPECT_EQ(kv.counts().used, 0u);
  EXPECT_EQ(kv.available(), kPages);
}

}  // namespace
}  // namespace duet::shm
