// Symbolic shapes (core/program/symbolic.h): the expressions, the slot-reuse rule, the arena the
// builder plans with them, and one symbolic program giving the bits of per-bucket programs.
#include <gtest/gtest.h>

#include <cstring>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/program/program.h"
#include "core/program/symbolic.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet {
namespace {

const SymExpr N = SymExpr::symbol(Sym::tokens);
const SymExpr S = SymExpr::symbol(Sym::seqs);
const SymExpr P = SymExpr::symbol(Sym::pages);

TEST(SymExpr, EvaluatesSumsOfProductsOfSymbols) {
  const SymExpr e = N * 4096 + S * P * 4 + SymExpr::constant(64);
  EXPECT_EQ(e.eval(SymValues{3, 2, 5}), 3u * 4096 + 2 * 5 * 4 + 64);
  EXPECT_EQ(e.eval(SymValues{0, 0, 0}), 64u);
  EXPECT_EQ(e.str(), "4*S*P + 4096*N + 64");
  EXPECT_EQ(SymExpr().str(), "0");
  EXPECT_TRUE(SymExpr::constant(7).is_constant());
  EXPECT_FALSE(e.is_constant());
  // Monomial values computed once give the same value as evaluating from the symbols.
  EXPECT_EQ(e.eval(monomial_values({3, 2, 5})), e.eval(SymValues{3, 2, 5}));
}

TEST(SymExpr, ASquaredSymbolIsNotAMonomial) {
  EXPECT_THROW((void)(N * N), Error);
  EXPECT_NO_THROW((void)(N * S * P));
}

TEST(SymExpr, FromCoefsRoundTripsAndRefusesAnotherLength) {
  const SymExpr e = N * 256 + S * 8;
  EXPECT_EQ(SymExpr::from_coefs(e.coefs()), e);
  const std::vector<uint64_t> seven(7, 1);
  EXPECT_THROW(SymExpr::from_coefs(seven), Error);
}

TEST(SymExpr, AlignedIsAtLeastTheExpressionAndAMultipleAtEveryValue) {
  const SymExpr e = N * 100 + S * P * 4 + SymExpr::constant(10);
  const SymExpr a = e.aligned(64);
  EXPECT_TRUE(provably_le(e, a));
  for (uint64_t n : {1u, 3u, 17u, 64u})
    for (uint64_t s : {1u, 5u})
      for (uint64_t p : {1u, 9u}) {
        EXPECT_GE(a.eval(SymValues{n, s, p}), e.eval(SymValues{n, s, p}));
        EXPECT_EQ(a.eval(SymValues{n, s, p}) % 64, 0u);
      }
}

// The paper's examples: "N" * 4096 against "N" * 32 * 128 (equal: reusable), against
// "sumN" * 2 * 128 (here S*P*256: no relation, never reused).
TEST(ProvablyLe, ThePapersExamples) {
  EXPECT_TRUE(provably_le(N * 4096, N * 32 * 128));
  EXPECT_TRUE(provably_le(N * 32 * 128, N * 4096));
  EXPECT_FALSE(provably_le(N * 4096, S * P * 256));
  EXPECT_FALSE(provably_le(S * P * 256, N * 4096));
}

TEST(ProvablyLe, SameSymbolsWithSmallerCoefficients) {
  EXPECT_TRUE(provably_le(N * 512, N * 2048));
  EXPECT_FALSE(provably_le(N * 2048, N * 512));
  EXPECT_TRUE(provably_le(N * 512, N * 512 + S * 4));
  // A constant is no bound for a symbol, nor a symbol for a constant, whatever the values.
  EXPECT_FALSE(provably_le(N * 4, SymExpr::constant(1 << 30)));
  EXPECT_FALSE(provably_le(SymExpr::constant(4), N * 4096));
}

TEST(PlanSlots, ReusesAFreeSlotWhoseSizeProvablyHoldsTheTensor) {
  // a [0,1], b [1,2], c [2,3] (a is dead before c), d [3,4]: c fits a's slot; d is bigger than
  // every free slot; e is incomparable with them all.
  const std::vector<SymTensor> t = {
      {N * 4096, 0, 1}, {N * 1024, 1, 2}, {N * 4096, 2, 3}, {N * 8192, 3, 4}, {S * P * 4, 5, 5}};
  const SlotPlan plan = plan_slots(t, SymExpr{}, {64, 16, 8}, true);
  EXPECT_EQ(plan.slot_of[0], plan.slot_of[2]);  // a's slot, free once a's last access is done
  EXPECT_NE(plan.slot_of[1], plan.slot_of[2]);  // b is still live at c's first access
  EXPECT_NE(plan.slot_of[3], plan.slot_of[0]);  // d (8192 N) fits no slot: a slot of its own
  EXPECT_NE(plan.slot_of[3], plan.slot_of[1]);
  for (size_t k = 0; k < t.size() - 1; ++k) EXPECT_NE(plan.slot_of[4], plan.slot_of[k]);
  EXPECT_EQ(plan.size.size(), 4u);
  // Slots follow one another at every value of the symbols.
  for (size_t k = 0; k + 1 < plan.size.size(); ++k)
    EXPECT_EQ(plan.offset[k + 1], plan.offset[k] + plan.size[k]);
  EXPECT_EQ(plan.end, plan.offset.back() + plan.size.back());
}

TEST(PlanSlots, PicksTheSmallestSlotThatHolds) {
  // Two free slots hold the third tensor: the smaller one (at the largest values) takes it.
  const std::vector<SymTensor> t = {{N * 8192, 0, 0}, {N * 2048, 0, 0}, {N * 1024, 1, 1}};
  const SlotPlan plan = plan_slots(t, SymExpr{}, {64, 1, 1}, true);
  EXPECT_EQ(plan.slot_of[2], plan.slot_of[1]);
}

TEST(PlanSlots, WithoutReuseEveryTensorHasItsSlot) {
  const std::vector<SymTensor> t = {{N * 64, 0, 0}, {N * 64, 1, 1}, {N * 64, 2, 2}};
  const SlotPlan plan = plan_slots(t, SymExpr::constant(100), {64, 1, 1}, false);
  EXPECT_EQ(plan.size.size(), 3u);
  EXPECT_EQ(plan.offset[0], SymExpr::constant(128));  // the base, 64-aligned
  EXPECT_EQ(plan.end.str(), "192*N + 128");
}

using test_support::tiny_fortune_path;

ProgramSpec spec_for(const LlamaModel& m, Plan plan, uint32_t max_tokens, bool reuse = true) {
  ProgramSpec spec = test_support::program_spec(m, std::move(plan), max_tokens, 128, "sym");
  spec.reuse_slots = reuse;
  return spec;
}

TEST(SymbolicArena, SlotsAreReusedAndTheArenaIsSizedForTheLargestStep) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  const LlamaHparams& hp = m->hp();
  const BuiltPrograms reused = build_programs(spec_for(*m, Plan::gpu_only(), 64));
  // One tensor per value of every layer (ten), the residual stream, the final norm's output and
  // the interface; a handful of slots once they are reused.
  EXPECT_EQ(reused.arena.tensors, 3u + 1u + 10u * static_cast<uint32_t>(hp.n_layer) + 1u);
  EXPECT_LE(reused.arena.slot_offset.size(), 10u);
  // No more than the named slots (tokens, page tables, x, xn, q, k, v, attn, tmp, gate, up,
  // logits) that were reused layer after layer before.
  const uint64_t row = 4, n = 64, pages = reused.max_pages_per_seq;
  const uint64_t named = n * 16 + pages * 4 +
                         n * row *
                             (3 * hp.n_embd + 2 * hp.n_head * hp.head_dim +
                              2 * hp.n_head_kv * hp.head_dim + 2 * hp.n_ff) +
                         n * row * hp.n_vocab;
  EXPECT_LT(reused.arena.bytes, named);
  // The interface is at constant offsets; the arena is the slots' end at the largest step.
  const SymValues largest{64, 1, reused.max_pages_per_seq};
  EXPECT_EQ(reused.arena.tokens, 0u);
  EXPECT_TRUE(reused.arena.slot_offset[0].is_constant());
  EXPECT_TRUE(reused.arena.slot_offset[2].is_constant());
  EXPECT_EQ(reused.arena.bytes, reused.arena.end.eval(largest));
  ProgramMemory mem{nullptr,           reused.arena.bytes, nullptr,
                    reused.kv.bytes(), m->file().data(),   m->file().size()};
  EXPECT_NO_THROW(validate_program(reused.gpu, mem));
  // A step's offsets, evaluated once from its symbols, are 64-aligned and inside the arena.
  for (uint32_t n : {1u, 7u, 64u}) {
    const ArenaOffsets at(reused.gpu, {n, 1, 3});
    ASSERT_EQ(at.slots(), reused.arena.slot_offset.size());
    for (const auto& op : reused.gpu.ops)
      for (const fb::TensorRef* r : {op->in0.get(), op->out.get()})
        if (r) {
          EXPECT_EQ(at(*r) % 64, 0u);
          EXPECT_LE(at(*r) + uint64_t{n} * r->cols() * 4, reused.arena.bytes);
        }
  }
}

