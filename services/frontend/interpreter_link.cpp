// The in-process device: a worker thread that runs registered programs with the reference
// interpreter against the shm segments the programs name, exactly as a device service would.
#include <map>
#include <mutex>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "services/frontend/program_engine.h"
#include "services/frontend/step_worker.h"
#include "shm/flag_sync.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

class InterpreterLink : public DeviceLink {
 public:
  explicit InterpreterLink(std::string name) : name_(std::move(name)), worker_(name_) {}

  std::string name() const override { return name_; }
  bool supports_preemption() const override { return true; }

  void register_program(uint32_t program_id, const fb::ProgramT& program) override {
    std::lock_guard lock(mu_);
    // Copy through the wire format, as a service receives it.
    const std::vector<uint8_t> bytes = serialize_program(program);
    auto copy = std::make_unique<fb::ProgramT>();
    flatbuffers::GetRoot<fb::Program>(bytes.data())->UnPackTo(copy.get());
    map_segments(*copy);
    validate_program(*copy, memory_);
    programs_[program_id] = std::move(copy);
  }

  void start_step(uint32_t program_id, const StepArgs& step) override {
    std::lock_guard lock(mu_);
    if (!programs_.count(program_id))
      throw Error(Errc::not_found,
                  name_ + ": program " + std::to_string(program_id) + " is not registered");
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
    worker_.start([this, program_id, step, deadline] { return run(program_id, step, deadline); });
  }

  bool failed_early(uint64_t) override {
    return worker_.failed([](const Report&) { return false; });
  }

  Report finish_step(uint64_t step_seq, Clock::time_point deadline) override {
    return worker_.finish(step_seq, deadline);
  }

 private:
  void map_segments(const fb::ProgramT& p) {
    if (!arena_.valid() || arena_.name() != p.arena_segment)
      arena_ = shm::Segment::open(p.arena_segment);
    if (!kv_.valid() || kv_.name() != p.kv_segment) kv_ = shm::Segment::open(p.kv_segment);
    if (!flags_seg_.valid() || flags_seg_.name() != p.flags_segment) {
      flags_seg_ = shm::Segment::open(p.flags_segment);
      flags_ = shm::FlagTable::attach(flags_seg_);
    }
    if (!weights_ || weights_->path() != p.model_path) weights_ = GgufFile::open(p.model_path);
    memory_ = {arena_.data(), arena_.size(),    kv_.data(),
               kv_.size(),    weights_->data(), weights_->size()};
  }

  // One step on the worker thread: waits on the shm flags preemptibly, until `deadline`.
  Report run(uint32_t program_id, const StepArgs& step, Clock::time_point deadline) {
    const fb::ProgramT* program;
    ProgramMemory memory;
    {
      std::lock_guard lock(mu_);  // not while a registration maps segments
      program = programs_.at(program_id).get();
      memory = memory_;
    }
    const auto t0 = Clock::now();
    Report r;
    const uint64_t epoch = flags_.epoch();
    shm::ShmFlagSync inner(flags_, deadline, epoch);
    PreemptibleFlagSync sync(
        inner, step, deadline, [this](uint32_t f) { return flags_.load(f); },
        [&](uint32_t f, uint64_t seq, float predicted_us, Clock::time_point until) {
          shm::WaitOptions o;
          o.deadline = until;
          o.predicted_ns = static_cast<int64_t>(predicted_us * 1000.0f);
          o.expected_epoch = epoch;
          const shm::WaitResult w = flags_.wait(f, seq, o);
          inner.stats.add(w);
          if (w.status == shm::WaitStatus::epoch_changed)
            throw Error(Errc::unavailable,
                        "stack epoch changed while waiting on flag " + std::to_string(f));
          return w.status == shm::WaitStatus::ready;
        });
    const StepProgress progress = interpret_program(*program, memory, step, sync);
    r.preempted = progress.preempted;
    r.next_op = progress.next_op;
    r.ops_run = progress.ops_run;
    const shm::WaitStats& st = inner.stats;
    r.wait_us =
        static_cast<double>(st.ready_ns[0] + st.ready_ns[1] + st.ready_ns[2] + st.ready_ns[3]) /
        1000.0;
    r.measured_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    return r;
  }

  std::string name_;
  std::mutex mu_;  // the programs and the mapped segments
  std::map<uint32_t, std::unique_ptr<fb::ProgramT>> programs_;
  shm::Segment arena_, kv_, flags_seg_;
  shm::FlagTable flags_;
  std::unique_ptr<GgufFile> weights_;
  ProgramMemory memory_;
  StepWorker<Report> worker_;  // last: its thread starts after every member above exists
};

}  // namespace

std::unique_ptr<DeviceLink> make_interpreter_link(std::string name) {
  return std::make_unique<InterpreterLink>(std::move(name));
}

}  // namespace duet::frontend
