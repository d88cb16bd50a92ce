#pragma once
// The executor: runs a model's steps as programs (core/program.h) on the two devices. It owns
// the stack's data plane: the arena, KV-page and flag segments in shared memory, created with
// O_EXCL and removed by its destructor (and by the supervisor's cleanup if it dies).
//
// Per step it writes the token table and page tables into the arena, starts the step on each
// device that has ops (RunStep over ZeroMQ, or an in-process runner), and waits for each
// device's done flag with the shm waiter (predicted sleep, spin, futex). KV rows are written in
// place by the KvWrite op: no KV byte is ever copied.
//
// Programs are built per token bucket (max tokens of a step): a bucket's plan comes from
// plan_for(bucket), so the solver can choose per phase and length.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/model.h"
#include "core/program.h"
#include "services/frontend/engine.h"
#include "shm/completion_flag.h"
#include "shm/kv_pages.h"
#include "shm/segment.h"

namespace duet::frontend {

// One device as the engine sees it: register programs, run a step asynchronously, then wait.
class DeviceLink {
 public:
  virtual ~DeviceLink() = default;
  virtual std::string name() const = 0;
  virtual void register_program(uint32_t program_id, const fb::ProgramT& program) = 0;
  virtual void start_step(uint32_t program_id, const StepArgs& step) = 0;
  // Waits for the step's completion report (measured/modelled us). Throws on failure.
  struct Report {
    double measured_us = 0;
    double modeled_us = 0;
    double wait_us = 0;
  };
  virtual Report finish_step(uint64_t step_seq, std::chrono::steady_clock::time_point deadline) = 0;
};

struct ProgramEngineOptions {
  std::string model_path;
  std::string stack_id = "default";
  std::string plan_name = "gpu-only";
  // The plan for a bucket (the largest token count its programs take). Default: by plan_name.
  std::function<Plan(uint32_t bucket_tokens)> plan_for;
  std::vector<uint32_t> buckets = {16, 64, 256};  // program sets by max tokens per step
  uint32_t max_seqs = 16;      // sequences per step
  uint32_t max_ctx = 0;        // positions per sequence (0 = the model's context)
  uint32_t kv_pages = 0;       // 0 = enough for max_seqs full sequences
  uint32_t page_tokens = 16;
  int step_timeout_ms = 30000;
  int recovery_timeout_ms = 20000;  // how long a step keeps retrying after a device died
};

class ProgramEngine : public Engine {
 public:
  // Creates the segments (errors if they exist: another stack with this id) and registers the
  // programs of every bucket with gpu and npu (npu may be null if no plan uses it).
  ProgramEngine(ProgramEngineOptions options, std::unique_ptr<LlamaModel> model,
                std::unique_ptr<DeviceLink> gpu, std::unique_ptr<DeviceLink> npu);
  ~ProgramEngine() override;

  const LlamaModel& model() const override { return *model_; }
  std::string plan_name() const override { return options_.plan_name; }
  void open_seq(uint64_t seq_id, int max_positions) override;
  void close_seq(uint64_t seq_id) override;
  void truncate_seq(uint64_t seq_id, int n_past) override;
  std::vector<float> step(const std::vector<SeqStep>& batch, StepStats* stats) override;
  int max_step_tokens() const override { return static_cast<int>(options_.buckets.back()); }
  nlohmann::json status() const override;

  // Re-sends every program to a device that restarted (it re-maps the segments on register).
  void reregister(DeviceLink& device);
  // What the services need to map the data plane.
  ProgramMemory memory() const;
  const shm::FlagTable& flags() const { return flags_; }
  DeviceLink* gpu() const { return gpu_.get(); }
  DeviceLink* npu() const { return npu_.get(); }

  static std::string arena_name(const std::string& stack) { return shm::segment_name(stack, "arena"); }
  static std::string kv_name(const std::string& stack) { return shm::segment_name(stack, "kv"); }
  static std::string flags_name(const std::string& stack) { return shm::segment_name(stack, "flags"); }

 private:
  struct Bucket {
    uint32_t max_tokens;
    Plan plan;
    BuiltPrograms programs;
  };
  struct Sequence {
    int max_positions = 0;
    int n_past = 0;
  };
  struct Attempt {
    DeviceLink::Report gpu, npu;
    double wait_us = 0;
  };
  const Bucket& bucket_for(uint32_t n_tokens) const;
  Attempt run_on_devices(size_t bucket_index, const StepArgs& args);
  // Waits for every device to take its programs again (it restarted), until give_up.
  void recover(std::chrono::steady_clock::time_point give_up);
  void ensure_pages(uint64_t seq_id, int positions);

  ProgramEngineOptions options_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<DeviceLink> gpu_, npu_;
  std::vector<Bucket> buckets_;
  shm::Segment arena_seg_, kv_seg_, flags_seg_;
  std::optional<shm::KvPages> kv_pages_;  // set once the KV segment exists
  shm::FlagTable flags_;
  std::map<uint64_t, Sequence> seqs_;
  uint32_t max_pages_per_seq_ = 0;
  uint64_t step_seq_ = 0;
  // Metrics.
  uint64_t steps_ = 0;
  double flag_wait_us_ = 0;
  uint64_t recoveries_ = 0;
  std::string last_failure_;
};

// A device link for the in-process mode: programs run on a thread of this process with the
// reference interpreter (core/program.h). Like a service, it maps the segments and the model
// file named in the program when the program is registered.
std::unique_ptr<DeviceLink> make_interpreter_link(std::string name);

// A device service reached over ZeroMQ at `endpoint` (ipc://<run-dir>/gpu.sock, ...).
std::unique_ptr<DeviceLink> make_service_link(std::string name, std::string endpoint);

}  // namespace duet::frontend
