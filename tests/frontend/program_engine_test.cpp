// The executor over real shm segments with in-process device links: batched steps of several
// sequences, in place KV pages, and every plan shape give the oracle's tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "services/frontend/program_engine.h"
#include "shm/segment.h"
#include "tests/support/local_flags.h"

namespace duet::frontend {
namespace {

using test_support::tiny_fortune_path;

std::string unique_stack(const char* tag) {
  return std::string("pe") + tag + std::to_string(getpid());
}

int32_t argmax(const float* v, int n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

std::unique_ptr<ProgramEngine> make_engine(const std::string& stack, const std::string& variant,
                                           std::function<Plan(uint32_t)> plan_for,
                                           std::string plan_name, DType kv_type = DType::F16,
                                           uint32_t max_ctx = 128) {
  ProgramEngineOptions o;
  o.kv_type = kv_type;
  o.model_path = tiny_fortune_path(variant);
  o.stack_id = stack;
  o.plan_name = std::move(plan_name);
  o.plan_for = std::move(plan_for);
  o.buckets = {4, 32};
  o.max_seqs = 4;
  o.max_ctx = max_ctx;
  return std::make_unique<ProgramEngine>(o, LlamaModel::load(o.model_path),
                                         make_interpreter_link("gpu"),
                                         make_interpreter_link("npu"));
}

// Greedy continuation of each prompt, all sequences decoded together in one batch per step.
std::vector<std::vector<int32_t>> greedy_batched(Engine& e,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 int n_new) {
  const int V = e.model().hp().n_vocab;
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<SeqStep> batch;
  for (size_t i = 0; i < prompts.size(); ++i) {
    e.open_seq(i + 1, 128);
    batch.push_back({i + 1, prompts[i], 0, true});
  }
  std::vector<float> logits = e.step(batch, nullptr);  // prefill of every prompt at once
  for (int k = 0; k < n_new; ++k) {
    std::vector<SeqStep> next;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int32_t tok = argmax(&logits[i * V], V);
      out[i].push_back(tok);
      next.push_back({i + 1, {tok}, static_cast<int32_t>(prompts[i].size() + k), true});
    }
    logits = e.step(next, nullptr);
  }
  for (size_t i = 0; i < prompts.size(); ++i) e.close_seq(i + 1);
  return out;
}

std::vector<int32_t> greedy_reference(const LlamaModel& m, const std::vector<int32_t>& prompt,
                                      int n_new) {
  ReferenceForward ref(m, 128);
  const int V = m.hp().n_vocab;
  std::vector<float> logits = ref.forward(prompt, false);
  std::vector<int32_t> out;
  for (int k = 0; k < n_new; ++k) {
    out.push_back(argmax(logits.data(), V));
    logits = ref.forward(std::vector<int32_t>{out.back()}, false);
  }
  return out;
}

Plan split(Strategy s, int gpu_rows, int npu_tokens) {
  Plan p;
  p.name = std::string(strategy_name(s));
  for (Placement& pl : p.matmul) pl = {s, gpu_rows, npu_tokens};
  return p;
}

const std::vector<std::vector<int32_t>> kPrompts = {{1, 703, 1975, 310},
                                                    {1, 450, 12, 99, 1000, 7},
                                                    {1, 5},
                                                    {1, 42, 42, 42, 42, 42, 42, 42, 42, 42}};

TEST(ProgramEngine, BatchedGreedyEqualsTheReferenceForEveryPlanShape) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : kPrompts) want.push_back(greedy_reference(*m, p, 6));
  const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
      {"gpu-only", nullptr},
      {"npu-only", nullptr},
      {"weight", [](uint32_t) { return split(Strategy::weight_split, 100, 0); }},
      {"hybrid", [](uint32_t b) { return split(Strategy::hybrid, 64, b >= 32 ? 16 : 0); }},
      {"activation",
       [](uint32_t b) { return split(Strategy::activation_split, 0, b >= 32 ? 8 : 0); }},
  };
  for (const auto& [name, plan_for] : plans) {
    SCOPED_TRACE(name);
    auto engine = make_engine(unique_stack("a"), "q8_0", plan_for, name);
    EXPECT_EQ(greedy_batched(*engine, kPrompts, 6), want);
  }
}

