#include "services/npu_svc/npu_runner.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/base/error.h"
#include "core/planner/npu_timing.h"

namespace duet::npu {
namespace {

using Clock = std::chrono::steady_clock;

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

std::string op_where(const fb::OpT& op, size_t index) {
  return "op " + std::to_string(index) + " (" + fb::EnumNameOpKind(op.kind) + ", layer " +
         std::to_string(op.layer) + ")";
}

struct TokenRow {
  int32_t token, pos, seq, logits_row;
};

// Token rows [t0, t1) an op covers in a step of n tokens (0,0 = all).
std::pair<uint32_t, uint32_t> token_range(const fb::OpT& op, uint32_t n) {
  const uint32_t t0 = std::min(op.seq_begin, n);
  const uint32_t t1 = op.seq_end ? std::min(op.seq_end, n) : n;
  return {t0, std::max(t0, t1)};
}

ops::Matrix weight_matrix(const ProgramMemory& mem, const fb::TensorRef& w) {
  return ops::Matrix{static_cast<DType>(w.dtype()), w.rows(), w.cols(), mem.weights + w.offset()};
}

}  // namespace

OpShape NpuRunner::op_shape(const fb::OpT& op, uint32_t n_rows) {
  OpShape s;
  s.kind = static_cast<OpKind>(op.kind);
  s.wtype = static_cast<DType>(op.weight->dtype());
  const uint32_t row_end = op.row_end ? op.row_end : op.weight->rows();
  s.m = int64_t{row_end} - op.row_begin;
  s.k = op.weight->cols();
  s.n = n_rows;
  s.weight_stationary_transposed = true;
  return s;
}

void NpuRunner::register_program(uint32_t id, fb::ProgramT program, const ProgramMemory& mem) {
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const fb::OpT* op = program.ops[i].get();
    if (!op) throw Error(Errc::invalid_argument, "program: op " + std::to_string(i) + " is empty");
    if (op->kind != fb::OpKind::MatMul && op->kind != fb::OpKind::Logits)
      throw Error(Errc::unsupported, "npu: " + op_where(*op, i) +
                                         " is not an NPU op (the NPU runs MatMul and Logits)");
    if (op->npu_mode > static_cast<uint8_t>(NpuGraphMode::pipe))
      throw Error(Errc::invalid_argument, "npu: " + op_where(*op, i) + " has unknown graph mode " +
                                              std::to_string(op->npu_mode));
    if (op->weight) {
      // Every core/model/dtype.h type: the emulator dequantises each on the fly (W4A16 for the
      // 4-bit K and legacy types), fp16 activations in and out (npu_gemm.h).
      const auto raw = static_cast<uint32_t>(op->weight->dtype());
      if (!dtype_known(raw))
        throw Error(Errc::unsupported,
                    "npu: " + op_where(*op, i) + " has unknown weight type " + std::to_string(raw));
    }
  }
  validate_program(program, mem);  // TensorRefs against the segments, shapes, row ranges
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const fb::OpT& op = *program.ops[i];
    if (op.row_begin == op.row_end && op.row_begin != 0)
      throw Error(Errc::invalid_argument, "npu: " + op_where(op, i) + " has an empty row range");
    if (op.seq_end != 0 && op.seq_begin >= op.seq_end)
      throw Error(Errc::invalid_argument, "npu: " + op_where(op, i) + " has an empty token range");
    if (op.in0->rows() < program.max_tokens)  // Logits too: any token may want logits
      throw Error(Errc::out_of_range,
                  "npu: " + op_where(op, i) + " input holds fewer rows than max_tokens");
  }
  auto p = std::make_unique<Program>();
  p->program = std::move(program);
  p->mem = mem;
  programs_[id] = std::move(p);
}

const NpuRunner::Program& NpuRunner::find(uint32_t id) const {
  auto it = programs_.find(id);
  if (it == programs_.end())
    throw Error(Errc::not_found, "npu: no program " + std::to_string(id) + " is registered");
  return *it->second;
}

size_t NpuRunner::n_ops(uint32_t id) const {
  return find(id).program.ops.size();
}

