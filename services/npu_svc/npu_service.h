#pragma once
// npu_svc's control-plane handlers: RegisterProgram, RunStep, CompileGraph, ProfileOp and
// StatusRequest, as functions from a verified request Message to a finished reply buffer. Tests
// call them directly; main.cpp registers them on the ServiceLoop (core/ipc/service.h).
//
// Where a program's memory comes from is the resolver's business: shm_memory_resolver() maps
// the shm segments a Program names (arena, KV, flags) and its GGUF file; tests may hand in
// memory of their own. A bad request throws duet::Error (the loop turns it into an ErrorReply);
// a step that fails is answered with StepFailed carrying the error's code and message.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/ipc/messaging.h"
#include "core/planner/soc_profile.h"
#include "core/program/program.h"
#include "services/device/program_memory.h"
#include "services/device/step_trace.h"
#include "services/npu_svc/graph_cache.h"
#include "services/npu_svc/npu_gemm.h"
#include "services/npu_svc/npu_runner.h"
#include "shm/doorbell_step.h"

namespace duet {
class ServiceLoop;
}

namespace duet::npu {

// HeteroInfer's standard sequence lengths: the graphs a deployment prepares offline.
inline const std::vector<int64_t> kStandardGraphTokens = {1, 32, 64, 128, 256, 512, 1024};

// Steps arrive two ways and run one at a time: RunStep messages on the service loop (tests, the
// in-process mode) and the step doorbell (shm/doorbell.h) of a program registered with one, on
// the doorbell's listener thread (the stack's frontend: no ZeroMQ hop per step).
class NpuService {
 public:
  // At RegisterProgram the graphs of every op are compiled for each standard token count up to
  // the first one >= the program's max_tokens (offline preparation, counted in the status but
  // never in a step); steps then find them under the padding and pipe modes. Empty: none.
  NpuService(SocProfile soc, int threads, MemoryResolver resolver,
             std::vector<int64_t> standard_graph_tokens = kStandardGraphTokens);
  ~NpuService();

  msg::Bytes register_program(const fb::Message& request);
  msg::Bytes run_step(const fb::Message& request);
  msg::Bytes compile_graph(const fb::Message& request);
  msg::Bytes profile_op(const fb::Message& request);
  msg::Bytes status(const fb::Message& request);
  // The ring of recent steps (`duet trace`): TraceRequest -> TraceReply.
  msg::Bytes trace(const fb::Message& request) const {
    return device::handle_trace_request(trace_, request);
  }  // StatusReply carrying status_json()

  // Profile in use, graphs cached (and their shapes), modelled compile time spent, programs.
  nlohmann::json status_json() const;

  GraphCache& graphs() { return graphs_; }
  NpuRunner& runner() { return runner_; }

 private:
  SocProfile soc_;
  GraphCache graphs_;
  NpuGemm gemm_;
  NpuRunner runner_;
  MemoryResolver resolver_;
  std::vector<int64_t> standard_tokens_;
  std::map<uint32_t, ResolvedMemory> memory_;
  std::map<uint32_t, int32_t> hold_flag_;  // each program's DoorbellRef.hold_flag (-1: none)
  uint64_t steps_ = 0, failed_steps_ = 0, doorbell_steps_ = 0;
  device::StepTraceRing trace_;  // recent steps, for `duet trace` (its own lock)
  // ProfileOp's synthetic weights, kept for the next profile of the same shape.
  std::vector<uint8_t> profile_weights_;

  using HeldFlag = std::optional<std::pair<uint32_t, uint64_t>>;
  // Runs one step; with `held`, the program's hold flag (its done flag, when only the frontend
  // waits on it) is not published but handed back there (the doorbell publishes it after the
  // report). The caller holds mu_.
  StepReport execute(uint32_t program_id, const StepArgs& step, uint32_t deadline_ms,
                     HeldFlag* held);
  shm::DoorbellReport run_rung(const shm::DoorbellRequest& request,
                               shm::DoorbellListener::Deferred& publish_after);
  // One step, registration, compile or profile at a time: the loop thread and doorbell threads.
  mutable std::mutex mu_;
  // By flags segment name. Last: its threads stop before anything they use goes.
  shm::DoorbellListeners doorbells_;
};

// Registers the service's handlers and status on a ServiceLoop (what npu_svc's main does).
// The service must outlive the loop's run().
void register_handlers(ServiceLoop& loop, NpuService& service);

}  // namespace duet::npu