TEST(ProgramEngine, ClosingASequenceFreesItsPagesAndTheEngineRemovesItsSegments) {
  const std::string stack = unique_stack("b");
  {
    auto engine = make_engine(stack, "q4_0", nullptr, "gpu-only");
    EXPECT_EQ(shm::list_stack_segments(stack).size(), 3u);
    const uint32_t free0 = engine->status()["kv_pages_free"];
    engine->open_seq(7, 100);
    engine->step({{7, std::vector<int32_t>(20, 5), 0, true}}, nullptr);
    EXPECT_EQ(static_cast<uint32_t>(engine->status()["kv_pages_free"]),
              free0 - 2);  // 20 tokens, 16 per page
    engine->close_seq(7);
    EXPECT_EQ(static_cast<uint32_t>(engine->status()["kv_pages_free"]), free0);
  }
  EXPECT_TRUE(shm::list_stack_segments(stack).empty());
}

TEST(ProgramEngine, RejectsBadSteps) {
  auto engine = make_engine(unique_stack("c"), "q4_0", nullptr, "gpu-only");
  EXPECT_THROW(engine->step({{9, {1}, 0, true}}, nullptr), Error);  // not open
  engine->open_seq(9, 10);
  EXPECT_THROW(engine->step({{9, {1}, 3, true}}, nullptr), Error);        // gap
  EXPECT_THROW(engine->step({{9, {1 << 20}, 0, true}}, nullptr), Error);  // token id
  EXPECT_THROW(engine->step({{9, std::vector<int32_t>(11, 1), 0, true}}, nullptr),
               Error);  // past max
  EXPECT_THROW(engine->open_seq(10, 100000), Error);
  engine->step({{9, {1, 2}, 0, true}}, nullptr);  // still serves
}

// Admission control (issue 20): a reservation is a promise of pages; others cannot take them,
// the promised sequence grows into them, and what no pool could hold is refused outright.
TEST(ProgramEngine, ReservedPagesArePromisedAndNeverTakenByOthers) {
  ProgramEngineOptions o;
  o.model_path = tiny_fortune_path("q8_0");
  o.stack_id = unique_stack("g");
  o.plan_name = "gpu-only";
  o.buckets = {32};
  o.max_seqs = 4;
  o.max_ctx = 128;
  o.kv_pages = 10;
  ProgramEngine e(o, LlamaModel::load(o.model_path), make_interpreter_link("gpu"),
                  make_interpreter_link("npu"));
  e.open_seq(1, 128);
  e.reserve_seq(1, 128);  // 8 of the 10 pages
  e.open_seq(2, 128);
  EXPECT_THROW(e.reserve_seq(2, 48), Error);  // 3 pages: only 2 are not promised
  try {
    e.reserve_seq(2, 48);
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::busy);
  }
  e.reserve_seq(2, 32);  // 2 pages fit
  // Without a promise of its own, sequence 3 cannot grow into 1's pages.
  e.open_seq(3, 128);
  EXPECT_THROW(e.step({{3, std::vector<int32_t>(16, 5), 0, true}}, nullptr), Error);
  e.step({{1, std::vector<int32_t>(32, 5), 0, true}}, nullptr);  // 1 grows into its own
  EXPECT_EQ(e.status()["kv_pages_used"], 2);
  EXPECT_EQ(e.status()["kv_pages_promised"], 8);  // 6 left to 1, 2 to 2
  e.close_seq(1);
  EXPECT_EQ(e.status()["kv_pages_promised"], 2);
  e.reserve_seq(3, 128);  // 1's pages came back: 8 fit now
  e.step({{3, std::vector<int32_t>(16, 5), 0, true}}, nullptr);
  try {
    e.reserve_seq(3, 129);
    ADD_FAILURE() << "a reservation past the context was taken";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), Errc::out_of_range);
  }
}

