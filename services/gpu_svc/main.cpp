// gpu_svc: owns one OpenCL device and runs its half of each step. The service runtime
// (core/ipc/service.h) answers hello/heartbeat/status/shutdown; the GPU handlers register below.
#include <cstdio>
#include <memory>
#include <string>

#include "core/ipc/service.h"
#include "core/planner/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/gpu_svc/gpu_service.h"

namespace {

// `gpu_svc --prepare`: builds the kernel program for this machine's OpenCL device(s), and on a
// VNNI host the second one of the int8 kernels' portable family, into the binary cache
// (cl_device.h) and exits. A cold build on PoCL compiles every kernel for each of
// its drivers, 35-75 s on 2 cores: longer than `duet stack up` waits for a healthy stack, so
// deploy/build.sh runs this once after building. With the cache warm it takes well under 1 s.
int prepare() {
  try {
    auto& device = duet::gpu::shared_device();
    // The narrow device's program is built on its own thread; the cache is whole once it is.
    if (device.has_narrow() && !device.wait_narrow())
      throw duet::Error(duet::Errc::internal,
                        "the narrow device's program: " + device.narrow_error());
    device.build_other_isa_programs();
    std::printf(
        "gpu_svc --prepare: %s%s%s: program %s in %.0f ms (%s)\n", device.info().name.c_str(),
        device.info().narrow.empty() ? "" : " + narrow ", device.info().narrow.c_str(),
        device.program_from_cache() ? "loaded from the cache" : "built", device.program_build_ms(),
        device.cache_path().empty() ? "no cache" : device.cache_path().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_svc --prepare: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && std::string(argv[1]) == "--prepare") return prepare();
  // The device is main's own, not shared_device(): its narrow program builds in the background
  // (ready sooner after a restart), and a thread still compiling while the process's static
  // objects are destroyed crashes in clang's; main's locals go (the destructor joins) first.
  std::unique_ptr<duet::gpu::ClDevice> opened;
  std::unique_ptr<duet::gpu::GpuService> service;
  return duet::service_main(argc, argv, duet::ServiceId::gpu, [&](duet::ServiceLoop& loop) {
    opened = duet::gpu::ClDevice::open();
    duet::gpu::ClDevice& device = *opened;
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
    loop.on(duet::fb::Body::TraceRequest, [s](const duet::fb::Message& m) { return s->trace(m); });
    loop.set_status([s] { return s->status_json(); });
  });
}
