// duet's reference forward pass against llama.cpp's teacher-forced logits and greedy
// continuations on the same files (tests/data/llamacpp/logits-*.json, greedy-*.json; made by
// tools/llamacpp-oracle): every one of llama.cpp's top-64 logits within llama.cpp's own noise,
// and top-1 equal wherever llama.cpp's margin exceeds it (tests/support/llamacpp_tolerance.h:
// 3x the noise measured on tiny-fortune, relative to the answer's logit scale; on tiny-fortune
// 0.08 for F16 and 1.46 for Q8_0/Q4_0, on the random-weight mkmodel files ~0.005 and ~0.1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "llamacpp_data.h"
#include "tests/support/llamacpp_tolerance.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testdata::llamacpp_dir;

std::vector<std::string> answer_files(const std::string& prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(llamacpp_dir()))
    if (e.path().filename().string().starts_with(prefix)) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// An answer's JSON and the model it was computed on.
struct Answer {
  json j;
  std::unique_ptr<LlamaModel> model;
};
Answer load_answer(const std::string& path) {
  json j = testdata::load_json(path);
  auto model = LlamaModel::load(testdata::answer_model_path(j.at("model").get<std::string>()));
  return {std::move(j), std::move(model)};
}

size_t argmax(const float* row, size_t n) {
  return static_cast<size_t>(std::max_element(row, row + n) - row);
}

std::string logits_answer_for(const std::string& greedy_path) {
  const auto name = fs::path(greedy_path).filename().string();  // greedy-X.json
  return llamacpp_dir() + "logits-" + name.substr(7);
}

TEST(LlamacppLogits, ReferenceForwardMatchesLlamacppTeacherForcedWithinItsNoise) {
  int compared = 0;
  for (const auto& path : answer_files("logits-")) {
    SCOPED_TRACE(path);
    const auto [j, model] = load_answer(path);
    const double tol = test_support::llamacpp_tolerance(j);
    const auto ids = j.at("ids").get<std::vector<int32_t>>();
    ReferenceForward fwd(*model, 512);
    const auto logits = fwd.forward(ids, true);
    const auto n_vocab = static_cast<size_t>(model->hp().n_vocab);
    double worst = 0;
    int checked = 0;
    for (const auto& p : j.at("positions")) {
      const auto pos = p.at("pos").get<size_t>();
      const float* row = logits.data() + pos * n_vocab;
      const auto top_ids = p.at("top_ids").get<std::vector<size_t>>();
      const auto top_logits = p.at("top_logits").get<std::vector<double>>();
      for (size_t k = 0; k < top_ids.size(); ++k) {
        const double diff = std::fabs(row[top_ids[k]] - top_logits[k]);
        worst = std::max(worst, diff);
        EXPECT_LE(diff, tol) << "position " << pos << " token " << top_ids[k];
      }
      if (p.at("margin").get<double>() > tol) {
        ++checked;
        EXPECT_EQ(argmax(row, n_vocab), top_ids[0]) << "position " << pos;
      }
    }
    std::printf(
        "%s: max |duet - llama.cpp| over top-%zu = %.4f (tolerance %.4f), top-1 checked "
        "at %d of %zu positions\n",
        j.at("model").get<std::string>().c_str(), j.at("top").get<size_t>(), worst, tol, checked,
        j.at("positions").size());
    ++compared;
  }
  EXPECT_GE(compared, 15);  // tiny-fortune, llama, qwen2, internlm2 and gemma, three types each
}

TEST(LlamacppLogits, ReferenceGreedyEqualsLlamacppGreedyOnF16) {
  int compared = 0;
  for (const auto& path : answer_files("greedy-")) {
    SCOPED_TRACE(path);
    const auto [j, model] = load_answer(path);
    const double tol =
        test_support::llamacpp_tolerance(testdata::load_json(logits_answer_for(path)));
    const auto n_vocab = static_cast<size_t>(model->hp().n_vocab);
    ReferenceForward fwd(*model, 512);
    auto logits = fwd.forward(j.at("prompt_ids").get<std::vector<int32_t>>(), false);
    // Equal token for token up to the first step whose llama.cpp top-1 margin is within its
    // noise: from there a different choice is a near-tie that F16 rounding decides, not an error.
    const auto want = j.at("generated").get<std::vector<int32_t>>();
    const auto margins = j.at("margins").get<std::vector<double>>();
    size_t i = 0;
    for (; i < want.size() && margins[i] > tol; ++i) {
      const auto next = static_cast<int32_t>(argmax(logits.data(), n_vocab));
      ASSERT_EQ(next, want[i]) << "greedy step " << i;
      logits = fwd.forward(std::vector<int32_t>{next}, false);
    }
    std::printf("%s: greedy equal for %zu of %zu steps (then a near-tie, if fewer)\n",
                j.at("model").get<std::string>().c_str(), i, want.size());
    EXPECT_GT(i, 0u);
    ++compared;
  }
  EXPECT_GE(compared, 5);  // tiny-fortune, llama, qwen2, internlm2 and gemma on F16
}

}  // namespace
}  // namespace duet
