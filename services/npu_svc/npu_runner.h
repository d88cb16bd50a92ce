#pragma once
// NpuRunner: executes the NPU half of registered Programs (schemas/program.fbs): MatMul and
// Logits ops, in program order, with the functional emulator (npu_gemm.h). Every op runs only
// if the graph cache holds a graph for its static shape (online preparation on request), waits
// on its wait_flags before it starts and publishes its publish_flag when its output is written.
// Each op reports measured time (here, on host threads) and modelled time (on the profile's NPU).
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/planner/op_shape.h"
#include "core/program/program.h"
#include "services/npu_svc/graph_cache.h"
#include "services/npu_svc/npu_gemm.h"

namespace duet::npu {

struct OpTiming {
  uint32_t op_index = 0;
  OpShape shape;
  double measured_us = 0;   // wall time of the emulated op on this host
  double modeled_us = 0;    // the op on the profile's NPU, graph preparation included
  double compile_us = 0;    // modelled online preparation paid by this op (0 when cached)
  uint32_t graphs_run = 0;  // static graphs it took (padding: 1 padded graph; pipe: several)
  int64_t start_ns = 0, end_ns = 0;  // when it computed, steady-clock ns (`duet trace`)
  double wait_us = 0;                // waiting on the other device's flags before it
};

struct StepReport {
  uint64_t seq = 0;
  double wall_us = 0;      // the whole step, waits included
  double measured_us = 0;  // sum of the ops' measured time
  double modeled_us = 0;   // sum of the ops' modelled time
  double compile_us = 0;   // modelled online preparation paid in this step
  double wait_us = 0;      // time spent waiting on other devices' flags
  std::vector<OpTiming> ops;
  // Preemption (StepArgs.first_op / preempt_flag): the op it would run next (the op count when
  // it ran to the end) and the ops it ran.
  uint32_t next_op = 0;
  uint32_t ops_run = 0;
  bool preempted = false;
};

class NpuRunner {
 public:
  NpuRunner(GraphCache& graphs, NpuGemm& gemm) : graphs_(graphs), gemm_(gemm) {}

  // Validates the program against the memory (core validate_program plus the NPU's rules: only
  // MatMul/Logits, supported weight types) and keeps it under `id`, replacing an earlier one.
  // Throws duet::Error naming the op and the problem; nothing is kept then.
  void register_program(uint32_t id, fb::ProgramT program, const ProgramMemory& mem);
  void unregister_program(uint32_t id) { programs_.erase(id); }
  bool has_program(uint32_t id) const { return programs_.count(id) != 0; }
  size_t n_programs() const { return programs_.size(); }
  size_t n_ops(uint32_t id) const;

  // The static shapes a step of n_tokens (with n_logit_rows logits rows) needs graphs for, in
  // op order without duplicates: what a deployment compiles ahead of time.
  std::vector<OpShape> graph_shapes(uint32_t id, uint32_t n_tokens,
                                    uint32_t n_logit_rows = 1) const;

  // Runs one step. Every op's graphs are resolved under its npu_mode (GraphCache::resolve; all
  // ops as online_prepare when `online_prepare`) before the first op runs, so a missing graph
  // fails the step with Errc::not_found naming the shape; then each op waits, computes and
  // publishes. Throws duet::Error (out_of_range for a bad step, timeout from a wait).
  StepReport run_step(uint32_t id, const StepArgs& step, FlagSync& flags,
                      bool online_prepare = false);

  // The static shape of an op when the step carries n rows for it.
  static OpShape op_shape(const fb::OpT& op, uint32_t n_rows);

 private:
  struct Program {
    fb::ProgramT program;
    ProgramMemory mem;
  };
  const Program& find(uint32_t id) const;

  GraphCache& graphs_;
  NpuGemm& gemm_;
  std::map<uint32_t, std::unique_ptr<Program>> programs_;
  std::vector<float> gather_x_, gather_y_;  // Logits rows gathered into a dense block
};

}  // namespace duet::npu
