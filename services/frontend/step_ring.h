#pragma once
// The frontend's ring of recent steps, for `duet trace` (issue 23 item 2). Each step the frontend
// applies is recorded with the request numbers it carried, the frontend's own time around it and
// the engine's StepDetail (the clock reads its phase accounting already makes): a bounded copy of
// a few words per step, nothing formatted. The trace itself (op names, the devices' op spans, the
// modelled SoC timeline) is assembled only when a client asks (frontend_trace.cpp).
#include <cstdint>
#include <deque>
#include <vector>

#include "services/frontend/engine.h"

namespace duet::frontend {

struct StepRecord {
  uint64_t number = 0;             // the frontend's step count when it was applied
  std::vector<uint64_t> requests;  // request numbers of the batch's parts
  int64_t begin_ns = 0;            // the frontend's pass began (admission, batching)
  int64_t end_ns = 0;              // its results applied (sampled, streamed)
  double modeled_us = 0;
  StepDetail detail;
};

class StepRing {
 public:
  explicit StepRing(size_t capacity) : capacity_(capacity) {}
  size_t capacity() const { return capacity_; }
  bool enabled() const { return capacity_ > 0; }
  void record(StepRecord r) {
    if (!capacity_) return;
    if (steps_.size() == capacity_) steps_.pop_front();
    steps_.push_back(std::move(r));
  }
  const std::deque<StepRecord>& steps() const { return steps_; }

 private:
  size_t capacity_;
  std::deque<StepRecord> steps_;
};

}  // namespace duet::frontend
