#pragma once
// Programs: what gpu_svc and npu_svc run for one step of a model under a plan
// (schemas/program.fbs). The builder lays out the activation arena and the KV pages, emits one
// op list per device in model order, and inserts cross-device completion-flag waits wherever a
// device reads (or overwrites) a tensor the other device touched: read-after-write,
// write-after-read and write-after-write hazards. Ops on one device run in order, so only
// cross-device edges need flags.
//
// The interpreter runs a program with the reference ops (core/model/ops.h). It is the oracle for
// the device runners, and the in-process executor.
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/model/dtype.h"
#include "core/program/plan.h"
#include "core/program/symbolic.h"
#include "schemas/program_generated.h"

namespace duet {

class LlamaModel;

// The arena of a program (core/program/symbolic.h). The step's interface sits at fixed offsets
// (the frontend writes the token and page tables and reads the logits there); the activations
// follow in slots whose offsets and sizes are expressions of the step's symbols, reused by
// tensors whose size provably fits (HeteroInfer's memory pool, Transformer-Lite's rule).
struct ArenaPlan {
  uint64_t tokens = 0;       // int32 [max_tokens][4]: token, position, sequence, logits_row
  uint64_t page_tables = 0;  // int32 [max_seqs][max_pages]: a step's rows are P columns wide
  uint64_t logits = 0;       // f32 [max_logit_rows][n_vocab]
  std::vector<SymExpr> slot_offset, slot_size;  // every slot, the three above first
  SymExpr end;           // the slots' end: the arena a step of given symbols touches
  uint64_t bytes = 0;    // `end` at the symbols' largest values: the arena's size
  uint32_t tensors = 0;  // tensors placed (one per value of each layer)
};

struct KvGeometry {
  uint32_t page_tokens = 16;
  uint32_t n_pages = 0;
  uint32_t n_layers = 0;
  uint32_t kv_dim = 0;
  uint32_t row_bytes = 0;     // one K or V row: kv_row_bytes of the value type
  uint64_t pages_offset = 0;  // where page 0 starts in the KV segment (after the allocator header)
  uint64_t layer_page_bytes() const { return uint64_t{2} * page_tokens * row_bytes; }
  uint64_t page_bytes() const { return uint64_t{n_layers} * layer_page_bytes(); }
  uint64_t bytes() const { return pages_offset + page_bytes() * n_pages; }
};

// The KV layout's arithmetic (schemas/program.fbs KvLayout: layer-major pages). Every runner
// addresses KV through these.
// Bytes of one K or V row of kv_dim values: 4 or 2 per value (F32, F16), 34 per 32 (Q8_0, ggml's
// blocks along the head dim; kv_dim a multiple of 32). invalid_argument for other types.
uint32_t kv_row_bytes(DType type, uint32_t kv_dim);
uint32_t kv_row_bytes(const fb::KvLayoutT& kv);
uint64_t kv_layer_page_bytes(const fb::KvLayoutT& kv);
uint64_t kv_layer_stride(const fb::KvLayoutT& kv);  // bytes between two layers' regions
uint64_t kv_layer_offset(const fb::KvLayoutT& kv, uint32_t layer);  // layer's region, from 0
// K (which = 0) or V (which = 1) row `row` of `page` in `layer`, from the segment's start.
uint64_t kv_row_offset(const fb::KvLayoutT& kv, uint32_t layer, uint32_t which, uint32_t page,
                       uint32_t row);

struct ProgramSpec {
  const LlamaModel* model = nullptr;
  Plan plan = Plan::gpu_only();
  // A placement per layer (issue 25's subgraph placement: puzzle/subgraph_program.h): when not
  // empty, n_layer + 1 plans; layer l's matmuls are placed by layer_plans[l] and the logits by the
  // last, and `plan` places nothing. Hand-offs between layers on different devices are the
  // builder's ordinary cross-device flag waits.
  std::vector<Plan> layer_plans;
  uint32_t max_tokens = 1;      // the most tokens one step may carry
  uint32_t max_seqs = 1;        // rows of the page tables
  uint32_t max_logit_rows = 1;  // the most logits rows one step produces
  uint32_t max_ctx = 0;         // positions per sequence (0 = the model's context)
  uint32_t kv_pages = 0;        // pages in the KV segment (0 = max_seqs * pages per sequence)
  uint32_t page_tokens = 16;
  // Arena slots reused by tensors whose size provably fits (symbolic.h); off: a slot per tensor.
  bool reuse_slots = true;
  DType kv_type = DType::F32;    // F32 or F16 values in the KV pages
  uint64_t kv_pages_offset = 0;  // shm::KvPages puts its header first: page 0 starts here
  uint32_t flag_base = 0;        // first flag index this pair of programs may use
  std::string name;
  std::string arena_segment;
  std::string kv_segment;
  std::string flags_segment;
};

struct BuiltPrograms {
  fb::ProgramT gpu;
  fb::ProgramT npu;  // no ops when the plan keeps everything on the GPU
  ArenaPlan arena;
  KvGeometry kv;
  uint32_t max_pages_per_seq = 0;
  uint32_t n_flags = 0;              // flags used: [flag_base, flag_base + n_flags)
  std::vector<uint32_t> done_flags;  // published by each device's last op: the step is done
                                     // when every one of them reaches the step's seq
};

BuiltPrograms build_programs(const ProgramSpec& spec);

// flatbuffers bytes of a program (for RegisterProgram) and back.
std::vector<uint8_t> serialize_program(const fb::ProgramT& program);

// Memory a program runs against: the three segments mapped into this process.
struct ProgramMemory {
  uint8_t* arena = nullptr;
  uint64_t arena_bytes = 0;
  uint8_t* kv = nullptr;
  uint64_t kv_bytes = 0;
  const uint8_t* weights = nullptr;
  uint64_t weights_bytes = 0;
};

// Checks every TensorRef of every op against the segment sizes for max_tokens rows, and the op
// fields against each other (head counts, row ranges). With slots: the slots lie within the arena
// at the symbols' largest values and provably never overlap, and every Arena ref fits its slot at
// every N (its row bytes within the slot's N coefficient, or its bytes within a constant slot).
// Throws Error(invalid_argument or out_of_range) naming the op and the problem. Runners call this
// at registration.
void validate_program(const fb::ProgramT& program, const ProgramMemory& mem);

// One step's arguments, as RunStep carries them.
struct StepArgs {
  uint64_t seq = 0;
  uint32_t n_tokens = 0;
  uint32_t n_seqs = 1;
  uint64_t tokens_offset = 0;       // arena offset of the token table
  uint64_t page_tables_offset = 0;  // arena offset of the page tables
  uint32_t page_table_cols = 0;     // max pages per sequence
  // Preemption (Agent.xpu): run ops [first_op, end); a preemptible step stops at the next op
  // boundary once flag preempt_flag reaches preempt_token (see FlagSync::preempt_requested).
  uint32_t first_op = 0;
  int32_t preempt_flag = -1;
  uint64_t preempt_token = 0;
  // Stack epoch the step was issued under (0: use the epoch current when the device starts it).
  uint64_t epoch = 0;
};

// A step's symbols (symbolic.h): N = n_tokens, S = n_seqs, P = page_table_cols.
inline SymValues step_symbols(const StepArgs& step) {
  return {step.n_tokens, step.n_seqs, step.page_table_cols};
}

// The arena addresses of one step of a program: its slots' offsets evaluated once per step (8
// multiply-adds a slot over monomial values computed once, no allocation); an Arena TensorRef's
// address is then one add. A program without slots keeps absolute offsets.
class ArenaOffsets {
 public:
  static constexpr size_t kMaxSlots = 64;
  ArenaOffsets() = default;
  ArenaOffsets(const fb::ProgramT& program, const SymValues& v) { evaluate(program, v); }
  // The program's slot table must have been validated (validate_program).
  void evaluate(const fb::ProgramT& program, const SymValues& v);
  uint64_t operator()(const fb::TensorRef& r) const {
    return r.segment() == fb::SegmentKind::Arena && n_slots_ ? slot_[r.slot()] + r.offset()
                                                             : r.offset();
  }
  size_t slots() const { return n_slots_; }

