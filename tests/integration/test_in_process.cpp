// The in-process mode: gpu_svc's and npu_svc's service objects in this process, driven with the
// same control messages the stack sends over ZeroMQ, give the same tokens as the reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "core/forward.h"
#include "core/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/frontend/program_engine.h"
#include "services/gpu_svc/gpu_service.h"
#include "services/npu_svc/npu_service.h"

namespace duet::frontend {
namespace {

TEST(InProcess, BothServicesInOneProcessGiveTheReferenceGreedyTokens) {
  const std::string model =
      std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf";
  const SocProfile soc = load_soc_profile("sd8gen3");
  gpu::GpuService gpu(gpu::shared_device(), soc, ShmMemoryResolver("gpu_svc"));
  npu::NpuService npu(soc, 0, ShmMemoryResolver("npu_svc"));
  ProgramEngineOptions o;
  o.model_path = model;
  o.stack_id = "inproc" + std::to_string(getpid());
  o.plan_name = "npu-only";
  o.buckets = {1, 16};
  o.max_seqs = 1;
  o.max_ctx = 64;
  ProgramEngine e(o, LlamaModel::load(model),
                  make_local_service_link(
                      "gpu", [&](const fb::Message& m) { return gpu.register_program(m); },
                      [&](const fb::Message& m) { return gpu.run_step(m); }),
                  make_local_service_link(
                      "npu", [&](const fb::Message& m) { return npu.register_program(m); },
                      [&](const fb::Message& m) { return npu.run_step(m); }));
  ReferenceForward ref(e.model(), 64);
  const std::vector<int32_t> prompt = {1, 1342, 347, 1283, 262, 573};
  e.open_seq(1, 64);
  StepStats stats;
  std::vector<float> got = e.step({{1, prompt, 0, true}}, &stats);
  std::vector<float> want = ref.forward(prompt, false);
  EXPECT_GT(stats.modeled_us, 0);  // the services report modelled SoC time
  for (int k = 0; k < 12; ++k) {
    const auto tok =
        static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
    EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(), tok) << "token " << k;
    got = e.step({{1, {tok}, static_cast<int32_t>(prompt.size()) + k, true}}, nullptr);
    want = ref.forward(std::vector<int32_t>{tok}, false);
  }
}

}  // namespace
}  // namespace duet::frontend
