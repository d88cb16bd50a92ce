#pragma once
// What the trace driver runs steps on (agent_bench.cpp):
//   MeasuredBackend  ProgramEngines in this process (interpreter device links): one per class for
//                    the Agent.xpu policy (the proactive one preemptible; both over one shared KV
//                    pool), one for FCFS. Times are wall clock; preemption is real
//                    (request_preempt from a timer thread).
//   ModeledBackend   no computation: each step costs what the SoC profile's timing models say for
//                    a named model shape (the matmuls; attention and element-wise ops left out),
//                    prefill chunks bound by Algorithm 1; preemption stops at the op boundary.
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "core/model/shapes.h"
#include "core/planner/soc_profile.h"
#include "services/frontend/agent_policy.h"
#include "services/frontend/program_engine.h"

namespace duet::bench {

using frontend::agent::Flow;

struct SeqWork {
  uint64_t seq = 0;
  std::vector<int32_t> tokens;
  int32_t pos0 = 0;
};

struct StepOutcome {
  double us = 0;  // how long the step (or the part until it stopped) took
  bool preempted = false;
  double preempt_latency_us = 0;     // from the preemption request to the step stopped
  std::vector<int32_t> next_tokens;  // greedy token per entry (measured only; 0s when modelled)
};

constexpr double kNever = std::numeric_limits<double>::infinity();

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void open(Flow engine, uint64_t seq, int max_positions) = 0;
  virtual void close(Flow engine, uint64_t seq) = 0;
  // One step on the class's engine. For a preemptible step (the proactive engine), a preemption
  // is requested preempt_after_us into it (kNever: none); a preempted step is parked.
  virtual StepOutcome step(Flow engine, const std::vector<SeqWork>& batch, bool decode_busy,
                           double preempt_after_us) = 0;
  virtual StepOutcome resume(double preempt_after_us) = 0;
  virtual bool parked() const = 0;
  virtual int max_step_tokens() const = 0;
  virtual int max_seqs() const = 0;  // entries one step may carry
  // Whether decode entries of both classes may share one step (one KV space). The measured
  // backend's two engines share one KV pool, so its reactive engine steps proactive decoders.
  virtual bool co_batches() const = 0;
};

std::unique_ptr<Backend> make_measured_backend(const std::string& model_path, bool two_engines);
std::unique_ptr<Backend> make_modeled_backend(const SocProfile& soc, const ModelShape& shape,
                                              int chunk_tokens, int max_step_tokens);

}  // namespace duet::bench
