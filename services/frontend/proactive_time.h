#pragma once
// Where the serving loop's wall time goes while proactive work waits (issue 9: why the Agent
// serves less proactive throughput than FCFS at saturation). The frontend reports each pass of
// its step: the state of the proactive work before it, what the step carried, and when it
// started and ended. Every millisecond with proactive work unfinished lands in exactly one of
// the `by what ran` buckets; the `while` buckets say why the proactive engine was not stepping
// (they overlap the first ones, not each other's sum). Frontend status `agent.proactive_time_ms`.
#include <cstdint>
#include <nlohmann/json.hpp>

namespace duet::frontend {

// The proactive work as the step finds it.
struct ProactiveState {
  bool pending = false;      // a proactive request is queued or runs unfinished
  bool prefill_due = false;  // a proactive prompt is not fully prefilled (or its step parked)
  bool decoders = false;     // a proactive request waits for its next decode token
  bool reactive = false;     // a reactive request runs (the proactive lane is gated)
  bool parked = false;       // a proactive step is parked at an op boundary
  bool in_flight = false;    // a proactive step runs on a worker beside the main lane (overlap)
};

// What one step carried.
enum class StepKind : uint8_t {
  none,            // nothing ran (no work, or work blocked on admission)
  main_reactive,   // a main-engine step with reactive work only
  main_proactive,  // a main-engine step with proactive work only (riders, decoders)
  main_shared,     // a main-engine step with both
  proactive_lane,  // a proactive-engine step (fresh, resumed; ran out or preempted)
};

class ProactiveTimeBook {
 public:
  // One step from t0_ms to t1_ms, `before` the proactive state at t0. The gap since the previous
  // step ended counts as `no step` when proactive work was pending at that end.
  void on_step(double t0_ms, double t1_ms, const ProactiveState& before, StepKind kind,
               const ProactiveState& after);
  nlohmann::json to_json() const;

  double pending_ms = 0;
  // by what ran
  double proactive_lane_ms = 0, main_proactive_ms = 0, main_shared_ms = 0,
         main_reactive_only_ms = 0, no_step_ms = 0;
  // while (overlapping the above): a proactive prompt was due and the lane gated by reactive
  // work; proactive decoders waited through a reactive-only main step; a step was parked.
  double gated_prefill_ms = 0, decoders_held_ms = 0, parked_ms = 0;
  // while a proactive step ran on a worker beside the main lane (overlap; under any of the above)
  double overlapped_ms = 0;
  uint64_t reactive_only_steps = 0;

 private:
  void add(double ms, const ProactiveState& s, StepKind kind);
  double last_end_ms_ = -1;
  ProactiveState last_after_;
};

}  // namespace duet::frontend
