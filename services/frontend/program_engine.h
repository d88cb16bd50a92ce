#pragma once
// The executor: runs a model's steps as programs (core/program/program.h) on the two devices. It
// owns the stack's data plane: the arena, KV-page and flag segments in shared memory, created with
// O_EXCL and removed by its destructor (and by the supervisor's cleanup if it dies).
//
// Per step it writes the token table and page tables into the arena, starts the step on each
// device that has ops (a device service: its step doorbell in the flags segment, shm/doorbell.h;
// in-process: RunStep handed to the service object or the interpreter), and waits for each
// device's done flag with the shm waiter (predicted sleep, spin, futex). KV rows are written in
// place by the KvWrite op: no KV byte is ever copied.
//
// Programs are symbolic (core/program/symbolic.h): one program per model and plan serves every
// token count up to the largest bucket, its arena offsets evaluated per step. Buckets remain the
// ranges the plan is chosen for: a bucket's plan comes from plan_for(bucket), so the solver can
// choose per phase and length, and buckets whose plans are equal share one program.
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "core/ipc/messaging.h"
#include "core/model/model.h"
#include "core/planner/soc_profile.h"
#include "core/planner/solver.h"
#include "core/planner/timeline.h"
#include "core/program/program.h"
#include "services/frontend/engine.h"
#include "services/frontend/kv_share.h"
#include "shm/completion_flag.h"
#include "shm/doorbell.h"
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
    bool preempted = false;  // stopped at an op boundary: resume with first_op = next_op
    uint32_t next_op = 0;    // the op it would run next (the op count when it ran to the end)
    uint32_t ops_run = 0;    // ops executed by this start_step
  };
  virtual Report finish_step(uint64_t step_seq, std::chrono::steady_clock::time_point deadline) = 0;
  // Without blocking: has the device already reported that the step failed? (Then the engine
  // stops waiting on flags that will never be published.)
  virtual bool failed_early(uint64_t step_seq) = 0;
  // Whether the device honours StepArgs.first_op / preempt_flag (stops at an op boundary and
  // waits preemptibly). Only then does the engine run preemptible steps on it.
  virtual bool supports_preemption() const { return false; }
  // Step doorbell (shm/doorbell.h): a link to a device service starts steps and reads their
  // reports through the flags segment instead of RunStep/StepDone messages. The engine gives one
  // to every link that wants it, before registering programs that name it.
  virtual bool wants_doorbell() const { return false; }
  virtual void attach_doorbell(const shm::DoorbellBell& /*bell*/) {}
};

