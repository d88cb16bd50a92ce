#pragma once
// solver_svc's control-plane handlers. PlanRequest -> PlanReply{version, json}: the plan of the
// named shape (or model file; or the stack's model when the request names neither) for the SoC,
// timing mode, phase and token count asked, through the plan cache (core/planner/plan_store.h).
//
// Measured timing needs a profile of the stack's own gpu_svc and npu_svc. Profiling takes far
// longer than a control request may block the loop (heartbeats must keep being answered), so the
// first such request starts it on a worker thread and is answered Errc::busy ("ask again");
// once the profile is on disk, requests are solved from it. A failed profiling run is reported
// to the next request, which may start another.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "core/ipc/messaging.h"
#include "core/planner/plan_store.h"

namespace duet {
class ServiceLoop;
}

namespace duet::solver {

class SolverService {
 public:
  // `default_soc`/`default_model`: what a request that names none gets; `run_dir`: the stack
  // whose devices measured timing profiles.
  SolverService(std::string default_soc, std::string default_model, std::string run_dir);
  ~SolverService();  // waits for a profiling run in progress
  SolverService(const SolverService&) = delete;
  SolverService& operator=(const SolverService&) = delete;

  msg::Bytes plan(const fb::Message& request);
  // The query a PlanRequest asks (throws invalid_argument naming a bad field).
  PlanQuery query_of(const fb::PlanRequest& request) const;
  nlohmann::json status_json() const;
  bool profiling() const { return profiling_; }

 private:
  // Starts measured profiling for `q` unless a run is in progress; throws busy either way, or
  // the last run's error.
  [[noreturn]] void start_profiling(const PlanQuery& q, const QueryModel& model);

  std::string default_soc_;
  std::string default_model_;
  std::string run_dir_;
  uint64_t plans_served_ = 0;
  uint64_t plans_cached_ = 0;
  nlohmann::json last_ = nullptr;  // key and version of the last plan served

  mutable std::mutex mutex_;  // guards the profiling fields below
  std::thread profiler_;
  std::atomic<bool> profiling_{false};
  std::string profiling_key_;
  uint64_t profiling_started_ms_ = 0;
  std::string profiling_error_;
  nlohmann::json last_profile_ = nullptr;
};

// Registers PlanRequest on the loop and adds the service's counters to its status.
void install_solver_handlers(ServiceLoop& loop, SolverService& service);

}  // namespace duet::solver
