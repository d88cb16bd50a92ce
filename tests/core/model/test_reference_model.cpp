// The reference forward pass against HF transformers on the tiny-fortune model, for each file
// type: last-prompt logits, teacher-forced top-1 agreement, and held-out perplexity.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "reference_data.h"

namespace duet {
namespace {

using testdata::fortune_dir;
using testdata::fortune_model;
using testdata::hf_reference;

class ReferenceModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { model_ = LlamaModel::load(fortune_model(GetParam())); }
  std::unique_ptr<LlamaModel> model_;
};

TEST_P(ReferenceModel, HyperparametersMatchTheConfig) {
  const auto& cfg = hf_reference()["config"];
  const LlamaHparams& hp = model_->hp();
  EXPECT_EQ(hp.n_vocab, hf_reference()["vocab_size"].get<int>());
  EXPECT_EQ(hp.n_embd, cfg["dim"].get<int>());
  EXPECT_EQ(hp.n_ff, cfg["ffn"].get<int>());
  EXPECT_EQ(hp.n_layer, cfg["layers"].get<int>());
  EXPECT_EQ(hp.n_head, cfg["heads"].get<int>());
  EXPECT_EQ(hp.n_head_kv, cfg["kv_heads"].get<int>());
  EXPECT_EQ(hp.n_ctx, cfg["ctx"].get<int>());
  EXPECT_FLOAT_EQ(hp.rms_eps, cfg["eps"].get<float>());
  EXPECT_FLOAT_EQ(hp.rope_freq_base, cfg["theta"].get<float>());
  EXPECT_FALSE(model_->tied_output());
}

TEST_P(ReferenceModel, LastPromptLogitsWithin1e3OfHf) {
  ReferenceForward fwd(*model_);
  for (const auto& prompt : hf_reference()[GetParam()]["prompts"]) {
    const auto ids = prompt["ids"].get<std::vector<int32_t>>();
    const auto expect = prompt["last_logits"].get<std::vector<float>>();
    fwd.reset();
    const auto logits = fwd.forward(ids, false);
    ASSERT_EQ(logits.size(), expect.size());
    double max_diff = 0;
    for (size_t v = 0; v < expect.size(); ++v)
      max_diff = std::max(max_diff, double(std::fabs(logits[v] - expect[v])));
    EXPECT_LT(max_diff, 1e-3) << "prompt \"" << prompt["text"].get<std::string>() << "\"";
  }
}

// Prefill of the prompt then one token at a time, as generation runs, against the float64
// teacher-forced logits.
TEST_P(ReferenceModel, TeacherForcedTop1AgreesWhereTheMarginIsClear) {
  const auto tf = testdata::load_json(fortune_dir() + "teacher-forced/" + GetParam() + ".json");
  const auto ref =
      testdata::load_f32(fortune_dir() + "teacher-forced/" + GetParam() + ".logits.f32");
  const int n_vocab = model_->hp().n_vocab;
  ReferenceForward fwd(*model_);
  size_t row = 0;
  double max_diff = 0;
  int checked = 0;
  for (const auto& seq : tf["sequences"]) {
    const auto ids = seq["ids"].get<std::vector<int32_t>>();
    const int n_prompt = seq["n_prompt"].get<int>();
    fwd.reset();
    std::vector<float> logits = fwd.forward(std::span(ids).first(n_prompt), true);
    for (size_t t = n_prompt; t < ids.size(); ++t) {
      const auto next = fwd.forward(std::span(ids).subspan(t, 1), false);
      logits.insert(logits.end(), next.begin(), next.end());
    }
    for (size_t t = 0; t < ids.size(); ++t, ++row) {
      ASSERT_LE((row + 1) * n_vocab, ref.size());
      const float* r = ref.data() + row * n_vocab;
      const float* mine = logits.data() + t * n_vocab;
      for (int v = 0; v < n_vocab; ++v)
        max_diff = std::max(max_diff, double(std::fabs(mine[v] - r[v])));
      std::vector<float> sorted(r, r + n_vocab);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] <= 0.05f) continue;
      ++checked;
      EXPECT_EQ(std::max_element(mine, mine + n_vocab) - mine, std::max_element(r, r + n_vocab) - r)
          << "sequence \"" << seq["text"].get<std::string>() << "\" position " << t;
    }
  }
  EXPECT_EQ(row * n_vocab, ref.size());
  EXPECT_GT(checked, 250);
  EXPECT_LT(max_diff, 1e-4) << "max abs logit difference over all positions";
  RecordProperty("max_abs_logit_diff", std::to_string(max_diff));
  std::printf(
      "[ %s ] teacher-forced max |logit diff| = %.3g over %zu positions, %d top-1 checked\n",
      GetParam().c_str(), max_diff, row, checked);
}

TEST_P(ReferenceModel, HeldOutPerplexityWithinHalfAPercentOfHf) {
  const auto heldout = testdata::load_json(fortune_dir() + "heldout-ids.json");
  const auto ids = heldout["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 4096u);
  const double expect = hf_reference()[GetParam()]["heldout_ppl"].get<double>();
  const double ppl = perplexity(*model_, ids, 256);
  std::printf("[ %s ] held-out perplexity %.4f (HF %.4f)\n", GetParam().c_str(), ppl, expect);
  EXPECT_NEAR(ppl, expect, 0.005 * expect);
}

TEST_P(ReferenceModel, PrefillAndTokenByTokenDecodeGiveIdenticalLogits) {
  const auto ids = hf_reference()[GetParam()]["prompts"][2]["ids"].get<std::vector<int32_t>>();
  ReferenceForward whole(*model_), stepwise(*model_);
  const auto all = whole.forward(ids, true);
  const int n_vocab = model_->hp().n_vocab;
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto row = stepwise.forward(std::span(ids).subspan(t, 1), false);
    ASSERT_TRUE(std::equal(row.begin(), row.end(), all.begin() + t * n_vocab)) << "position " << t;
  }
  EXPECT_EQ(stepwise.position(), static_cast<int>(ids.size()));
}

TEST_P(ReferenceModel, ContextOverflowAndBadTokensAreErrors) {
  ReferenceForward fwd(*model_, 8);
  const std::vector<int32_t> nine(9, 5), bad = {1, 2048};
  try {
    fwd.forward(nine, false);
    FAIL() << "9 tokens fit a context of 8";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::out_of_range);
    EXPECT_NE(std::string(e.what()).find("do not fit in a context of 8"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(fwd.forward(bad, false), Error);
  EXPECT_EQ(fwd.position(), 0);  // failed calls leave the cache as it was
}

INSTANTIATE_TEST_SUITE_P(TinyFortune, ReferenceModel, ::testing::Values("f16", "q8_0", "q4_0"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace duet
