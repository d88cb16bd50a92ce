#pragma once
// duet::FlagSync (core/program.h) over a shared-memory FlagTable: how a program runner in any
// process waits for the other device's tensors and publishes its own. Header-only so that shm
// does not depend on the program schema.
#include <chrono>
#include <string>

#include "core/error.h"
#include "core/program.h"
#include "shm/completion_flag.h"

namespace duet::shm {

class ShmFlagSync : public FlagSync {
 public:
  // Waits end at `deadline` or when the table's epoch moves past `epoch` (a restart).
  ShmFlagSync(const FlagTable& table, std::chrono::steady_clock::time_point deadline,
              uint64_t epoch)
      : table_(table), deadline_(deadline), epoch_(epoch) {}

  void wait(uint32_t flag, uint64_t seq, float predicted_us) override {
    WaitOptions o;
    o.deadline = deadline_;
    o.predicted_ns = static_cast<int64_t>(predicted_us * 1000.0f);
    o.expected_epoch = epoch_;
    const WaitResult r = table_.wait(flag, seq, o);
    stats.add(r);
    if (r.status == WaitStatus::timeout)
      throw Error(Errc::timeout, "flag " + std::to_string(flag) + " did not reach step " +
                                     std::to_string(seq) + " before the deadline");
    if (r.status == WaitStatus::epoch_changed)
      throw Error(Errc::unavailable,
                  "stack epoch changed while waiting on flag " + std::to_string(flag));
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

}  // namespace duet::shm
