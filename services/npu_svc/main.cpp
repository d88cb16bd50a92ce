// npu_svc: the NPU emulator (static-shape graphs, compile cache, systolic-array timing). The
// service runtime (core/ipc/service.h) answers hello/heartbeat/status/shutdown; the NPU handlers
// (services/npu_svc/npu_service.h) register below.
#include <memory>

#include "core/ipc/service.h"
#include "core/planner/soc_profile.h"
#include "services/npu_svc/npu_service.h"

int main(int argc, char** argv) {
  std::unique_ptr<duet::npu::NpuService> service;
  return duet::service_main(argc, argv, duet::ServiceId::npu, [&](duet::ServiceLoop& loop) {
    service = std::make_unique<duet::npu::NpuService>(duet::load_soc_profile(loop.options().soc), 0,
                                                      duet::ShmMemoryResolver("npu_svc"));
    const duet::SocProfile& soc = service->graphs().soc();
    loop.log().info("NPU emulator: profile {} ({}), {} x {}x{} arrays at {} GHz, {} host threads",
                    soc.name, soc.path, soc.npu.cores, soc.npu.array_rows, soc.npu.array_cols,
                    soc.npu.clock_ghz, service->status_json()["threads"].get<int>());
    duet::npu::register_handlers(loop, *service);
  });
}
