#include "services/device/step_trace.h"

#include <algorithm>
#include <chrono>

#include "core/base/error.h"

namespace duet::device {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

StepTraceRing::StepTraceRing(size_t capacity) : slots_(std::max<size_t>(capacity, 1)) {}

void StepTraceRing::record(StepTrace step) {
  std::lock_guard lock(mu_);
  slots_[next_] = std::move(step);  // the old slot's op vector is freed here, not kept
  next_ = (next_ + 1) % slots_.size();
  count_ = std::min(count_ + 1, slots_.size());
}

size_t StepTraceRing::size() const {
  std::lock_guard lock(mu_);
  return count_;
}

nlohmann::json StepTraceRing::query(std::span<const uint32_t> program_ids, uint64_t first_seq,
                                    uint64_t last_seq) const {
  nlohmann::json steps = nlohmann::json::array();
  std::lock_guard lock(mu_);
  const size_t oldest = (next_ + slots_.size() - count_) % slots_.size();
  for (size_t k = 0; k < count_; ++k) {
    const StepTrace& s = slots_[(oldest + k) % slots_.size()];
    if (s.seq < first_seq || s.seq > last_seq) continue;
    if (std::find(program_ids.begin(), program_ids.end(), s.program_id) == program_ids.end())
      continue;
    nlohmann::json ops = nlohmann::json::array();
    for (const OpSpan& o : s.ops)
      ops.push_back({o.op_index, o.start_ns, o.end_ns, o.measured_us, o.modeled_us, o.wait_us});
    steps.push_back({{"program_id", s.program_id},
                     {"seq", s.seq},
                     {"start_ns", s.start_ns},
                     {"end_ns", s.end_ns},
                     {"wait_us", s.wait_us},
                     {"preempted", s.preempted},
                     {"ops", std::move(ops)}});
  }
  return {{"steps", std::move(steps)}, {"kept", count_}, {"capacity", slots_.size()}};
}

msg::Bytes handle_trace_request(const StepTraceRing& ring, const fb::Message& request) {
  const auto* body = request.body_as_TraceRequest();
  if (!body) throw Error(Errc::invalid_argument, "TraceRequest without a body");
  std::vector<uint32_t> ids;
  if (body->program_ids()) ids.assign(body->program_ids()->begin(), body->program_ids()->end());
  const nlohmann::json j = ring.query(ids, body->first_seq(), body->last_seq());
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(fbb, request.request_id(),
                             fb::CreateTraceReplyDirect(fbb, j.dump().c_str()));
}

}  // namespace duet::device
