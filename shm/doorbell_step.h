#pragma once
// The step doorbell (shm/doorbell.h) in terms of program steps (core/program/program.h): what a
// RunStep carries as a doorbell request and back, and the FlagSync that holds back a step's done
// flag until the device has written its report. Header-only over core/program/program.h, like
// flag_sync.h, so that shm does not depend on the program schema.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "core/program/program.h"
#include "shm/doorbell.h"

namespace duet::shm {

// The fields a doorbell request carries of its step's arguments, copied either way.
template <class To, class From>
void copy_step_fields(To& to, const From& from) {
  to.seq = from.seq;
  to.n_tokens = from.n_tokens;
  to.n_seqs = from.n_seqs;
  to.tokens_offset = from.tokens_offset;
  to.page_tables_offset = from.page_tables_offset;
  to.page_table_cols = from.page_table_cols;
  to.first_op = from.first_op;
  to.preempt_flag = from.preempt_flag;
  to.preempt_token = from.preempt_token;
  to.epoch = from.epoch;
}

inline DoorbellRequest doorbell_request_of(uint32_t program_id, const StepArgs& s,
                                           uint32_t deadline_ms) {
  DoorbellRequest r;
  r.program_id = program_id;
  copy_step_fields(r, s);
  r.deadline_ms = deadline_ms;
  return r;
}

inline StepArgs step_args_of(const DoorbellRequest& r) {
  StepArgs s;
  copy_step_fields(s, r);
  return s;
}

// The doorbell report of a runner's step report (gpu_svc's and npu_svc's StepReport share these
// fields).
template <class Report>
DoorbellReport doorbell_report_of(const Report& r) {
  DoorbellReport report;
  report.measured_us = r.measured_us;
  report.modeled_us = r.modeled_us;
  report.wait_us = r.wait_us;
  report.next_op = r.next_op;
  report.ops_run = r.ops_run;
  report.preempted = r.preempted;
  return report;
}

// Forwards to `inner` except the publish of `done_flag` (the program's last op's flag: the step
// is done when it is published), which it keeps for the caller to publish once the step's report
// is in shm. A runner may publish from another thread (gpu_svc's OpenCL completion callbacks):
// held() is read after the runner returned, which waited for those.
class HoldDoneFlag : public FlagSync {
 public:
  HoldDoneFlag(FlagSync& inner, int32_t done_flag) : inner_(inner), done_flag_(done_flag) {}
  void wait(uint32_t flag, uint64_t seq, float predicted_us) override {
    inner_.wait(flag, seq, predicted_us);
  }
  void publish(uint32_t flag, uint64_t seq) override {
    if (done_flag_ >= 0 && flag == static_cast<uint32_t>(done_flag_))
      held_seq_.store(seq + 1, std::memory_order_release);  // 0: nothing held
    else
      inner_.publish(flag, seq);
  }
  bool preempt_requested() override { return inner_.preempt_requested(); }
  bool wait_or_preempt(uint32_t flag, uint64_t seq, float predicted_us) override {
    return inner_.wait_or_preempt(flag, seq, predicted_us);
  }
  // The held publish (flag, seq), if the last op ran.
  std::optional<std::pair<uint32_t, uint64_t>> held() const {
    const uint64_t v = held_seq_.load(std::memory_order_acquire);
    if (v == 0) return std::nullopt;
    return std::make_pair(static_cast<uint32_t>(done_flag_), v - 1);
  }

 private:
  FlagSync& inner_;
  int32_t done_flag_;
  std::atomic<uint64_t> held_seq_{0};
};

// A device service's doorbell listeners, one per engine (the engine's flags segment names it).
class DoorbellListeners {
 public:
  DoorbellListeners() = default;
  DoorbellListeners(const DoorbellListeners&) = delete;
  DoorbellListeners& operator=(const DoorbellListeners&) = delete;
  ~DoorbellListeners() { stop_all(); }

  // Serves `program`'s doorbell with `handler` (a program without one: nothing to do). The
  // engine's programs share one doorbell; a new instance is a new engine (a frontend that
  // restarted made the segment again): serve that one from now on. Returns the listener it
  // replaced, for the caller to destroy outside its lock (its thread may be waiting for it).
  std::unique_ptr<DoorbellListener> attach(const fb::ProgramT& program, const std::string& service,
                                           DoorbellListener::Handler handler) {
    if (!program.doorbell) return nullptr;
    if (program.flags_segment.empty())
      throw Error(Errc::invalid_argument,
                  service + ": a doorbell needs the program's flags segment");
    const fb::DoorbellRef& d = *program.doorbell;
    const DoorbellRef ref{d.ring_flag(), d.report_flag(), d.region_offset(), d.slot(),
                          d.instance()};
    std::erase_if(listeners_, [](const auto& entry) {  // engines that are gone (threads ended)
      return entry.second && entry.second->orphaned();
    });
    std::unique_ptr<DoorbellListener>& current = listeners_[program.flags_segment];
    if (current && current->instance() == ref.instance) return nullptr;
    auto listener =
        std::make_unique<DoorbellListener>(program.flags_segment, ref, std::move(handler));
    current.swap(listener);
    return listener;
  }

  // Asks every listener to stop before joining any, so their idle slices run out together.
  void stop_all() {
    for (auto& entry : listeners_)
      if (entry.second) entry.second->request_stop();
    listeners_.clear();
  }

  size_t size() const { return listeners_.size(); }

 private:
  std::map<std::string, std::unique_ptr<DoorbellListener>> listeners_;
};

}  // namespace duet::shm
