#pragma once
// The trace through the real serving loop (agent_bench --mode stack): `duet stack up` (supervisor,
// frontend, gpu_svc, npu_svc, solver_svc as processes), each request submitted over the client
// socket at its arrival time (wall clock), its latency taken when its Done comes back.
//   Agent: the stack as it serves (DUET_AGENT on): proactive requests on the preemptible
//          proactive engine, reactive first, contention gating, aging.
//   FCFS:  the same stack with DUET_AGENT=off and every request sent as reactive: one engine,
//          continuous batching, prefill chunks in arrival order, no priorities.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace duet::bench {

struct TraceItem {
  bool reactive = true;
  double arrival_us = 0;  // from the trace's start
  std::vector<int32_t> prompt;
  int out_len = 0;
};

struct ItemTiming {
  double first_token_us = 0;  // from the trace's start (the frontend's TTFT after arrival)
  double done_us = 0;         // from the trace's start, when the Done reached the client
};

struct StackRun {
  std::vector<ItemTiming> timings;  // per trace item
  nlohmann::json agent_status;      // the frontend's status()["agent"] at the end
  // The frontend's proactive time book (services/frontend/proactive_time.h) over the trace
  // alone: its status counters at the end minus those after the warm-up; null without one.
  nlohmann::json proactive_time_ms;
  double makespan_us = 0;
  // After the trace (agent runs only): each reactive request alone on the idle stack, submit to
  // Done: the floor of the reactive latency.
  std::vector<double> isolated_reactive_us;
  std::vector<double> isolated_reactive_ttft_ms;  // the same requests' TTFT (the frontend's)
  // The frontend's engine time over the trace (warm-up excluded): milliseconds spent in engine
  // steps of either lane, and the tokens they carried. busy_ms / makespan is the fraction of the
  // trace the stack was stepping: near 1, the stack is saturated.
  double busy_ms = 0;
  uint64_t busy_tokens = 0;
};

// `duet` is the CLI binary; the stack is torn down (processes, segments, run dir) before return.
// The Agent's knobs reach its frontend as DUET_AGENT_DECODE_CAP, DUET_AGENT_AGING_MS and
// DUET_AGENT_RIDER_SLACK, DUET_AGENT_PROACTIVE_CARRY, DUET_AGENT_PREEMPT, DUET_AGENT_OVERLAP,
// DUET_AGENT_PROACTIVE_PLAN and DUET_AGENT_PROACTIVE_STEP_TOKENS (unset: the frontend's defaults).
struct AgentKnobs {
  int decode_cap = 3;
  double aging_ms = 30000;
  std::string rider_slack;     // a number, "inf", or empty for the frontend's default
  std::string carry;           // DUET_AGENT_PROACTIVE_CARRY: on, off, or empty for the default
  std::string preempt;         // DUET_AGENT_PREEMPT: on, off, or empty for the default
  std::string overlap;         // DUET_AGENT_OVERLAP: off, proactive, all, or empty for the default
  std::string proactive_plan;  // DUET_AGENT_PROACTIVE_PLAN: a stack plan, or empty
  std::string proactive_step_tokens;  // DUET_AGENT_PROACTIVE_STEP_TOKENS, or empty
  std::string max_queue;              // DUET_MAX_QUEUE for both stacks (FCFS and Agent), or empty
};
StackRun run_trace_on_stack(const std::vector<TraceItem>& trace, bool agent,
                            const std::string& duet, const std::string& model,
                            const std::string& stack_id, double timeout_s,
                            const AgentKnobs& knobs = {});

}  // namespace duet::bench