TEST(SymbolicArena, ValidationRefusesOverlappingSlotsAndTensorsTooWide) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  BuiltPrograms b = build_programs(spec_for(*m, Plan::gpu_only(), 16));
  ProgramMemory mem{nullptr,      b.arena.bytes,    nullptr,
                    b.kv.bytes(), m->file().data(), m->file().size()};
  fb::ProgramT overlapping = std::move(b.gpu);
  overlapping.slot_offsets[kMonomials * 4 + 1] -= 64;  // slot 4 starts one row earlier
  EXPECT_THROW(validate_program(overlapping, mem), Error);
  overlapping.slot_offsets[kMonomials * 4 + 1] += 64;
  EXPECT_NO_THROW(validate_program(overlapping, mem));
  // A step with more sequences than the program's slots were planned for is refused.
  StepArgs step = test_support::step_args(b, 1, 1);
  step.n_seqs = 2;
  EXPECT_THROW(check_step_symbols(overlapping, step, "test"), Error);
  // The arena one byte short of the largest step.
  mem.arena_bytes -= 1;
  EXPECT_THROW(validate_program(overlapping, mem), Error);
}

// Runs the given programs (one per token bucket, or one for all) over one host memory: each
// step picks the first program whose max_tokens holds it, as the frontend's buckets do.
class BucketedRun {
 public:
  BucketedRun(const LlamaModel& m, const Plan& plan, const std::vector<uint32_t>& sizes) : m_(m) {
    for (uint32_t n : sizes) built_.push_back(build_programs(spec_for(m, plan, n)));
    const BuiltPrograms& largest = built_.back();
    host_ = std::make_unique<test_support::HostProgramMemory>(largest, m);
    for (const BuiltPrograms& b : built_) {
      EXPECT_LE(b.arena.bytes, largest.arena.bytes);
      validate_program(b.gpu, host_->mem);
      validate_program(b.npu, host_->mem);
    }
  }
  std::vector<float> step(const std::vector<int32_t>& tokens, int pos) {
    const auto n = static_cast<uint32_t>(tokens.size());
    const BuiltPrograms* b = &built_.back();
    for (const BuiltPrograms& c : built_)
      if (n <= c.gpu.max_tokens) {
        b = &c;
        break;
      }
    test_support::fill_page_table(host_->arena.data(), *b);
    test_support::write_token_rows(host_->arena.data(), *b, tokens, pos,
                                   test_support::LogitsRows::every_token);
    const StepArgs args = test_support::step_args(*b, ++seq_, n);
    test_support::run_both_halves([&] { interpret_program(b->npu, host_->mem, args, flags_); },
                                  [&] { interpret_program(b->gpu, host_->mem, args, flags_); });
    const float* logits = reinterpret_cast<const float*>(host_->arena.data() + b->arena.logits);
    return {logits, logits + size_t{n} * m_.hp().n_vocab};
  }

