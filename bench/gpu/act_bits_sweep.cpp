// Issue 7: which matmul inputs need 16-bit activations? For each DUET_GPU_INT8_ACT_BITS spec
// given, tiny-fortune (Q4_0 and Q8_0) through the gpu-only plan on this machine's OpenCL device
// (all roles in this process, as tests/gpu/gpu_int8_model_test), teacher-forced against the
// float64 reference: how many positions with a reference top-1 margin > 0.05 keep their top-1.
// One JSON line per (variant, spec).
// usage: act_bits_sweep SPEC [SPEC...]   e.g. act_bits_sweep 16 8 "16,down=8" "16,q=8,k=8,v=8"
// SWEEP_ENGINE=integration: the engine shape of tests/integration's PlansOverServices (buckets
// 1 and 64, 2 sequences, 128 positions) instead of gpu_int8_model_test's.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
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

namespace {

using namespace duet;

std::string data_dir() {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/";
}

// The reference gate (tests/support/teacher_forced.h) as JSON: counts and the flipped rows.
nlohmann::json agreement_json(frontend::ProgramEngine& e, const std::string& variant) {
  const test_support::Agreement a = test_support::teacher_forced(e, data_dir(), variant);
  std::vector<size_t> flipped;
  for (const test_support::Disagreement& d : a.flipped) flipped.push_back(d.reference_row);
  return {{"clear", a.clear}, {"agree", a.agree}, {"flipped_rows", flipped}};
}

nlohmann::json run(const std::string& variant, const std::string& spec) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  setenv("DUET_GPU_INT8_ACT_BITS", spec.c_str(), 1);
  auto gpu =
      std::make_unique<gpu::GpuService>(gpu::shared_device(), soc, ShmMemoryResolver("gpu_svc"));
  unsetenv("DUET_GPU_INT8_ACT_BITS");
  auto npu = std::make_unique<npu::NpuService>(soc, 0, ShmMemoryResolver("npu_svc"));
  const std::string file = data_dir() + "fortune-" + variant + ".gguf";
  frontend::ProgramEngineOptions o;
  o.model_path = file;
  o.stack_id = "actsweep" + std::to_string(getpid()) + variant;
  o.plan_name = "gpu-only";
  if (const char* e = std::getenv("SWEEP_ENGINE"); e && std::string(e) == "integration") {
    o.buckets = {1, 64};
    o.max_seqs = 2;
    o.max_ctx = 128;
  } else {
    o.buckets = {1, 8, 16, 64};
    o.max_seqs = 16;
    o.max_ctx = 256;
  }
  frontend::ProgramEngine engine(
      o, LlamaModel::load(file),
      frontend::make_local_service_link(
          "gpu", [&](const fb::Message& m) { return gpu->register_program(m); },
          [&](const fb::Message& m) { return gpu->run_step(m); }),
      frontend::make_local_service_link(
          "npu", [&](const fb::Message& m) { return npu->register_program(m); },
          [&](const fb::Message& m) { return npu->run_step(m); }));
  nlohmann::json out = agreement_json(engine, variant);
  out["variant"] = variant;
  out["spec"] = spec;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: act_bits_sweep SPEC [SPEC...] (DUET_GPU_INT8_ACT_BITS values)\n";
    return 2;
  }
  try {
    for (const char* variant : {"q4_0", "q8_0"})
      for (int i = 1; i < argc; ++i) std::cout << run(variant, argv[i]).dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "act_bits_sweep: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
