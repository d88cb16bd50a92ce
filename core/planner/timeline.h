#pragma once
// The modelled SoC timeline of one step (HeteroInfer on, say, a Snapdragon 8 Gen 3): the GPU and
// NPU op lists of a program pair, each op costed by the profile's timing models
// (core/planner/gpu_timing, core/planner/npu_timing) and laid out along the schedule. An op starts
// when its device has finished the op before it and every cross-device op it waits on has ended
// plus one fast synchronisation (sleep for the predicted time, then poll a flag: HeteroInfer 4.3).
// NPU ops run as the plan's graph mode says (padding, pipe, online-prepare, exact), paying the
// zero-fill of padded rows and, under online-prepare, the graph compile once per distinct shape in
// the step.
//
// An NPU graph in a step also pays its activations' crossing between the devices
// (npu_activation_io_us, for the tokens that carry data), which no isolated measurement does.
// Ops cost what they cost in a pipelined step (gpu_pipelined_us, npu_pipelined_us) under fast
// sync, and what an isolated measurement pays (gpu_modeled_us, npu_modeled_us) under blocking
// sync; see SyncMode. The solver plans with the isolated latencies (its profiler's), as
// HeteroInfer's does (Table 3).
//
// Memory contention: each op draws DRAM bandwidth at its bytes / modelled time. GPU and NPU
// running at once share mem.dual_gbps: where an op overlaps an op the other device was already
// given and the two draw more than that, both would run at dual / (sum of demands); the later op
// absorbs the time lost, overlap * (1 - dual / sum) (one pass: the earlier op is not moved).
// On sd8gen3 it bites in a split decode (Memory-1: the pipelined GPU GEMV draws 43 GB/s, the
// NPU's decode graphs up to 40, the two together get 60): 7.8 of Llama-8B's 86 ms a token.
// A host profile whose two devices are processes on the same CPU cores (mem.shared_cores, set
// by the fit from traced steps) charges the later op shared_cores x the overlap instead, where
// that is more: they take turns on the cores.
//
// A host profile (fitted from `duet trace` steps: core/planner/trace_profile.h) also charges
// each op with work its device's idle time before it, [gpu.params] op_gap_us (+
// op_gap_us_per_token x the step's tokens beyond the first) and [npu] op_gap_us (+
// op_gap_us_per_token x the same): what a device's span holds beyond its ops and its flag waits (on
// PoCL the dependent kernel's start after the previous one's end; on the emulator, the step loop
// between two ops). The SoC files have none (0).
//
// Schedules come from built programs (schedule_from_programs) or straight from a model shape
// (schedule_from_shape: the same op sequence and hazards as core/program/program_builder.cpp
// without a GGUF, for shapes like llama3-8b that are too big to write out). tests/timeline checks
// the two agree on tiny-fortune.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/model/shapes.h"
#include "core/planner/latency_model.h"
#include "core/planner/op_shape.h"
#include "core/planner/soc_profile.h"
#include "core/planner/solver.h"
#include "core/program/plan.h"
#include "core/program/program.h"

