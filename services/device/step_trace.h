#pragma once
// A device service's ring of recent steps, for `duet trace` (issue 23): per step its program,
// step seq, wall span and each op's measured span and modelled time. The runners already time
// every op (their StepReport); recording a step is moving that vector into a fixed number of
// slots, so memory is bounded (kDefaultSteps steps, the oldest dropped) and nothing is formatted
// on the step path: the JSON is made only when a TraceRequest asks for it.
//
// Times are steady-clock nanoseconds (CLOCK_MONOTONIC), which every process of the host shares,
// so the frontend can lay device spans beside its own.
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "core/ipc/messaging.h"

namespace duet::device {

struct OpSpan {
  uint32_t op_index = 0;
  int64_t start_ns = 0, end_ns = 0;  // steady clock: when the op ran on this host
  float measured_us = 0;             // the runner's own measure (device time / wall time)
  float modeled_us = 0;              // the op on the SoC profile (as the device costs it alone)
  float wait_us = 0;                 // waiting on the other device's flags before it
};

struct StepTrace {
  uint32_t program_id = 0;
  uint64_t seq = 0;
  int64_t start_ns = 0, end_ns = 0;  // the device's whole step
  double wait_us = 0;
  bool preempted = false;
  std::vector<OpSpan> ops;
};

class StepTraceRing {
 public:
  static constexpr size_t kDefaultSteps = 512;
  explicit StepTraceRing(size_t capacity = kDefaultSteps);

  void record(StepTrace step);
  // The steps of `program_ids` with seq in [first_seq, last_seq], oldest first, as JSON:
  // {"steps": [{"program_id", "seq", "start_ns", "end_ns", "wait_us", "preempted",
  //             "ops": [[op_index, start_ns, end_ns, measured_us, modeled_us, wait_us], ...]}]}
  nlohmann::json query(std::span<const uint32_t> program_ids, uint64_t first_seq,
                       uint64_t last_seq) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::vector<StepTrace> slots_;
  size_t next_ = 0, count_ = 0;
};

// A runner's StepReport (gpu_runner.h, npu_runner.h: the same field names) as a StepTrace.
template <class Report>
StepTrace step_trace_of(uint32_t program_id, const Report& r, int64_t start_ns, int64_t end_ns) {
  StepTrace t;
  t.program_id = program_id;
  t.seq = r.seq;
  t.start_ns = start_ns;
  t.end_ns = end_ns;
  t.wait_us = r.wait_us;
  t.preempted = r.preempted;
  t.ops.reserve(r.ops.size());
  for (const auto& o : r.ops)
    t.ops.push_back({o.op_index, o.start_ns, o.end_ns, static_cast<float>(o.measured_us),
                     static_cast<float>(o.modeled_us), static_cast<float>(o.wait_us)});
  return t;
}

// The TraceRequest handler both device services register (reply: TraceReply).
msg::Bytes handle_trace_request(const StepTraceRing& ring, const fb::Message& request);

// Steady-clock nanoseconds now.
int64_t steady_ns();

}  // namespace duet::device
