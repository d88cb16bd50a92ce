#include "services/frontend/proactive_time.h"

#include <cmath>

namespace duet::frontend {

void ProactiveTimeBook::add(double ms, const ProactiveState& s, StepKind kind) {
  if (!s.pending || !(ms > 0)) return;
  pending_ms += ms;
  switch (kind) {
    case StepKind::none:
      no_step_ms += ms;
      break;
    case StepKind::main_reactive:
      main_reactive_only_ms += ms;
      if (s.decoders) decoders_held_ms += ms;
      break;
    case StepKind::main_proactive:
      main_proactive_ms += ms;
      break;
    case StepKind::main_shared:
      main_shared_ms += ms;
      break;
    case StepKind::proactive_lane:
      proactive_lane_ms += ms;
      break;
  }
  if (kind != StepKind::proactive_lane && s.prefill_due && s.reactive) gated_prefill_ms += ms;
  if (s.parked) parked_ms += ms;
  if (s.in_flight) overlapped_ms += ms;
}

void ProactiveTimeBook::on_step(double t0_ms, double t1_ms, const ProactiveState& before,
                                StepKind kind, const ProactiveState& after) {
  // The gap between two steps (socket, reaping, the service loop) belongs to the state the
  // previous step left.
  if (last_end_ms_ >= 0 && t0_ms > last_end_ms_)
    add(t0_ms - last_end_ms_, last_after_, StepKind::none);
  add(t1_ms - t0_ms, before, kind);
  if (kind == StepKind::main_reactive && before.pending) ++reactive_only_steps;
  last_end_ms_ = t1_ms;
  last_after_ = after;
}

nlohmann::json ProactiveTimeBook::to_json() const {
  auto r = [](double ms) { return std::round(ms * 100.0) / 100.0; };
  return {{"pending", r(pending_ms)},
          {"proactive_lane", r(proactive_lane_ms)},
          {"main_proactive", r(main_proactive_ms)},
          {"main_shared", r(main_shared_ms)},
          {"main_reactive_only", r(main_reactive_only_ms)},
          {"no_step", r(no_step_ms)},
          {"gated_prefill", r(gated_prefill_ms)},
          {"decoders_held", r(decoders_held_ms)},
          {"parked", r(parked_ms)},
          {"overlapped", r(overlapped_ms)},
          {"reactive_only_steps", reactive_only_steps}};
}

}  // namespace duet::frontend
