// The KV pool sized by a memory budget (core/model/kv_budget.h): pages from the budget, capped by
// what the stack's sequences could use, refused with the numbers when one sequence does not fit.
#include <gtest/gtest.h>

#include <string>

#include "core/base/error.h"
#include "core/model/kv_budget.h"
#include "core/model/shapes.h"
#include "tests/support/error_code.h"

namespace duet {
namespace {

using test_support::error_code_of;

KvPoolRequest llama32_1b(uint64_t budget, uint32_t bytes_per_value) {
  const ModelShape& s = model_shape("llama3.2-1b");
  KvPoolRequest r;
  r.n_layer = s.n_layer;
  r.kv_dim = s.n_head_kv * (s.n_embd / s.n_head);
  r.model_ctx = s.n_ctx;
  r.max_seqs = 16;
  r.sharers = 2;
  r.bytes_per_value = bytes_per_value;
  r.budget_bytes = budget;
  return r;
}

TEST(KvBudget, PagesComeFromTheBudgetNotFromSequencesTimesContext) {
  const KvPoolPlan p = plan_kv_pool(llama32_1b(uint64_t{6} << 30, 2));
  EXPECT_EQ(p.ctx, 131072u);                        // the model's full trained context
  EXPECT_EQ(p.bytes_per_token, 2u * 16 * 512 * 2);  // 2 x layers x kv_dim x 2 at f16
  EXPECT_EQ(p.page_bytes, p.bytes_per_token * 16);
  EXPECT_EQ(p.pages_per_seq, 131072u / 16);
  EXPECT_EQ(p.n_pages, (uint64_t{6} << 30) / p.page_bytes);  // 32 x 131072 would be 128 GiB
  EXPECT_LE(p.pool_bytes, uint64_t{6} << 30);
}

// q8_0 counts its real bytes: 34 per block of 32 values (an f16 scale and 32 int8).
TEST(KvBudget, Q8_0CountsThirtyFourBytesPerThirtyTwoValues) {
  KvPoolRequest r = llama32_1b(uint64_t{6} << 30, 34);
  r.values_per_block = 32;
  const KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.bytes_per_token, 2u * 16 * 512 / 32 * 34);  // 17408: 53% of f16's 32768
  EXPECT_EQ(p.n_pages, (uint64_t{6} << 30) / p.page_bytes);
  EXPECT_EQ(parse_kv_type("q8_0"), DType::Q8_0);
  r.kv_dim = 500;  // not whole blocks
  EXPECT_THROW(plan_kv_pool(r), Error);
}

TEST(KvBudget, SmallModelsTakeNoMoreThanTheirSequencesCanUse) {
  KvPoolRequest r;
  r.n_layer = 6;
  r.kv_dim = 128;
  r.model_ctx = 512;
  r.max_seqs = 16;
  r.sharers = 2;
  r.budget_bytes = uint64_t{4} << 30;
  const KvPoolPlan p = plan_kv_pool(r);
  EXPECT_EQ(p.n_pages, 2u * 16 * (512 / 16));
}

TEST(KvBudget, ABudgetBelowOneSequenceIsRefusedWithTheNumbers) {
  std::string what;  // one f32 sequence of the 1B (131072 tokens) is 8 GiB
  EXPECT_EQ(error_code_of([] { plan_kv_pool(llama32_1b(uint64_t{1} << 30, 4)); }, &what),
            Errc::invalid_argument);
  EXPECT_NE(what.find("less than one sequence"), std::string::npos) << what;
  EXPECT_NE(what.find("131072"), std::string::npos) << what;
  EXPECT_NE(what.find("--kv-memory"), std::string::npos) << what;
  // A smaller context (DUET_MAX_CTX) fits the same budget.
  KvPoolRequest shorter = llama32_1b(uint64_t{1} << 30, 4);
  shorter.max_ctx = 4096;
  EXPECT_EQ(plan_kv_pool(shorter).ctx, 4096u);
}

TEST(KvBudget, NoLayerRegionPastTheLargestBuffer) {
  KvPoolRequest r = llama32_1b(uint64_t{1} << 40, 2);
  const KvPoolPlan p = plan_kv_pool(r);
  EXPECT_LE(uint64_t{p.n_pages} * (p.page_bytes / 16), kMaxKvLayerBytes);
}

TEST(KvBudget, MemorySizesParseAndNonsenseIsNamed) {
  EXPECT_EQ(parse_memory_size("4G"), uint64_t{4} << 30);
  EXPECT_EQ(parse_memory_size("512MiB"), uint64_t{512} << 20);
  EXPECT_EQ(parse_memory_size("1.5g"), uint64_t{3} << 29);
  EXPECT_EQ(parse_memory_size("1048576"), uint64_t{1} << 20);
  for (const char* bad : {"", "lots", "4X", "-1G", "0", "4GG"}) {
    try {
      parse_memory_size(bad);
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos);
    }
  }
  EXPECT_GT(default_kv_memory_bytes(), 0u);
}

// Several models, one budget (issue 25): shares in proportion to one full sequence of each, so
// every model holds the same number of sequences; a model capped lower leaves the rest to others.
TEST(KvBudget, SeveralModelsDivideOneBudgetBySequenceBytes) {
  const uint64_t budget = uint64_t{6} << 30;
  KvPoolRequest big = llama32_1b(budget, 2);
  KvPoolRequest half = big;
  half.kv_dim /= 2;  // half the bytes per token
  const auto plans = plan_kv_pools({big, half}, budget);
  ASSERT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans[0].budget_bytes + plans[1].budget_bytes, budget);
  EXPECT_NEAR(double(plans[0].budget_bytes) / double(plans[1].budget_bytes), 2.0, 1e-6);
  EXPECT_EQ(plans[0].n_pages / plans[0].pages_per_seq, plans[1].n_pages / plans[1].pages_per_seq)
      << "both hold the same number of full sequences";
  EXPECT_LE(plans[0].pool_bytes + plans[1].pool_bytes, budget);
  // One model: the whole budget, exactly plan_kv_pool's pool.
  EXPECT_EQ(plan_kv_pools({big}, budget)[0].n_pages, plan_kv_pool(big).n_pages);

  // A model whose sequences use at most 1 MiB takes that; the other gets the rest.
  KvPoolRequest tiny = half;
  tiny.model_ctx = 64;
  tiny.max_seqs = 1;
  tiny.sharers = 1;
  const auto capped = plan_kv_pools({tiny, big}, budget);
  EXPECT_EQ(capped[0].n_pages, capped[0].pages_per_seq);
  EXPECT_EQ(capped[0].budget_bytes, capped[0].pool_bytes);
  EXPECT_EQ(capped[1].budget_bytes, budget - capped[0].pool_bytes);

  // A share too small for one sequence names the model.
  try {
    (void)plan_kv_pools({big, big}, uint64_t{5} << 30);
    FAIL() << "2.5 GiB holds no 4 GiB sequence";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model 0: "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace duet
