// The in-process device: a worker thread that runs registered programs with the reference
// interpreter against the shm segments the programs name, exactly as a device service would.
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "core/gguf.h"
#include "services/frontend/program_engine.h"
#include "shm/flag_sync.h"

namespace duet::frontend {
namespace {

using Clock = std::chrono::steady_clock;

class InterpreterLink : public DeviceLink {
 public:
  explicit InterpreterLink(std::string name) : name_(std::move(name)), worker_([this] { run(); }) {}
  ~InterpreterLink() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

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
    job_ = Job{program_id, step, Clock::now() + std::chrono::seconds(30)};
    report_.reset();
    error_ = nullptr;
    cv_.notify_all();
  }

  bool failed_early(uint64_t) override {
    std::lock_guard lock(mu_);
    return error_ != nullptr;
  }

  Report finish_step(uint64_t step_seq, Clock::time_point deadline) override {
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return report_.has_value() || error_; }))
      throw Error(Errc::timeout,
                  name_ + ": step " + std::to_string(step_seq) + " did not report in time");
    if (error_) std::rethrow_exception(error_);
    return *report_;
  }

 private:
  struct Job {
    uint32_t program_id;
    StepArgs step;
    Clock::time_point deadline;
  };

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

  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || job_.has_value(); });
      if (stop_) return;
      Job job = *job_;
      job_.reset();
      const fb::ProgramT& program = *programs_.at(job.program_id);
      lock.unlock();
      const auto t0 = Clock::now();
      Report r;
      std::exception_ptr error;
      try {
        const uint64_t epoch = flags_.epoch();
        shm::ShmFlagSync inner(flags_, job.deadline, epoch);
        PreemptibleFlagSync sync(
            inner, job.step, job.deadline, [this](uint32_t f) { return flags_.load(f); },
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
        const StepProgress progress = interpret_program(program, memory_, job.step, sync);
        r.preempted = progress.preempted;
        r.next_op = progress.next_op;
        r.ops_run = progress.ops_run;
        const shm::WaitStats& st = inner.stats;
        r.wait_us =
            static_cast<double>(st.ready_ns[0] + st.ready_ns[1] + st.ready_ns[2] + st.ready_ns[3]) /
            1000.0;
      } catch (...) {
        error = std::current_exception();
      }
      r.measured_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
      lock.lock();
      if (error)
        error_ = error;
      else
        report_ = r;
      cv_.notify_all();
    }
  }

  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::optional<Job> job_;
  std::optional<Report> report_;
  std::exception_ptr error_;
  std::map<uint32_t, std::unique_ptr<fb::ProgramT>> programs_;
  shm::Segment arena_, kv_, flags_seg_;
  shm::FlagTable flags_;
  std::unique_ptr<GgufFile> weights_;
  ProgramMemory memory_;
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace

std::unique_ptr<DeviceLink> make_interpreter_link(std::string name) {
  return std::make_unique<InterpreterLink>(std::move(name));
}

}  // namespace duet::frontend
