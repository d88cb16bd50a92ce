#pragma once
// duet::FlagSync (core/program/program.h) over a shared-memory FlagTable: how a program runner in
// any process waits for the other device's tensors and publishes its own. Header-only so that shm
// does not depend on the program schema.
#include <chrono>
#include <memory>
#include <string>

#include "core/base/error.h"
#include "core/program/program.h"
#include "shm/completion_flag.h"

namespace duet::shm {

// One wait on `flag` reaching `seq` until `until`, ended early by a move past stack epoch `epoch`.
inline WaitResult wait_under_epoch(const FlagTable& table, uint32_t flag, uint64_t seq,
                                   float predicted_us, std::chrono::steady_clock::time_point until,
                                   uint64_t epoch) {
  WaitOptions o;
  o.deadline = until;
  o.predicted_ns = static_cast<int64_t>(predicted_us * 1000.0f);
  o.expected_epoch = epoch;
  return table.wait(flag, seq, o);
}

// A wait that ended on an epoch change: a service restarted and the step must be re-run.
inline void throw_if_epoch_changed(const WaitResult& r, uint32_t flag) {
  if (r.status == WaitStatus::epoch_changed)
    throw Error(Errc::unavailable,
                "stack epoch changed while waiting on flag " + std::to_string(flag));
}

class ShmFlagSync : public FlagSync {
 public:
  // Waits end at `deadline` or when the table's epoch moves past `epoch` (a restart).
  ShmFlagSync(const FlagTable& table, std::chrono::steady_clock::time_point deadline,
              uint64_t epoch)
      : table_(table), deadline_(deadline), epoch_(epoch) {}

  void wait(uint32_t flag, uint64_t seq, float predicted_us) override {
    const WaitResult r = wait_under_epoch(table_, flag, seq, predicted_us, deadline_, epoch_);
    stats.add(r);
    if (r.status == WaitStatus::timeout)
      throw Error(Errc::timeout, "flag " + std::to_string(flag) + " did not reach step " +
                                     std::to_string(seq) + " before the deadline");
    throw_if_epoch_changed(r, flag);
  }
  void publish(uint32_t flag, uint64_t seq) override { table_.publish(flag, seq); }

  WaitStats stats;

 private:
  const FlagTable& table_;
  std::chrono::steady_clock::time_point deadline_;
  uint64_t epoch_;
};

// The epoch a device runs a step under: the one the frontend issued it under (RunStep.epoch), or
// the current one when none was given. A step issued under an older epoch was abandoned when a
// service restarted and is being re-run: waiting on its flags would only hold up the re-run.
inline uint64_t epoch_for_step(const FlagTable& table, uint64_t issued_epoch) {
  const uint64_t now = table.epoch();
  if (issued_epoch == 0) return now;
  if (issued_epoch != now)
    throw Error(Errc::unavailable, "step issued under stack epoch " + std::to_string(issued_epoch) +
                                       " but the stack is at " + std::to_string(now) +
                                       " (a service restarted): not run");
  return issued_epoch;
}

// A step's flags wrapped for a preemptible RunStep: its preempt flag (named by the frontend, past
// the programs' own flags) is read from `table`, and every wait also ends on an epoch change.
// `table` must outlive the returned object (the caller's mappings keep it).
inline std::unique_ptr<FlagSync> make_preemptible_flags(
    const FlagTable& table, FlagSync& inner, const StepArgs& step,
    std::chrono::steady_clock::time_point deadline, const std::string& service) {
  if (static_cast<uint32_t>(step.preempt_flag) >= table.size())
    throw Error(Errc::out_of_range, service + ": preempt flag " +
                                        std::to_string(step.preempt_flag) +
                                        " outside the flag table");
  const uint64_t epoch = epoch_for_step(table, step.epoch);
  return std::make_unique<PreemptibleFlagSync>(
      inner, step, deadline, [&table](uint32_t f) { return table.load(f); },
      [&table, epoch](uint32_t f, uint64_t seq, float predicted_us,
                      std::chrono::steady_clock::time_point until) {
        const WaitResult w = wait_under_epoch(table, f, seq, predicted_us, until, epoch);
        throw_if_epoch_changed(w, f);
        return w.status == WaitStatus::ready;
      });
}

}  // namespace duet::shm