// Largest |logit - reference logit| over a greedy run (prompt, then n_new decode steps), the
// reference being the fp32 oracle fed the same tokens.
float max_logit_error(Engine& e, const LlamaModel& m, const std::vector<int32_t>& prompt, int n_new,
                      int ctx = 128, DType ref_kv_type = DType::F32,
                      int* argmax_differs = nullptr) {
  ReferenceForward ref(m, ctx);
  ref.set_kv_type(ref_kv_type);
  const int V = m.hp().n_vocab;
  e.open_seq(1, ctx);
  std::vector<float> got = e.step({{1, prompt, 0, true}}, nullptr);
  std::vector<float> want = ref.forward(prompt, false);
  float worst = 0;
  for (int k = 0;; ++k) {
    for (int i = 0; i < V; ++i) worst = std::max(worst, std::abs(got[i] - want[i]));
    if (argmax_differs && argmax(got.data(), V) != argmax(want.data(), V)) {
      ++*argmax_differs;
      std::printf("[ kv ] greedy token differs at position %zu: the oracle's margin %.5f\n",
                  prompt.size() + k - 1,
                  want[argmax(want.data(), V)] - want[argmax(got.data(), V)]);
    }
    if (k == n_new) break;
    const int32_t tok = argmax(want.data(), V);
    got = e.step({{1, {tok}, static_cast<int32_t>(prompt.size()) + k, true}}, nullptr);
    want = ref.forward(std::vector<int32_t>{tok}, false);
  }
  e.close_seq(1);
  return worst;
}

// The f16 KV accuracy gate (issue 20): storing K and V as f16 moves tiny-fortune's logits by less
// than the gate from the fp32 oracle over 60 positions (measured: see the printed numbers; f32
// pages are exact up to float reassociation), and greedy tokens stay the oracle's
// (BatchedGreedyEqualsTheReferenceForEveryPlanShape runs with f16 pages).
TEST(ProgramEngine, F16KvPagesStayWithinTheGateOfTheFp32Reference) {
  constexpr float kGate = 0.02f;
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 19; ++i) prompt.push_back(100 + 37 * i);
  auto f16 = make_engine(unique_stack("d"), "q8_0", nullptr, "gpu-only", DType::F16);
  auto f32 = make_engine(unique_stack("e"), "q8_0", nullptr, "gpu-only", DType::F32);
  const float err16 = max_logit_error(*f16, *m, prompt, 40);
  const float err32 = max_logit_error(*f32, *m, prompt, 40);
  std::printf("[ kv ] max |logit - fp32 oracle| over 60 positions: f16 pages %.5f, f32 %.5f\n",
              err16, err32);
  EXPECT_LT(err16, kGate);
  EXPECT_LT(err32, err16 + 1e-6f);
  EXPECT_GT(err16, 0.0f) << "f16 pages changed nothing: are they really f16?";
}

// The q8_0 KV gate (issue 20): ggml's 32-value blocks along the head dim (8-bit values, an f16
// scale per block) move tiny-fortune's logits more than f16 does. Measured over 60 positions:
// max |logit - fp32 oracle| 0.376 (f16: 0.011), and the oracle's greedy token differs at 1 of 41
// positions, where the oracle's own top-2 margin is 0.016 (printed). The gate, 0.5 and at most one
// such flip, is that error with headroom; a wrong scale or block layout moves logits by whole
// units. The pages' exactness is checked separately: against the oracle rounding its K/V rows
// through q8_0 the same way, the error is float reassociation (measured 0.000000).
TEST(ProgramEngine, Q8_0KvPagesStayWithinTheirGateOfTheFp32Reference) {
  constexpr float kGate = 0.5f;
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 19; ++i) prompt.push_back(100 + 37 * i);
  auto q8 = make_engine(unique_stack("q"), "q8_0", nullptr, "gpu-only", DType::Q8_0);
  auto f16 = make_engine(unique_stack("r"), "q8_0", nullptr, "gpu-only", DType::F16);
  int q8_argmax_differs = 0;
  const float err_q8 = max_logit_error(*q8, *m, prompt, 40, 128, DType::F32, &q8_argmax_differs);
  const float err16 = max_logit_error(*f16, *m, prompt, 40);
  // The same pages against the oracle with its K/V rows rounded through q8_0 as stored: the
  // interpreter reads what it wrote, no more error than float reassociation.
  const float err_same_rounding = max_logit_error(*q8, *m, prompt, 40, 128, DType::Q8_0);
  std::printf(
      "[ kv ] max |logit - fp32 oracle| over 60 positions: q8_0 pages %.5f (greedy token differs "
      "at %d), f16 %.5f; q8_0 pages vs the oracle rounding K/V to q8_0: %.6f\n",
      err_q8, q8_argmax_differs, err16, err_same_rounding);
  EXPECT_LT(err_q8, kGate);
  EXPECT_LE(q8_argmax_differs, 1);  // measured: 1 of 41, a near tie of the oracle (printed)
  EXPECT_LT(err_same_rounding, 1e-3f);
  EXPECT_GT(err_q8, err16) << "q8_0 pages as exact as f16: are they really q8_0?";
}

