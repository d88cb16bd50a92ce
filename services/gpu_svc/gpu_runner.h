#pragma once
// GpuRunner: executes registered Programs (schemas/program.fbs) on one OpenCL device, op by op
// in program order on an in-order queue. Segments (the mmapped GGUF file, the shm arena, the KV
// pages) are wrapped with CL_MEM_USE_HOST_PTR where the device shares host memory (zero copy);
// otherwise they are copied in and out around each step (`copies()` is then true: the token
// and page tables go in, and for a step that hands off to the other device its arena; what the
// frontend and the other device read comes back), and the Q4_0/Q8_0 matmul weights are packed
// at upload into the GPU layout of weight_pack.h. The KV pool's device copy starts empty: a page
// goes up the first time a step names it (a pool sized by host memory is far larger than what
// the steps touch, and copying it all at registration took longer than the registration's
// deadline on an H100 host with 128 GB).
//
// Cross-device sync without clFinish on the hot path: an op's wait_flags are waited on by the
// host before its kernels are enqueued; its publish_flag is published from the completion
// callback of its last kernel (clSetEventCallback), so the host never blocks between ops. Only
// the step's end waits for the device, with the step's deadline.
#include <CL/cl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "core/planner/soc_profile.h"
#include "core/program/program.h"
#include "services/gpu_svc/cl_device.h"
#include "services/gpu_svc/event_poller.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/op_fusion.h"
#include "services/gpu_svc/queue_picker.h"
#include "services/gpu_svc/tiled_weights.h"
#include "services/gpu_svc/weight_pack.h"

namespace duet::gpu {

struct OpTiming {
  uint32_t op_index = 0;
  double measured_us = 0;  // device time of the op's kernels (OpenCL profiling events)
  double modeled_us = 0;   // the op on the SoC profile's GPU (core/planner/gpu_timing)
  // When it ran, steady-clock ns (`duet trace`): the kernels' device timestamps moved onto the
  // host clock by the step's end (the last kernel's end is when the host saw the step done).
  int64_t start_ns = 0, end_ns = 0;
  double wait_us = 0;  // the host's wait on the other device's flags before enqueueing it
};

struct StepReport {
  uint64_t seq = 0;
  double wall_us = 0;      // the whole step, host wall clock, waits included
  double measured_us = 0;  // sum of the ops' device time
  double modeled_us = 0;   // sum of the ops' modelled time
  double wait_us = 0;      // host time spent waiting on other devices' flags
  std::vector<OpTiming> ops;
  // Preemption (StepArgs.first_op / preempt_flag): the op it would run next (the op count when
  // it ran to the end) and the ops it ran.
  uint32_t next_op = 0;
  uint32_t ops_run = 0;
  bool preempted = false;
  uint32_t launches = 0;  // kernels enqueued (fused launches count once)
};

class GpuRunner {
 public:
  // soc may be null: modelled times are then 0.
  GpuRunner(ClDevice& dev, const SocProfile* soc);
  ~GpuRunner();
  GpuRunner(const GpuRunner&) = delete;
  GpuRunner& operator=(const GpuRunner&) = delete;

  // Validates every op against the memory (core validate_program plus this device's rules:
  // alignment, head_dim, weight types, buffer limits) and keeps the program under `id`,
  // replacing an earlier one. Throws duet::Error naming the op and the problem.
  void register_program(uint32_t id, fb::ProgramT program, const ProgramMemory& mem);
  void unregister_program(uint32_t id);
  bool has_program(uint32_t id) const { return programs_.count(id) != 0; }
  size_t n_ops(uint32_t id) const;

  // Runs one step: checks the token table and page tables, executes every op, waits for the
  // device with `deadline`, and reports per-op measured and modelled time. `flags` (needed when
  // an op waits or publishes) is used only during the call: every completion callback has run
  // when run_step returns or throws.
  StepReport run_step(uint32_t id, const StepArgs& step, std::chrono::milliseconds deadline,
                      FlagSync* flags = nullptr);

  // Fused launches of consecutive ops on the CPU integer path and the GPU kernels (op_fusion.h):
  // on unless DUET_GPU_FUSE=0; the same bits either way (tests compare both).
  void set_fusion(bool on) { fuse_ = on; }
  bool fusion() const { return fuse_; }
  // Step chains (GpuKernels::begin_chain): a one-token step's ops (but the embedding and what
  // publishes a flag) run as one kernel or a few, where fusion is on, the step is neither
  // preemptible nor in copies mode and the program neither waits for nor publishes flags. On by
  // default; the same bits either way (tests compare).
  void set_step_chains(bool on) { chains_ = on; }
  // Per-op device times (OpTiming::measured_us and the trace's op spans) from the queue's
  // profiling events: gpu.op_timing, auto (the default) on where the device is zero-copy (PoCL,
  // integrated GPUs: free there) and off on discrete GPUs, where profiled launches cost a third
  // of a decode step (ClDevice::use_op_timing). Off, a step reports its wall time as its
  // measured time and its ops carry none.
  void set_op_timing(bool on) { op_timing_ = on; }
  bool op_timing() const { return op_timing_; }