struct ProgramEngineOptions {
  std::string model_path;
  std::string stack_id = "default";
  std::string plan_name = "gpu-only";
  // The plan for a bucket (the largest token count its programs take). Default: by plan_name.
  std::function<Plan(uint32_t bucket_tokens)> plan_for;
  // Per-layer plans for a bucket (a subgraph placement, issue 25: ProgramSpec::layer_plans);
  // when set they place the matmuls and plan_for / plan_name only name the plan.
  std::function<std::vector<Plan>(uint32_t bucket_tokens)> layer_plans_for;
  // A placement per phase (a version 2 subgraph plan): the per-layer plans of decode steps,
  // steps whose every entry is a decode entry (SeqStep::decode); layer_plans_for then places the
  // prefill steps, every other step (a prompt of any length, a chunk, a prefill batched with
  // decodes). The phase goes by the step's content, not its size. Each phase has its buckets;
  // buckets whose placements are equal share one program whatever their phase, and every
  // program reads the weights in place from the one mapped model file (the device services map
  // it once and wrap each host range once: gpu_svc's buffers and packed weights are keyed by
  // range, npu_svc reads the mapping), so a second placement costs programs, not weights.
  // Null: every step runs layer_plans_for's.
  std::function<std::vector<Plan>(uint32_t bucket_tokens)> decode_layer_plans_for;
  // The SoC the steps are modelled on (a profile name or .toml path; empty: no model, modelled
  // times 0) and the plan modelled there per bucket (null: the plan executed). Each step's
  // modelled time is that plan's timeline on the SoC (core/planner/timeline.h) for the step's
  // tokens, context and logits rows, so a stack can execute the plan fastest on this host and still
  // report what the solver's plan does on the phone (issue 23 item 5).
  std::string soc = "sd8gen3";
  std::function<Plan(uint32_t bucket_tokens)> soc_plan_for;
  std::vector<uint32_t> buckets = {16, 64, 256};  // plan ranges by max tokens per step
  // One program per bucket, each sized for its bucket (the layout before symbolic programs, for
  // comparisons: DUET_PROGRAMS=per-bucket); off: one program per distinct plan.
  bool per_bucket_programs = false;
  uint32_t max_seqs = 16;  // sequences per step
  uint32_t max_ctx = 0;    // positions per sequence (0 = the model's context)
  uint32_t kv_pages = 0;   // 0 = enough for max_seqs full sequences
  uint32_t page_tokens = 16;
  // KV values: F16 (the stack's default, as llama.cpp's cache; issue 20) or F32.
  DType kv_type = DType::F16;
  int step_timeout_ms = 30000;
  int recovery_timeout_ms = 20000;  // how long a step keeps retrying after a device died
  // Several engines (plans) of one stack side by side: each needs its own segment names and
  // program ids on the services.
  std::string segment_tag;  // appended to the segment names ("arena.<tag>"); letters, digits, _
  uint32_t program_id_base = 0;  // program ids are program_id_base + program * 2 + device
  // Prefix sharing of KV pages (kv_share.h): sequences borrow the published blocks their prompt
  // starts with. Off: every sequence computes its whole prompt (an engine sharing a pool with
  // another turns it off for both).
  bool prefix_sharing = true;
  // Engines of one stack that step each other's sequences (kv_share.h): the first one built
  // makes the pool ("kv.<KvShare::tag>", kv_pages pages), the others use it (same geometry, or an
  // error). Null: this engine has a KV segment of its own.
  std::shared_ptr<KvShare> kv_share;
  // A restarted frontend with requests to adopt (issue 22): attach the stack's existing KV
  // segment when its geometry matches instead of making a fresh one (adopt_seq re-opens the
  // sequences in it; reclaim_unadopted frees the rest). Read once, when the pool is made.
  std::shared_ptr<std::atomic<bool>> adopt_kv;
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
  nlohmann::json trace_step(const StepDetail& step) const override;
  void open_seq(uint64_t seq_id, int max_positions) override;
  void close_seq(uint64_t seq_id) override;
  void reserve_seq(uint64_t seq_id, int positions) override;
  void truncate_seq(uint64_t seq_id, int n_past) override;
  int share_prefix(uint64_t seq_id, std::span<const int32_t> prompt) override;
  void adopt_seq(uint64_t seq_id, int max_positions, int n_past) override;
  uint32_t reclaim_unadopted() override;
  std::vector<float> step(const std::vector<SeqStep>& batch, StepStats* stats) override;
  int max_step_tokens() const override { return static_cast<int>(options_.buckets.back()); }
  nlohmann::json status() const override;
  const KvShare* kv_share() const override { return options_.kv_share.get(); }

  // Preemptible steps (Agent.xpu, issue 9). Give the proactive class its own engine (its own
  // segment_tag and program_id_base: arena, KV pages and flags), so that steps of another engine
  // never touch a parked step's activations. step_preemptible() is step() that
  // request_preempt() (from any thread) stops at the next op boundary of each device: it then
  // returns nullopt and the step is parked, its activations in this engine's arena and its KV
  // rows in place, until resume() continues each device at the op where it stopped, under the
  // same step seq (so cross-device waits on ops that already ran are satisfied). Nothing is
  // recomputed and no byte is copied. While a step is parked, step() and the sequence calls on
  // its sequences throw Error(busy).
  bool preemptible() const override;  // every device link supports preemption
  std::optional<std::vector<float>> step_preemptible(const std::vector<SeqStep>& batch,
                                                     StepStats* stats) override;
  std::optional<std::vector<float>> resume(StepStats* stats) override;  // nullopt: preempted again
  bool parked() const override { return parked_.has_value(); }
  void request_preempt() override;  // no effect when no preemptible step is running
  struct PreemptStats {
    uint64_t preemptions = 0;
    uint64_t resumes = 0;
    uint64_t ops_executed = 0;   // by every device over every step (as the devices report)
    double last_latency_us = 0;  // request_preempt() to every device stopped
    double max_latency_us = 0;
  };
  PreemptStats preempt_stats() const { return pstats_; }
  // Ops a step of n_tokens runs on both devices together (for the no-recompute check).
  size_t step_ops(uint32_t n_tokens) const;