 private:
  const LlamaModel& m_;
  std::vector<BuiltPrograms> built_;
  std::unique_ptr<test_support::HostProgramMemory> host_;
  test_support::LocalFlags flags_{4096};
  uint64_t seq_ = 0;
};

Plan every_matmul(const LlamaModel& m, Strategy s) {
  Plan p;
  p.name = std::string(strategy_name(s));
  for (int r = 0; r < kMatmulRoles; ++r) {
    p.matmul[r].strategy = s;
    p.matmul[r].gpu_rows = (r == 7 ? m.hp().n_vocab : m.hp().n_embd) / 2 + 3;
    p.matmul[r].npu_tokens = 4;
  }
  return p;
}

// One program sized for 64 tokens gives, step after step, the bits of per-bucket programs (1, 4,
// 16, 64 tokens) on every plan shape: its offsets move with N, its values do not.
TEST(SymbolicProgram, GivesThePerBucketProgramsBitsOnEveryPlan) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  std::vector<Plan> plans = {Plan::gpu_only(), Plan::npu_only()};
  for (Strategy s : {Strategy::weight_split, Strategy::activation_split, Strategy::hybrid})
    plans.push_back(every_matmul(*m, s));
  const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 1892, 322, 42, 17, 5, 9};
  for (const Plan& plan : plans) {
    BucketedRun symbolic(*m, plan, {64});
    BucketedRun buckets(*m, plan, {1, 4, 16, 64});
    std::vector<float> a = symbolic.step(prompt, 0), b = buckets.step(prompt, 0);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << plan.name << " prefill";
    int pos = static_cast<int>(prompt.size());
    for (const std::vector<int32_t>& next :
         {std::vector<int32_t>{100}, {7, 8, 9}, std::vector<int32_t>(20, 31), {1500}}) {
      a = symbolic.step(next, pos);
      b = buckets.step(next, pos);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0)
          << plan.name << ", " << next.size() << " tokens at " << pos;
      pos += static_cast<int>(next.size());
    }
  }
}

}  // namespace
}  // namespace duet
