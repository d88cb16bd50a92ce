#pragma once
// gpu_svc's control-plane handlers: RegisterProgram, RunStep, ProfileOp and StatusRequest, as
// functions from a verified request Message to a finished reply buffer. Tests call them
// directly; main.cpp registers them on the ServiceLoop (core/ipc/service.h).
//
// Where a program's memory comes from is the resolver's business: the service resolves the
// shm segments a Program names (arena, KV, flags) and the model file; tests hand in memory of
// their own. Errors become ErrorReply (StepFailed for RunStep) with the duet::Error's code.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "core/ipc/messaging.h"
#include "core/planner/soc_profile.h"
#include "core/program/program.h"
#include "services/device/program_memory.h"
#include "services/device/step_trace.h"
#include "services/gpu_svc/gpu_runner.h"
#include "shm/doorbell_step.h"

namespace duet::gpu {

// Steps arrive two ways and run one at a time: RunStep messages on the service loop (tests, the
// in-process mode) and the step doorbell (shm/doorbell.h) of a program registered with one, on
// the doorbell's listener thread (the stack's frontend: no ZeroMQ hop per step).
class GpuService {
 public:
  GpuService(ClDevice& dev, SocProfile soc, MemoryResolver resolver);
  ~GpuService();

  msg::Bytes register_program(const fb::Message& request);
  msg::Bytes run_step(const fb::Message& request);
  msg::Bytes profile_op(const fb::Message& request);
  msg::Bytes status(const fb::Message& request);
  // The ring of recent steps (`duet trace`): TraceRequest -> TraceReply.
  msg::Bytes trace(const fb::Message& request) const {
    return device::handle_trace_request(trace_, request);
  }  // StatusReply carrying status_json()

  // Device name, type, compute units, memory, extensions, copies yes/no, program cache, programs.
  nlohmann::json status_json() const;
  GpuRunner& runner() { return runner_; }

 private:
  using HeldFlag = std::optional<std::pair<uint32_t, uint64_t>>;
  // Runs one step; with `held`, the program's hold flag (its done flag, when only the frontend
  // waits on it) is not published but handed back there (the doorbell publishes it after the
  // report). The caller holds mu_.
  StepReport execute(uint32_t program_id, const StepArgs& step,
                     std::chrono::milliseconds deadline_ms, HeldFlag* held);
  shm::DoorbellReport run_rung(const shm::DoorbellRequest& request,
                               shm::DoorbellListener::Deferred& publish_after);

  ClDevice& dev_;
  SocProfile soc_;
  MemoryResolver resolver_;
  GpuRunner runner_;
  GpuKernels kernels_;
  std::map<uint32_t, ResolvedMemory> memory_;
  std::map<uint32_t, int32_t> hold_flag_;  // each program's DoorbellRef.hold_flag (-1: none)
  uint64_t steps_ = 0, doorbell_steps_ = 0;
  device::StepTraceRing trace_;  // recent steps, for `duet trace` (its own lock)
  // One step, registration or profile at a time: the loop thread and the doorbell threads.
  mutable std::mutex mu_;
  // By flags segment name. Last: its threads stop before anything they use goes.
  shm::DoorbellListeners doorbells_;
};

}  // namespace duet::gpu
