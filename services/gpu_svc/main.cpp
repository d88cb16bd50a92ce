// gpu_svc: owns one OpenCL device and runs its half of each step. The service runtime
// (core/service.h) answers hello/heartbeat/status/shutdown; the GPU handlers register below.
#include <memory>

#include "core/service.h"
#include "core/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/gpu_svc/gpu_service.h"

int main(int argc, char** argv) {
  std::unique_ptr<duet::gpu::GpuService> service;
  return duet::service_main(argc, argv, duet::ServiceId::gpu, [&](duet::ServiceLoop& loop) {
    auto& device = duet::gpu::shared_device();
    service = std::make_unique<duet::gpu::GpuService>(
        device, duet::load_soc_profile(loop.options().soc), duet::ShmMemoryResolver("gpu_svc"));
    loop.log().info(
        "OpenCL device {} ({}), {} compute units, copies: {}, program binary {} in {:.0f} ms",
        device.info().name, device.info().type, device.info().compute_units, !device.zero_copy(),
        device.program_from_cache() ? "from cache" : "built", device.program_build_ms());
    auto* s = service.get();
    loop.on(duet::fb::Body::RegisterProgram,
            [s](const duet::fb::Message& m) { return s->register_program(m); });
    loop.on(duet::fb::Body::RunStep, [s](const duet::fb::Message& m) { return s->run_step(m); });
    loop.on(duet::fb::Body::ProfileOp,
            [s](const duet::fb::Message& m) { return s->profile_op(m); });
    loop.set_status([s] { return s->status_json(); });
  });
}
