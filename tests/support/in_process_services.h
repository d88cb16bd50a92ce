#pragma once
// gpu_svc's and npu_svc's service objects in the test's process, driven by a ProgramEngine
// through local links: the stack's control messages, without ZeroMQ. Header-only; the test
// links duet_frontend, duet_gpu and duet_npu.
#include <memory>
#include <string>

#include "core/model/model.h"
#include "core/planner/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/frontend/program_engine.h"
#include "services/gpu_svc/gpu_service.h"
#include "services/npu_svc/npu_service.h"

namespace duet::test_support {

// A link that hands RegisterProgram and RunStep to `service`'s handlers.
template <class Service>
std::unique_ptr<frontend::DeviceLink> local_link(std::string name, Service& service) {
  return frontend::make_local_service_link(
      std::move(name), [&service](const fb::Message& m) { return service.register_program(m); },
      [&service](const fb::Message& m) { return service.run_step(m); });
}

// Both services (SoC profile sd8gen3, the shared OpenCL device) and an engine over them, for
// `options` (its model_path is loaded). The engine goes first, while its links still have
// services to call.
struct InProcessServices {
  explicit InProcessServices(const frontend::ProgramEngineOptions& options)
      : soc(load_soc_profile("sd8gen3")),
        gpu(gpu::shared_device(), soc, ShmMemoryResolver("gpu_svc")),
        npu(soc, 0, ShmMemoryResolver("npu_svc")),
        engine(options, LlamaModel::load(options.model_path), local_link("gpu", gpu),
               local_link("npu", npu)) {}

  SocProfile soc;
  gpu::GpuService gpu;
  npu::NpuService npu;
  frontend::ProgramEngine engine;
};

}  // namespace duet::test_support