  // What registering cost (status "programs"): programs, the time from the first build to the
  // last registration reply, the arena.
  struct RegistrationStats {
    size_t programs = 0;     // programs registered per device that has ops (gpu's count)
    size_t registered = 0;   // RegisterProgram calls, both devices
    double build_ms = 0;     // building them (the SoC's modelled schedules included)
    double register_ms = 0;  // the devices' registration round trips
    uint64_t arena_bytes = 0;
  };
  RegistrationStats registration() const { return registration_; }
  // Re-sends every program to a device that restarted (it re-maps the segments on register).
  void reregister(DeviceLink& device);
  // What the services need to map the data plane.
  ProgramMemory memory() const;
  const shm::FlagTable& flags() const { return flags_; }
  DeviceLink* gpu() const { return gpu_.get(); }
  DeviceLink* npu() const { return npu_.get(); }

  // "/duet-<stack>-arena[.<tag>]" etc. The supervisor bumps the epoch of every flags segment.
  static std::string arena_name(const std::string& stack, const std::string& tag = "");
  static std::string kv_name(const std::string& stack, const std::string& tag = "");
  static std::string flags_name(const std::string& stack, const std::string& tag = "");

 private:
  struct Bucket {
    uint32_t max_tokens;
    bool decode;  // a decode-phase bucket (only with decode_layer_plans_for)
    Plan plan;
    size_t program = 0;     // programs_[program] runs its steps
    Plan soc_plan;          // what the SoC is modelled running (= plan unless soc_plan_for)
    Schedule soc_schedule;  // its ops, for the modelled timeline
  };
  struct Attempt {
    DeviceLink::Report gpu, npu;
    double wait_us = 0;
    bool preempted = false;
    uint32_t gpu_next = 0, npu_next = 0;  // where each device resumes
    bool on_gpu = false, on_npu = false;
    int64_t rung_ns = 0, flags_ns = 0, reports_ns = 0;  // steady clock (StepDetail)
  };
  // A step between its preemption and its resume.
  struct Parked {
    std::vector<std::pair<uint64_t, int>> n_past;  // each sequence's length once the step is done
    size_t bucket_index = 0;
    StepArgs args;
    uint32_t gpu_next = 0, npu_next = 0;
    int32_t n_logits = 0;
    uint32_t n_tokens = 0;
    int64_t context = 0;  // the longest sequence's positions before the step
    int64_t begin_ns = 0, prepared_ns = 0;
  };
  struct Prepared {
    size_t bucket_index = 0;
    StepArgs args;
    int32_t n_logits = 0;
    int64_t context = 0;
  };
  // The modelled time of a step on the SoC (the bucket's soc_schedule), cached per context
  // page: see modeled_step_us in program_engine_trace.cpp.
  double modeled_step_us(size_t bucket_index, uint32_t n_tokens, int64_t context,
                         int32_t logits_rows) const;
  Timeline modeled_timeline(size_t bucket_index, uint32_t n_tokens, int64_t context,
                            int32_t logits_rows) const;
  Prepared prepare(const std::vector<SeqStep>& batch);
  std::optional<std::vector<float>> execute(Parked work, bool preemptible, bool resuming,
                                            StepStats* stats);
  // The bucket of a step of n_tokens in its phase (decode: every entry a decode entry; engines
  // without decode buckets run decode steps in the prefill ones).
  const Bucket& bucket_for(uint32_t n_tokens, bool decode = false) const;
  // The steps a bucket runs: "prefill" or "decode" (a placement per phase), "any" (one).
  const char* phase_of(const Bucket& b) const;
  const BuiltPrograms& programs_of(size_t bucket_index) const {
    return programs_[buckets_[bucket_index].program];
  }
  uint32_t program_id(size_t program, bool gpu) const {
    return options_.program_id_base + static_cast<uint32_t>(program * 2 + (gpu ? 0 : 1));
  }
  // Builds the programs (one per distinct plan, or per bucket) and the buckets (constructor).
  void build_programs_and_buckets(uint32_t max_ctx, uint32_t n_pages);
  Attempt run_on_devices(size_t bucket_index, StepArgs args, uint32_t gpu_first = 0,
                         uint32_t npu_first = 0, bool preemptible = false);
  void check_not_parked(const char* what) const;
  // Waits for every device to take its programs again (it restarted), until give_up.
  void recover(std::chrono::steady_clock::time_point give_up);
  void ensure_pages(uint64_t seq_id, int positions);
  // Makes or joins the KV pool (constructor).
  void attach_kv(uint32_t n_pages, uint64_t page_bytes);

