#include "services/gpu_svc/gpu_service.h"

#include <string>

#include "core/base/error.h"
#include "core/planner/gpu_timing.h"
#include "services/gpu_svc/gpu_profiler.h"
#include "shm/doorbell_step.h"

namespace duet::gpu {

GpuService::GpuService(ClDevice& dev, SocProfile soc, MemoryResolver resolver)
    : dev_(dev),
      soc_(std::move(soc)),
      resolver_(std::move(resolver)),
      runner_(dev, &soc_),
      kernels_(dev) {}

GpuService::~GpuService() {
  doorbells_.stop_all();  // stop serving rings before anything a step uses goes
}

msg::Bytes GpuService::register_program(const fb::Message& request) {
  const auto* body = request.body_as_RegisterProgram();
  if (!body || !body->program())
    throw Error(Errc::invalid_argument, "RegisterProgram without a program");
  fb::ProgramT program;
  body->program()->UnPackTo(&program);
  const auto n_ops = static_cast<uint32_t>(program.ops.size());
  const bool doorbell = program.doorbell != nullptr;
  std::unique_ptr<shm::DoorbellListener> replaced;
  {
    std::lock_guard lock(mu_);
    ResolvedMemory resolved = resolver_(program);
    replaced = doorbells_.attach(
        program, "gpu_svc",
        [this](const shm::DoorbellRequest& r, shm::DoorbellListener::Deferred& after) {
          return run_rung(r, after);
        });
    hold_flag_[body->program_id()] = program.doorbell ? program.doorbell->hold_flag() : -1;
    runner_.register_program(body->program_id(), std::move(program), resolved.mem);
    memory_[body->program_id()] = std::move(resolved);
  }
  replaced.reset();  // outside mu_: its thread may be waiting for it
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(fbb, request.request_id(),
                             fb::CreateProgramRegistered(fbb, body->program_id(), n_ops, doorbell));
}

StepReport GpuService::execute(uint32_t program_id, const StepArgs& step,
                               std::chrono::milliseconds deadline_ms, HeldFlag* held) {
  auto mem = memory_.find(program_id);
  if (mem == memory_.end())
    throw Error(Errc::not_found, "gpu_svc: no program " + std::to_string(program_id));
  const auto deadline = std::chrono::steady_clock::now() + deadline_ms;
  std::unique_ptr<FlagSync> flags, preemptible;
  if (mem->second.make_flags) flags = mem->second.make_flags(deadline, step.epoch);
  if (step.preempt_flag >= 0) {
    if (!flags || !mem->second.make_preemptible)
      throw Error(Errc::unsupported,
                  "gpu_svc: this program's memory does not support preemptible steps");
    preemptible = mem->second.make_preemptible(*flags, step, deadline);
  }
  FlagSync* sync = preemptible ? preemptible.get() : flags.get();
  std::optional<shm::HoldDoneFlag> hold;
  if (held && sync) {
    hold.emplace(*sync, hold_flag_[program_id]);
    sync = &*hold;
  }
  const int64_t start_ns = device::steady_ns();
  StepReport r = runner_.run_step(program_id, step, deadline_ms, sync);
  ++steps_;
  trace_.record(device::step_trace_of(program_id, r, start_ns, device::steady_ns()));
  if (held && hold) *held = hold->held();
  return r;
}

msg::Bytes GpuService::run_step(const fb::Message& request) {
  const auto* body = request.body_as_RunStep();
  if (!body) throw Error(Errc::invalid_argument, "RunStep without a body");
  try {
    const StepArgs step = msg::step_args_of(*body);
    std::lock_guard lock(mu_);
    const StepReport r =
        execute(body->program_id(), step, std::chrono::milliseconds(body->deadline_ms()), nullptr);
    return msg::make_step_done(request.request_id(), *body, r);
  } catch (const Error& e) {
    return msg::make_step_failed(request.request_id(), *body, e);
  }
}

shm::DoorbellReport GpuService::run_rung(const shm::DoorbellRequest& request,
                                         shm::DoorbellListener::Deferred& publish_after) {
  // Errors are the listener's to report (code and message), as StepFailed carries them.
  std::lock_guard lock(mu_);
  HeldFlag held;
  const StepReport r = execute(request.program_id, shm::step_args_of(request),
                               std::chrono::milliseconds(request.deadline_ms), &held);
  ++doorbell_steps_;
  if (held) publish_after.push_back(*held);
  return shm::doorbell_report_of(r);
}

msg::Bytes GpuService::profile_op(const fb::Message& request) {
  const auto* body = request.body_as_ProfileOp();
  if (!body) throw Error(Errc::invalid_argument, "ProfileOp without a body");
  const uint32_t raw_type = static_cast<uint32_t>(body->dtype());
  if (!dtype_known(raw_type))
    throw Error(Errc::invalid_argument, "ProfileOp: unknown dtype " + std::to_string(raw_type));
  const auto raw_kind = static_cast<uint8_t>(body->kind());
  if (raw_kind > static_cast<uint8_t>(OpKind::Logits))
    throw Error(Errc::invalid_argument, "ProfileOp: unknown op kind " + std::to_string(raw_kind));
  OpShape shape;
  shape.kind = static_cast<OpKind>(raw_kind);
  shape.wtype = static_cast<DType>(raw_type);
  shape.m = body->rows();
  shape.k = body->cols();
  shape.n = body->n_tokens();
  const double modeled = gpu_modeled_us(soc_, shape);
  OpMeasurement measured;
  if (!body->modeled_only()) {
    std::lock_guard lock(mu_);  // the device's queue: never beside a step
    // A profile describes the device itself (all cores), whichever queue the last step used.
    dev_.use_low_priority(false);
    dev_.use_narrow(false);
    dev_.use_op_timing(true);  // measure_op reads the kernels' device times
    measured = measure_op(kernels_, shape, body->reps());
  }
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(fbb, request.request_id(),
                             fb::CreateProfileResult(fbb, static_cast<float>(measured.median_us),
                                                     static_cast<float>(modeled), measured.reps));
}

msg::Bytes GpuService::status(const fb::Message& request) {
  return msg::make_status_reply(request.request_id(), fb::ServiceKind::Gpu, status_json().dump());
}

nlohmann::json GpuService::status_json() const {
  std::lock_guard lock(mu_);
  const DeviceInfo& d = dev_.info();
  nlohmann::json programs = nlohmann::json::array();
  for (const auto& [id, mem] : memory_)
    programs.push_back({{"id", id}, {"ops", runner_.n_ops(id)}});
  return {{"device", d.name},
          {"platform", d.platform},
          {"vendor", d.vendor},
          {"version", d.version},
          {"driver", d.driver},
          {"type", d.type},
          {"compute_units", d.compute_units},
          {"op_timing", runner_.op_timing()},
          {"global_mem_bytes", d.global_mem_bytes},
          {"local_mem_bytes", d.local_mem_bytes},
          {"max_alloc_bytes", d.max_alloc_bytes},
          {"host_unified_memory", d.host_unified},
          {"extensions", d.extensions},
          {"copies", runner_.copies()},
          {"kv_bytes_uploaded", runner_.kv_bytes_uploaded()},
          {"program_binary_cached", dev_.program_from_cache()},
          {"program_build_ms", dev_.program_build_ms()},
          {"program_cache_path", dev_.cache_path()},
          {"soc", soc_.name},
          {"programs", programs},
          {"steps", steps_},
          {"doorbell_steps", doorbell_steps_},
          {"doorbells", doorbells_.size()},
          {"narrow_device", d.narrow},
          {"narrow_ready", dev_.narrow_ready()},
          {"narrow", runner_.queue_picker().to_json()},
          {"low_priority_queue", d.low_priority},
          {"low_priority_steps", runner_.low_priority_steps()}};
}

}  // namespace duet::gpu