// A prompt of 500 tokens (the interpreter gathers a sequence's pages once per step) and decode
// steps at positions 500..510 give the oracle's logits within the f16 gate.
TEST(ProgramEngine, LongPromptAndDecodeStayWithinTheF16GateOfTheReference) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 499; ++i) prompt.push_back(100 + (37 * i) % 900);
  auto e = make_engine(unique_stack("l"), "q8_0", nullptr, "gpu-only", DType::F16, 512);
  ReferenceForward ref(*m, 512);
  const int V = m->hp().n_vocab;
  e->open_seq(1, 512);
  std::vector<float> got;
  for (size_t at = 0; at < prompt.size(); at += 32) {  // steps of the largest bucket
    const size_t end = std::min(prompt.size(), at + 32);
    got = e->step({{1, std::vector<int32_t>(prompt.begin() + at, prompt.begin() + end),
                    static_cast<int32_t>(at), end == prompt.size()}},
                  nullptr);
  }
  std::vector<float> want = ref.forward(prompt, false);
  float err = 0;
  for (int k = 0;; ++k) {
    for (int i = 0; i < V; ++i) err = std::max(err, std::abs(got[i] - want[i]));
    if (k == 10) break;
    const int32_t tok = argmax(want.data(), V);
    got = e->step({{1, {tok}, static_cast<int32_t>(prompt.size()) + k, true}}, nullptr);
    want = ref.forward(std::vector<int32_t>{tok}, false);
  }
  e->close_seq(1);
  std::printf("[ kv ] 500-token prompt: max |logit - fp32 oracle| %.5f\n", err);
  EXPECT_LT(err, 0.02f);
}

// KV bytes per token = 2 (K and V) x layers x kv_dim x 2 bytes at f16; twice that at f32; 34/32
// bytes a value at q8_0.
TEST(ProgramEngine, KvBytesPerTokenAreTwoTimesLayersTimesKvDimTimesTheValueSize) {
  auto m = LlamaModel::load(tiny_fortune_path("q8_0"));
  const uint64_t kv_dim = uint64_t(m->hp().n_head_kv) * m->hp().head_dim;
  const uint64_t per_token_f16 = 2 * uint64_t(m->hp().n_layer) * kv_dim * 2;
  for (const auto& [type, bytes] :
       {std::pair{DType::F16, per_token_f16}, std::pair{DType::F32, 2 * per_token_f16},
        std::pair{DType::Q8_0, 2 * uint64_t(m->hp().n_layer) * kv_dim * 34 / 32}}) {
    auto e = make_engine(unique_stack("f"), "q8_0", nullptr, "gpu-only", type);
    const nlohmann::json s = e->status();
    EXPECT_EQ(s["kv_page_bytes"].get<uint64_t>() / s["kv_page_tokens"].get<uint64_t>(), bytes)
        << s.dump();
    EXPECT_EQ(s["kv_type"], std::string(dtype_name(type)));
  }
}

}  // namespace
}  // namespace duet::frontend