std::vector<OpShape> NpuRunner::graph_shapes(uint32_t id, uint32_t n_tokens,
                                             uint32_t n_logit_rows) const {
  const Program& p = find(id);
  std::vector<OpShape> out;
  for (const auto& op : p.program.ops) {
    const auto [t0, t1] = token_range(*op, n_tokens);
    const uint32_t rows = op->kind == fb::OpKind::Logits
                              ? std::min({n_logit_rows, t1 - t0, op->out->rows()})
                              : t1 - t0;
    if (rows == 0) continue;
    const OpShape s = op_shape(*op, rows);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  return out;
}

StepReport NpuRunner::run_step(uint32_t id, const StepArgs& step, FlagSync& flags,
                               bool online_prepare) {
  const Clock::time_point step_start = Clock::now();
  const Program& p = find(id);
  const fb::ProgramT& prog = p.program;
  const ProgramMemory& mem = p.mem;
  if (step.n_tokens == 0 || step.n_tokens > prog.max_tokens)
    throw Error(Errc::out_of_range, "npu step: n_tokens " + std::to_string(step.n_tokens) +
                                        " outside [1, " + std::to_string(prog.max_tokens) + "]");
  const uint64_t table_bytes = uint64_t{step.n_tokens} * sizeof(TokenRow);
  if (step.tokens_offset % alignof(TokenRow) != 0 || step.tokens_offset > mem.arena_bytes ||
      table_bytes > mem.arena_bytes - step.tokens_offset)
    throw Error(Errc::out_of_range,
                "npu step: token table at " + std::to_string(step.tokens_offset) +
                    " lies outside the arena of " + std::to_string(mem.arena_bytes) + " bytes");
  const auto* rows = reinterpret_cast<const TokenRow*>(mem.arena + step.tokens_offset);
  check_step_symbols(prog, step, "npu step");
  const ArenaOffsets at(prog, step_symbols(step));  // the step's slot offsets, evaluated once
  if (step.first_op > prog.ops.size())
    throw Error(Errc::out_of_range, "npu step: first_op " + std::to_string(step.first_op) +
                                        " past the program's " + std::to_string(prog.ops.size()) +
                                        " ops");

  // Per op: the token rows it computes (Logits: only rows with a logits_row) and its shape.
  struct Planned {
    std::vector<uint32_t> tokens;  // Logits only
    uint32_t t0 = 0, t1 = 0;
    OpShape shape;
    GraphCache::Resolved graphs;
  };
  std::vector<Planned> plan(prog.ops.size());
  for (size_t i = step.first_op; i < prog.ops.size(); ++i) {
    const fb::OpT& op = *prog.ops[i];
    Planned& pl = plan[i];
    std::tie(pl.t0, pl.t1) = token_range(op, step.n_tokens);
    uint32_t n_rows = pl.t1 - pl.t0;
    if (op.kind == fb::OpKind::Logits) {
      for (uint32_t t = pl.t0; t < pl.t1; ++t) {
        if (rows[t].logits_row < 0) continue;
        if (static_cast<uint32_t>(rows[t].logits_row) >= op.out->rows())
          throw Error(Errc::out_of_range,
                      "npu step: token " + std::to_string(t) + " names logits row " +
                          std::to_string(rows[t].logits_row) + " past the logits tensor");
        pl.tokens.push_back(t);
      }
      n_rows = static_cast<uint32_t>(pl.tokens.size());
    }
    if (n_rows == 0) continue;
    pl.shape = op_shape(op, n_rows);
    const auto mode =
        online_prepare ? NpuGraphMode::online_prepare : static_cast<NpuGraphMode>(op.npu_mode);
    pl.graphs = graphs_.resolve(pl.shape, mode);  // throws not_found before any op runs
  }

  StepReport report;
  report.seq = step.seq;
  report.next_op = static_cast<uint32_t>(prog.ops.size());
  for (size_t i = step.first_op; i < prog.ops.size(); ++i) {
    const fb::OpT& op = *prog.ops[i];
    Planned& pl = plan[i];
    const Clock::time_point wait_start = Clock::now();
    // Preemption point (a preemptible step only): before the op, or in its cross-device waits.
    bool go = !flags.preempt_requested();
    for (size_t w = 0; go && w < op.wait_flags.size(); ++w)
      go = flags.wait_or_preempt(op.wait_flags[w], step.seq, op.predicted_us);
    const double waited = us_since(wait_start);
    report.wait_us += waited;
    if (!go) {
      report.next_op = static_cast<uint32_t>(i);
      report.preempted = true;
      break;
    }

    OpTiming timing;
    timing.op_index = static_cast<uint32_t>(i);
    timing.wait_us = waited;
    const Clock::time_point op_start = Clock::now();
    const bool runs = pl.shape.n > 0;
    if (runs) {
      timing.shape = pl.shape;
      timing.compile_us = pl.graphs.compile_us;
      timing.graphs_run = static_cast<uint32_t>(pl.graphs.graphs.size());
      const ops::Matrix w = weight_matrix(mem, *op.weight);
      const uint32_t row_end = op.row_end ? op.row_end : op.weight->rows();
      const auto* x = reinterpret_cast<const float*>(mem.arena + at(*op.in0));
      auto* y = reinterpret_cast<float*>(mem.arena + at(*op.out));
      const int64_t k = w.cols, m_all = w.rows;
      const Clock::time_point t_start = Clock::now();
      if (op.kind == fb::OpKind::MatMul) {
        gemm_.matmul(w, x + size_t{pl.t0} * k, k, pl.t1 - pl.t0, y + size_t{pl.t0} * m_all, m_all,
                     op.row_begin, row_end);
      } else {
        // Logits: gather the rows that want logits, one dense GEMM, scatter to logits rows.
        const size_t n = pl.tokens.size();
        gather_x_.resize(n * k);
        gather_y_.resize(n * m_all);
        for (size_t j = 0; j < n; ++j)
          std::memcpy(&gather_x_[j * k], x + size_t{pl.tokens[j]} * k, k * sizeof(float));
        gemm_.matmul(w, gather_x_.data(), k, static_cast<int64_t>(n), gather_y_.data(), m_all,
                     op.row_begin, row_end);
        for (size_t j = 0; j < n; ++j)
          std::memcpy(y + size_t(rows[pl.tokens[j]].logits_row) * m_all + op.row_begin,
                      &gather_y_[j * m_all + op.row_begin],
                      (row_end - op.row_begin) * sizeof(float));
      }
      timing.measured_us = us_since(t_start);
      timing.modeled_us = timing.compile_us;
      for (const OpShape& g : pl.graphs.graphs)
        timing.modeled_us += npu_modeled_us(graphs_.soc(), g);
    }
    timing.start_ns = ns_of(op_start);
    timing.end_ns = ns_of(Clock::now());
    if (op.publish_flag >= 0) flags.publish(static_cast<uint32_t>(op.publish_flag), step.seq);
    report.measured_us += timing.measured_us;
    report.modeled_us += timing.modeled_us;
    report.compile_us += timing.compile_us;
    report.ops.push_back(timing);
    ++report.ops_run;
  }
  report.wall_us = us_since(step_start);
  return report;
}

}  // namespace duet::npu