  bool copies() const { return !dev_.zero_copy(); }
  ClDevice& device() { return dev_; }
  // Its kernels, for tests to choose them (GpuKernels::set_gpu_kernels) before registering.
  GpuKernels& kernels() { return kernels_; }
  // Which queue small steps run on, as measured (gpu_svc's status shows it).
  const QueuePicker& queue_picker() const { return picker_; }
  // Steps run on the device's low-priority queue (proactive steps, where it has one).
  uint64_t low_priority_steps() const { return low_priority_steps_; }
  // Copies mode: KV bytes copied from host memory to the device so far (each page once).
  uint64_t kv_bytes_uploaded() const { return kv_bytes_uploaded_; }

 private:
  struct Program;
  // fill: a copying device's buffer starts as a copy of `host` (else empty: the KV pool).
  cl_mem wrap(const void* host, uint64_t bytes, bool read_only, bool fill = true);
  // Copies mode: refuses, before any buffer is made, a program whose weights, arena and KV pool
  // would take the buffers this runner holds past the device's memory (DUET_GPU_MEMORY, else
  // its global memory), naming the sizes and the KV budget to lower. A discrete GPU allocates at
  // first use, so without it the failure would come mid-step.
  void check_device_memory(const ProgramMemory& mem) const;
  // Copies mode: enqueues reads of exactly the bytes `op` wrote back to host memory; returns
  // the last read's event (the caller releases it) or null when the op wrote nothing.
  cl_event read_back_output(const Program& p, const ArenaOffsets& at, const fb::OpT& op,
                            const void* token_rows, const int32_t* page_tables,
                            const StepArgs& step, uint32_t t0, uint32_t t1);
  // Copies mode: enqueues writes, from host memory to the device, of the pages the step's page
  // tables name that the device does not hold yet (kv_current_), every layer: one rectangle per
  // page and group of layers of one buffer. Marks them current.
  void upload_new_kv_pages(const Program& p, const StepArgs& step, const int32_t* page_tables);
  // Copies mode: enqueues reads of the K and V rows the step's tokens wrote (every layer; the
  // rows it did not write are the same on both sides), one rectangle per token, K or V and group
  // of layers of one buffer.
  void read_back_kv_rows(const Program& p, const void* token_rows, const int32_t* page_tables,
                         const StepArgs& step);
  void wait_callbacks(std::chrono::steady_clock::time_point deadline);
  // A MatMul/Logits op's kernel arguments for a step of n tokens (token table at tok_off).
  MatmulArgs matmul_args(const Program& p, const ArenaOffsets& at, const fb::OpT& op, uint32_t n,
                         uint64_t tok_off);

  ClDevice& dev_;
  GpuKernels kernels_;
  const SocProfile* soc_;
  std::map<uint32_t, std::unique_ptr<Program>> programs_;
  // One cl_mem per wrapped host range, shared by every program that uses it (prefill and
  // decode programs of one model share weights, arena and KV).
  std::map<std::pair<const void*, uint64_t>, cl_mem> buffers_;
  // Copies mode, per KV segment (its host base): whether the device holds page i as host memory
  // does. Only this device writes KV and every row it writes comes back (gpu_runner_step.cpp), so
  // a page uploaded once stays current for as long as its buffers live.
  std::map<const void*, std::vector<uint8_t>> kv_current_;
  uint64_t kv_bytes_uploaded_ = 0;
  // Copies mode: the matmul weights packed in place in those buffers (weight_pack.h).
  PackedWeights packed_;
  // CPU integer path: the matmul weights' tiled copies (tiled_weights.h), shared by programs.
  TiledWeights tiled_;
  std::atomic<int> pending_callbacks_{0};
  // Copies mode: publishes cross-device flags as their events complete (event_poller.h).
  std::unique_ptr<EventPoller> publisher_;
  QueuePicker picker_;
  bool fuse_ = fusion_from_env();
  bool chains_ = true;
  bool op_timing_ = true;  // set by the constructor from gpu.op_timing
  uint64_t low_priority_steps_ = 0;
};

}  // namespace duet::gpu
