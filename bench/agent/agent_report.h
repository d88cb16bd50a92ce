#pragma once
// The agent bench's report (agent_report.cpp): what agent_bench prints about a run.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench/agent/agent_backends.h"
#include "bench/agent/agent_trace.h"

namespace duet::bench {

// The floor no scheduler beats: each reactive request of the trace alone on an idle backend.
double isolated_reactive_mean_ms(Backend& b, const std::vector<Req>& trace);

// A run's requests summarised: reactive latencies and TTFTs, proactive throughput, preemptions.
nlohmann::json summarize(const std::vector<Req>& reqs, uint64_t preemptions,
                         const std::vector<double>& preempt_latency_us, uint64_t steps,
                         double makespan_us, double compress);

// The work the trace offers per second of its arrivals.
nlohmann::json offered_load(const std::vector<Req>& trace);

// Agent.xpu against FCFS: the reactive latency reduction, the best possible one, throughput.
nlohmann::json compare(const nlohmann::json& fcfs, const nlohmann::json& agent, double isolated_ms);

}  // namespace duet::bench
