// tiny-fortune through the gpu-only plan (ProgramEngine over an in-process GpuService on this
// machine's OpenCL device), with the integer matmul at its default activation bits (16 for every
// role, gpu_kernels.h), at 8 bits everywhere (llama.cpp's; reported, not required to agree) and
// with DUET_GPU_INT8_MATMUL=0 (the fp32 kernels):
// - teacher-forced top-1 agreement with the float64 reference wherever its margin is > 0.05;
// - held-out perplexity (8 windows of 64 tokens decoded side by side: 8-token steps) within 1%
//   of the fp32 path;
// - batch invariance end to end (Q4_0, Q8_0 through the integer kernels, F16 through the fp32
//   ones): a sequence's logits are the same bits whether it steps alone or with 7 others.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/model.h"
#include "core/planner/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/frontend/program_engine.h"
#include "services/gpu_svc/gpu_service.h"
#include "services/npu_svc/npu_service.h"
#include "tests/support/teacher_forced.h"

namespace duet {
namespace {

using test_support::Agreement;
using test_support::load_json;
using test_support::teacher_forced;

std::string data_dir() {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/";
}

// The matmul path: the default (8-bit dots, 16-bit activations), llama.cpp's 8-bit activations
// everywhere, or the fp32 kernels; set through the environment while the GPU service is built.
enum class Path { kDefault, kAct8, kFp32 };

// All roles in this process, as stack_bench --in-process.
class GpuOnly {
 public:
  GpuOnly(const std::string& variant, Path path) : soc_(load_soc_profile("sd8gen3")) {
    if (path == Path::kFp32) setenv("DUET_GPU_INT8_MATMUL", "0", 1);
    if (path == Path::kAct8) setenv("DUET_GPU_INT8_ACT_BITS", "8", 1);
    gpu_ =
        std::make_unique<gpu::GpuService>(gpu::shared_device(), soc_, ShmMemoryResolver("gpu_svc"));
    unsetenv("DUET_GPU_INT8_MATMUL");
    unsetenv("DUET_GPU_INT8_ACT_BITS");
    const bool int8 = path != Path::kFp32;
    npu_ = std::make_unique<npu::NpuService>(soc_, 0, ShmMemoryResolver("npu_svc"));
    const std::string file = data_dir() + "fortune-" + variant + ".gguf";
    frontend::ProgramEngineOptions o;
    o.model_path = file;
    o.stack_id = "int8test" + std::to_string(getpid()) + variant + (int8 ? "i" : "f") +
                 std::to_string(static_cast<int>(path));
    o.plan_name = "gpu-only";
    o.buckets = {1, 8, 16, 64};
    o.max_seqs = 16;
    o.max_ctx = 256;
    engine_ = std::make_unique<frontend::ProgramEngine>(
        o, LlamaModel::load(file),
        frontend::make_local_service_link(
            "gpu", [this](const fb::Message& m) { return gpu_->register_program(m); },
            [this](const fb::Message& m) { return gpu_->run_step(m); }),
        frontend::make_local_service_link(
            "npu", [this](const fb::Message& m) { return npu_->register_program(m); },
            [this](const fb::Message& m) { return npu_->run_step(m); }));
  }
  frontend::ProgramEngine& engine() { return *engine_; }

