// The in-process mode: gpu_svc's and npu_svc's service objects in this process, driven with the
// same control messages the stack sends over ZeroMQ, give the same tokens as the reference.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>

#include "core/model/forward.h"
#include "services/frontend/program_engine.h"
#include "tests/support/in_process_services.h"

namespace duet::frontend {
namespace {

TEST(InProcess, BothServicesInOneProcessGiveTheReferenceGreedyTokens) {
  ProgramEngineOptions o;
  o.model_path = std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf";
  o.stack_id = "inproc" + std::to_string(getpid());
  o.plan_name = "npu-only";
  o.buckets = {1, 16};
  o.max_seqs = 1;
  o.max_ctx = 64;
  test_support::InProcessServices services(o);
  ProgramEngine& e = services.engine;
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