  ProgramEngineOptions options_;
  uint64_t instance_ = 0;  // StepDetail.engine: unique per engine object in this process
  std::optional<SocProfile> soc_;
  SolverOptions soc_options_;
  // (bucket, tokens, logits rows, context page) -> modelled step us; cleared when large.
  mutable std::map<std::tuple<size_t, uint32_t, int32_t, int64_t>, double> modeled_cache_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<DeviceLink> gpu_, npu_;
  std::vector<Bucket> buckets_;
  std::vector<BuiltPrograms> programs_;
  RegistrationStats registration_;
  shm::Segment arena_seg_, flags_seg_;
  // KV pages and the sequence table: this engine's own, or shared (options_.kv_share).
  std::shared_ptr<KvPool> kv_;
  shm::FlagTable flags_;
  uint32_t max_pages_per_seq_ = 0;
  uint64_t step_seq_ = 0;
  // Preemption: flag preempt_flag_ of this engine's table; each preemptible start gets a fresh
  // token and stops once the flag reaches it.
  uint32_t preempt_flag_ = 0;
  uint64_t next_token_ = 0;
  std::atomic<uint64_t> running_token_{0};
  std::atomic<int64_t> preempt_requested_ns_{0};
  std::mutex preempt_mu_;  // request_preempt may be called from several threads
  // The done flag a preemptible step's wait sleeps on: request_preempt wakes its sleepers, so the
  // wait (interrupted by the preempt flag) ends at once instead of at its next slice.
  std::atomic<uint32_t> awaited_flag_{0};
  std::optional<Parked> parked_;
  PreemptStats pstats_;
  // Metrics.
  // Where a step's wall time goes, summed over steps (status "phase_ms"): the profile of the
  // per-step cost the stack adds over the devices' own time.
  struct PhaseTimes {
    double prepare_us = 0;  // token and page tables into the arena
    double start_us = 0;    // RunStep handed to the devices
    double flags_us = 0;    // waiting for the done flags
    double reports_us = 0;  // waiting for the devices' step reports after the flags
    double logits_us = 0;   // copying the logits out of the arena
    double device_us = 0;   // the devices' own measured time (the slower one per step)
  };
  PhaseTimes phases_;
  uint64_t steps_ = 0;
  double flag_wait_us_ = 0;
  uint64_t recoveries_ = 0;
  std::string last_failure_;
};

// A device link for the in-process mode: programs run on a thread of this process with the
// reference interpreter (core/program/program.h). Like a service, it maps the segments and the
// model file named in the program when the program is registered.
std::unique_ptr<DeviceLink> make_interpreter_link(std::string name);

// A device service reached over ZeroMQ at `endpoint` (ipc://<run-dir>/gpu.sock, ...).
std::unique_ptr<DeviceLink> make_service_link(std::string name, std::string endpoint);
// The flag a device publishes only after its doorbell report (DoorbellRef.hold_flag): its last
// op's, unless an op of `other` (the other device's program of the step) waits on it; -1: none.
int32_t doorbell_hold_flag(const fb::ProgramT& program, const fb::ProgramT& other);

// A device service object living in this process (the in-process mode: all four roles in one
// process, for the stack-overhead benchmark): the same control messages, handed to its handlers
// on a worker thread instead of a socket. Handlers take a verified Message and return the reply.
using ControlHandler = std::function<msg::Bytes(const fb::Message&)>;
std::unique_ptr<DeviceLink> make_local_service_link(std::string name,
                                                    ControlHandler register_program,
                                                    ControlHandler run_step);
// The same over a service object with register_program and run_step handlers (gpu::GpuService,
// npu::NpuService), which must outlive the link.
template <typename Service>
std::unique_ptr<DeviceLink> make_local_service_link(std::string name, Service& service) {
  return make_local_service_link(
      std::move(name), [&service](const fb::Message& m) { return service.register_program(m); },
      [&service](const fb::Message& m) { return service.run_step(m); });
}

// The control messages both kinds of link send and read.
msg::Bytes build_register_program(uint64_t request_id, uint32_t program_id,
                                  const fb::ProgramT& program);
msg::Bytes build_run_step(uint32_t program_id, const StepArgs& step);
void check_registered(const std::string& device, std::span<const uint8_t> reply);
DeviceLink::Report parse_step_reply(const std::string& device, std::span<const uint8_t> reply);

}  // namespace duet::frontend