 private:
  SocProfile soc_;
  std::unique_ptr<gpu::GpuService> gpu_;
  std::unique_ptr<npu::NpuService> npu_;
  std::unique_ptr<frontend::ProgramEngine> engine_;
};

// Perplexity over kWindows windows of kWindow held-out tokens (each scored from its 2nd
// token), the windows decoded side by side one token each per step. Returns the logits of
// window 0..n-1 per step too (for the invariance check), when `keep` is set.
constexpr int kWindows = 8, kWindow = 64;
double heldout_ppl(frontend::ProgramEngine& e, std::vector<std::vector<float>>* keep = nullptr,
                   int n_seqs = kWindows, int first_window = 0) {
  const std::vector<int32_t> ids = load_json(data_dir() + "heldout-ids.json")["ids"];
  const int V = e.model().hp().n_vocab;
  for (int s = 0; s < n_seqs; ++s) e.open_seq(100 + s, kWindow);
  double nll = 0;
  int scored = 0;
  for (int p = 0; p + 1 < kWindow; ++p) {
    std::vector<frontend::SeqStep> batch;
    for (int s = 0; s < n_seqs; ++s)
      batch.push_back({static_cast<uint64_t>(100 + s),
                       {ids[static_cast<size_t>((first_window + s) * kWindow + p)]},
                       p,
                       true});
    const auto logits = e.step(batch, nullptr);
    for (int s = 0; s < n_seqs; ++s) {
      const float* l = &logits[static_cast<size_t>(s) * V];
      const int32_t next = ids[static_cast<size_t>((first_window + s) * kWindow + p + 1)];
      const float m = *std::max_element(l, l + V);
      double z = 0;
      for (int i = 0; i < V; ++i) z += std::exp(double{l[i]} - m);
      nll -= double{l[next]} - m - std::log(z);
      ++scored;
      if (keep) keep->emplace_back(l, l + V);
    }
  }
  for (int s = 0; s < n_seqs; ++s) e.close_seq(100 + s);
  return std::exp(nll / scored);
}

class Int8Model : public ::testing::TestWithParam<std::string> {};

TEST_P(Int8Model, AgreesWithTheReferenceAndKeepsPerplexity) {
  const std::string variant = GetParam();
  GpuOnly int8(variant, Path::kDefault), act8(variant, Path::kAct8), fp32(variant, Path::kFp32);
  const Agreement a = teacher_forced(int8.engine(), data_dir(), variant);
  const Agreement a8 = teacher_forced(act8.engine(), data_dir(), variant);
  const Agreement f = teacher_forced(fp32.engine(), data_dir(), variant);
  std::printf(
      "%s teacher-forced top-1 (margin > 0.05): default %d/%d, 8-bit act %d/%d, fp32 %d/%d\n",
      variant.c_str(), a.agree, a.clear, a8.agree, a8.clear, f.agree, f.clear);
  EXPECT_GT(a.clear, 100);
  EXPECT_EQ(a.agree, a.clear) << describe(a);
  const double p = heldout_ppl(int8.engine()), p8 = heldout_ppl(act8.engine()),
               p32 = heldout_ppl(fp32.engine());
  std::printf(
      "%s held-out perplexity (%d x %d tokens): default %.4f (%+.3f%%), 8-bit act %.4f "
      "(%+.3f%%), fp32 %.4f\n",
      variant.c_str(), kWindows, kWindow, p, 100 * (p / p32 - 1), p8, 100 * (p8 / p32 - 1), p32);
  EXPECT_LT(std::fabs(p / p32 - 1), 0.01);
  EXPECT_LT(std::fabs(p8 / p32 - 1), 0.01);
}

// Each of 8 sequences, stepped alone, gets the logits it got in the 8-sequence steps, bit for
// bit (what StackServing's concurrent clients rely on).
TEST_P(Int8Model, ASequenceGetsTheSameBitsAloneAsInABatch) {
  const std::string variant = GetParam();
  GpuOnly g(variant, Path::kDefault);
  std::vector<std::vector<float>> batched;
  heldout_ppl(g.engine(), &batched);
  for (int s = 0; s < kWindows; ++s) {
    std::vector<std::vector<float>> alone;
    heldout_ppl(g.engine(), &alone, 1, s);
    for (int p = 0; p + 1 < kWindow; ++p)
      ASSERT_EQ(0, std::memcmp(alone[static_cast<size_t>(p)].data(),
                               batched[static_cast<size_t>(p * kWindows + s)].data(),
                               alone[0].size() * 4))
          << "sequence " << s << " position " << p;
  }
}

INSTANTIATE_TEST_SUITE_P(TinyFortune, Int8Model, ::testing::Values("q4_0", "q8_0", "f16"));

}  // namespace
}  // namespace duet