namespace duet {

struct OpRef {
  Device device = Device::gpu;
  uint32_t index = 0;  // position in that device's list
  bool operator==(const OpRef&) const = default;
};

// One op of a program, with what its cost depends on.
struct ScheduleOp {
  OpKind kind = OpKind::MatMul;
  Device device = Device::gpu;
  int layer = -1;
  MatmulRole role = MatmulRole::q;      // MatMul and Logits only
  DType wtype = DType::F32;             // the weight's type (MatMul, Logits, Embed)
  int64_t m = 0, k = 0;                 // MatMul/Logits/Embed: the whole weight [m][k]
  int64_t width = 0;                    // features per token the op reads (its first input's)
  uint32_t row_begin = 0, row_end = 0;  // output rows this op computes
  uint32_t seq_begin = 0, seq_end = 0;  // token rows; seq_end 0 = to the step's last
  // The graph mode the op's NPU graphs run under: the plan's, except a padding placement's (one
  // graph padded up, whatever the plan's mode). Other ops keep the program's default (exact).
  NpuGraphMode npu_mode = NpuGraphMode::exact;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  std::vector<OpRef> waits;  // ops of the other device this one waits for
  bool operator==(const ScheduleOp&) const = default;
};

struct Schedule {
  std::vector<ScheduleOp> gpu, npu;
  NpuGraphMode npu_mode = NpuGraphMode::padding;
  const std::vector<ScheduleOp>& on(Device d) const { return d == Device::gpu ? gpu : npu; }
};

// Weight types of a shape: the paper's W4A16 is Q4_0 everywhere.
struct ShapeTypes {
  DType matmul = DType::Q4_0;
  DType embed = DType::Q4_0;
  DType output = DType::Q4_0;  // = embed when the shape's embeddings are tied
};

Schedule schedule_from_shape(const ModelShape& shape, const ShapeTypes& types, const Plan& plan);
// Throws invalid_argument when a wait names a flag no op of the other device publishes.
Schedule schedule_from_programs(const BuiltPrograms& built, NpuGraphMode npu_mode);

// How the host hands work between the devices.
//   fast      HeteroInfer 4.3: the GPU's kernels are queued ahead and run back to back
//             (gpu_pipelined_us), the NPU's ops run as one program started by flags
//             (npu_pipelined_us); a hand-off costs one fast sync (sleep for the predicted time,
//             poll a flag: SolverOptions::sync_us).
//   blocking  the same schedule without it: a hand-off is a blocking clFinish-style wait
//             (gpu_sync_us, ~400 us), which drains the GPU's queue, so its kernels pay what an
//             isolated, synchronised measurement pays (gpu_modeled_us, npu_modeled_us: Table
//             3's latencies), and the host, blocked in clFinish after a GPU op the NPU needs,
//             submits the GPU's next op only after it. This reproduces the paper's Llama-8B
//             gains (decode 3.56x vs 4.01x, prefill @256 1.16x vs 1.21x) but gives the smaller
//             models 6.1-6.6x where section 5.5 says "comparable improvements of 2.2x". A
//             model without the fixed 400 us (the kernels that start on a drained queue pay
//             their isolated cost, ~440 us composed around Table 3's [4096,4096] GEMV) gives
//             the small models 1.9-2.2x but Llama-8B 1.74x: the paper's 4.01x on Llama-8B beside
//             its 2.2x on Llama-7B, a model of nearly the same size and shape, is not a matter
//             of size, and the text says nothing that sets the two apart. The headline
//             is the 8B's, so this model stays (known gap: bench/modeled/RESULTS.md).
enum class SyncMode { fast, blocking };

struct TimelineOptions {
  int64_t n_tokens = 1;     // tokens in the step
  int64_t context = 0;      // positions already in the KV cache
  int64_t logits_rows = 1;  // rows the Logits op computes (one per sequence)
  bool contention = true;   // the shared-bandwidth penalty above
  SyncMode sync = SyncMode::fast;
  // When set, MatMul and Logits cost what this source says (e.g. ProfiledLatency over a measured
  // profile: the timeline composed from measured op times, to check the composition apart from
  // the op models); everything else stays on the SoC profile's models.
  const LatencySource* matmul_latency = nullptr;
};

struct TimedOp {
  OpRef ref;
  OpKind kind = OpKind::MatMul;
  MatmulRole role = MatmulRole::q;  // MatMul and Logits only
  int layer = -1;
  int64_t tokens = 0;  // token rows it computes (0: nothing to do this step)
  double start_us = 0, end_us = 0;
  double compute_us = 0;      // the timing model's cost (NPU: every graph of the mode)
  double copy_us = 0;         // zero-fill of padded NPU rows
  double compile_us = 0;      // online-prepare graph compile
  double contention_us = 0;   // the shared-bandwidth penalty
  double gap_us = 0;          // the device's idle time before it (a host profile's op_gap_us)
  double demand_gbps = 0;     // DRAM bandwidth it draws while running (bytes / compute time)
  bool waited_cross = false;  // its start was set by another device's op (+ a sync)
  OpRef pred;                 // what set its start (itself when nothing did)
};

struct Timeline {
  double step_us = 0;  // the last op's end
  double gpu_busy_us = 0, npu_busy_us = 0;
  double sync_us = 0;  // fast syncs on cross-device edges that set an op's start
  double copy_us = 0, compile_us = 0, contention_us = 0;
  double gap_us = 0;    // idle time between a device's ops: [gpu.params] op_gap_us, [npu] op_gap_us
  int cross_edges = 0;  // cross-device waits in the schedule
  std::vector<TimedOp> gpu, npu;     // in schedule order
  std::vector<OpRef> critical_path;  // first op to last: each one's start was set by the one before
  const TimedOp& at(OpRef r) const { return r.device == Device::gpu ? gpu[r.index] : npu[r.index]; }
};

// The cost of one cross-device hand-off under t.sync.
double handoff_us(const SocProfile& soc, const SolverOptions& o, const TimelineOptions& t);

// `o` supplies the NPU graph sizes, the fast-sync cost and the copy bandwidth
// (solver_options_for(soc)); o.soc must be set for online-prepare.
Timeline compose_timeline(const Schedule& s, const SocProfile& soc, const SolverOptions& o,
                          const TimelineOptions& t);

// Chrome trace-event JSON (chrome://tracing, Perfetto): one track per device.
nlohmann::json timeline_trace_json(const Timeline& t);
// step_us, busy, sync/copy/compile/contention, cross_edges, critical path length.
nlohmann::json timeline_summary_json(const Timeline& t);

// The solver's latencies straight from the SoC profile's timing models (no profile fit).
class SocModeledLatency : public LatencySource {
 public:
  explicit SocModeledLatency(const SocProfile& soc) : soc_(soc) {}
  double gpu_us(const OpShape& s) const override;
  double npu_us(const OpShape& s) const override;

 private:
  const SocProfile& soc_;
};

// Modelled time to first token: prefill of n_prompt tokens from an empty cache, last row's logits.
double modeled_ttft_us(const ModelShape& shape, const ShapeTypes& types, const Plan& plan,
                       const SocProfile& soc, int64_t n_prompt, bool contention = true,
                       SyncMode sync = SyncMode::fast);
// Modelled time per output token: one decode step at `context` cached positions.
double modeled_tpot_us(const ModelShape& shape, const ShapeTypes& types, const Plan& plan,
                       const SocProfile& soc, int64_t context, bool contention = true,
                       SyncMode sync = SyncMode::fast);

}  // namespace duet
