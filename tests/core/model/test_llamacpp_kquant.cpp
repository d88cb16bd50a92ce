// duet's reference forward pass on `duet quantize`d K-quant files (q4_k_m, q5_k_m, q6_k of
// tiny-fortune's trained F16 file and of the random tiny-llama3-256 model, models.json) against
// llama.cpp's teacher-forced logits on the same files: top-1 equal wherever llama.cpp's margin
// exceeds its activation-quantisation noise, and the mean KL(llama.cpp || duet) of the two
// distributions no more than twice llama.cpp's own KL against the exact forward (its run on
// the file's F32 expansion, tests/data/llamacpp/noise-kquant-fortune.json).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/model/forward.h"
#include "core/model/model.h"
#include "llamacpp_data.h"
#include "tests/support/llamacpp_kl.h"
#include "tests/support/llamacpp_tolerance.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

TEST(LlamacppKQuant, ReferenceForwardAgreesWithLlamacppOnQuantizedKFiles) {
  const auto dir = fs::path(::testing::TempDir()) / ("duet-kquant-" + std::to_string(::getpid()));
  const auto models = testdata::regenerate_mkmodel_files(dir);
  std::map<std::string, double> noise_kl;  // type -> llama.cpp's mean KL against exact
  const auto noise = testdata::load_json(testdata::llamacpp_dir() + "noise-kquant-fortune.json");
  for (const auto& r : noise.at("results"))
    noise_kl[r.at("variant").get<std::string>()] = r.at("mean_kl").get<double>();
  int files = 0;
  for (const auto& m : models.at("models")) {
    if (!m.contains("quantize_args")) continue;
    const std::string name = m.at("name"), type = m.at("type");
    SCOPED_TRACE(name);
    const auto answer = testdata::load_json(testdata::llamacpp_dir() + "logits-" + name + ".json");
    ASSERT_EQ(answer.at("model_sha256"), m.at("sha256"));
    const auto model = LlamaModel::load((dir / m.at("file").get<std::string>()).string());
    const double tol = test_support::llamacpp_tolerance(answer);
    const auto ids = answer.at("ids").get<std::vector<int32_t>>();
    ReferenceForward fwd(*model, 512);
    const auto logits = fwd.forward(ids, true);
    const auto n_vocab = static_cast<size_t>(model->hp().n_vocab);
    int clear = 0, agree_clear = 0, agree_all = 0, positions = 0;
    double kl_sum = 0, kl_max = 0;
    for (const auto& p : answer.at("positions")) {
      const float* row = logits.data() + p.at("pos").get<size_t>() * n_vocab;
      const auto top1 = static_cast<size_t>(std::max_element(row, row + n_vocab) - row);
      const bool same = top1 == p.at("top_ids").at(0).get<size_t>();
      ++positions;
      agree_all += same;
      if (p.at("margin").get<double>() > tol) {
        ++clear;
        agree_clear += same;
        EXPECT_TRUE(same) << "position " << p.at("pos") << ": duet " << top1 << ", llama.cpp "
                          << p.at("top_ids").at(0) << " (margin " << p.at("margin") << ")";
      }
      const double kl = test_support::kl_topk(p, row, n_vocab);
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
    }
    const double mean_kl = kl_sum / positions;
    // llama256 has no float64 reference of its own: it borrows the fortune measurement of its
    // type (its flatter random-weight distributions give smaller KLs than the trained model's).
    const double bound = 2 * noise_kl.at(type);
    std::printf(
        "%s: top-1 equal at %d of %d positions where llama.cpp's margin > %.3f (%d of %d "
        "overall), mean KL(llama.cpp || duet) %.3g nats (max %.3g, bound %.3g)\n",
        name.c_str(), agree_clear, clear, tol, agree_all, positions, mean_kl, kl_max, bound);
    EXPECT_LE(mean_kl, bound);
    EXPECT_GT(clear, 0);
    ++files;
  }
  fs::remove_all(dir);
  EXPECT_EQ(files, 6);  // {llama256, fortune} x {q4_k_m, q5_k_m, q6_k}
}

}  // namespace
}  // namespace duet