 private:
  std::array<uint64_t, kMaxSlots> slot_{};
  size_t n_slots_ = 0;
};

// Refuses (out_of_range, prefixed by `who`) a step whose symbols pass the program's largest:
// n_seqs > max_seqs or page_table_cols > max_pages, where the program has slots (their offsets
// would pass the arena). n_tokens is each runner's own check.
void check_step_symbols(const fb::ProgramT& program, const StepArgs& step, const std::string& who);

// Where a step stopped: next_op == the program's op count when it ran to the end.
struct StepProgress {
  uint32_t next_op = 0;
  uint32_t ops_run = 0;
  bool preempted = false;
};

// How a device waits for and publishes completion flags. The in-process interpreter uses
// atomics in memory; the services use the shm flag table.
class FlagSync {
 public:
  virtual ~FlagSync() = default;
  virtual void wait(uint32_t flag, uint64_t seq, float predicted_us) = 0;  // throws on timeout
  virtual void publish(uint32_t flag, uint64_t seq) = 0;
  // Preemption: a runner checks this between ops; a preemptible wait returns false (instead of
  // blocking on) when a preemption is requested while the flag is not yet ready.
  virtual bool preempt_requested() { return false; }
  virtual bool wait_or_preempt(uint32_t flag, uint64_t seq, float predicted_us) {
    wait(flag, seq, predicted_us);
    return true;
  }
};

// The FlagSync of a preemptible step (any runner): publishes and waits through `inner`, but a
// wait on a flag is done in short slices (wait_until: true once the flag reaches seq, false at
// the slice's end) so that a preemption request (flag step.preempt_flag reaching
// step.preempt_token, read with `load`) ends it: the other device may have stopped before
// publishing what this op waits for. Without a preempt flag it is `inner`.
class PreemptibleFlagSync : public FlagSync {
 public:
  using Clock = std::chrono::steady_clock;
  using Load = std::function<uint64_t(uint32_t flag)>;
  using WaitUntil =
      std::function<bool(uint32_t flag, uint64_t seq, float predicted_us, Clock::time_point until)>;
  PreemptibleFlagSync(FlagSync& inner, const StepArgs& step, Clock::time_point deadline, Load load,
                      WaitUntil wait_until)
      : inner_(inner),
        step_(step),
        deadline_(deadline),
        load_(std::move(load)),
        wait_until_(std::move(wait_until)) {}
  void wait(uint32_t flag, uint64_t seq, float predicted_us) override {
    inner_.wait(flag, seq, predicted_us);
  }
  void publish(uint32_t flag, uint64_t seq) override { inner_.publish(flag, seq); }
  bool preempt_requested() override;
  bool wait_or_preempt(uint32_t flag, uint64_t seq, float predicted_us) override;

 private:
  FlagSync& inner_;
  StepArgs step_;
  Clock::time_point deadline_;
  Load load_;
  WaitUntil wait_until_;
};

// Runs ops [step.first_op, end) of `program` with the reference ops. Token rows of the step are
// read from the token table; positions, sequences and logits rows likewise. Stops at an op
// boundary (before an op's waits, or in them) when flags.preempt_requested().
StepProgress interpret_program(const fb::ProgramT& program, const ProgramMemory& mem,
                               const StepArgs& step, FlagSync& flags);

}  // namespace duet
