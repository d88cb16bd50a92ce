// Validates programs and runs them with the reference ops (core/program/program.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/model/ops.h"
#include "core/model/quant.h"
#include "core/program/program.h"

namespace duet {
namespace {

std::string op_name(const fb::OpT& op, size_t index) {
  return "op " + std::to_string(index) + " (" + fb::EnumNameOpKind(op.kind) + ", layer " +
         std::to_string(op.layer) + ")";
}

uint64_t segment_size(const ProgramMemory& mem, fb::SegmentKind s) {
  switch (s) {
    case fb::SegmentKind::Weights:
      return mem.weights_bytes;
    case fb::SegmentKind::Arena:
      return mem.arena_bytes;
    case fb::SegmentKind::Kv:
      return mem.kv_bytes;
  }
  return 0;
}

// `largest`: the program's arena offsets at the symbols' largest values (the arena ends there).
void check_ref(const fb::TensorRef* ref, const ProgramMemory& mem, const ArenaOffsets& largest,
               const std::string& where, const char* what, bool required) {
  if (!ref) {
    if (required) throw Error(Errc::invalid_argument, where + ": missing " + what);
    return;
  }
  const uint32_t raw = static_cast<uint32_t>(ref->dtype());
  if (!dtype_known(raw))
    throw Error(Errc::invalid_argument,
                where + ": " + what + " has unknown dtype " + std::to_string(raw));
  const DType dt = static_cast<DType>(raw);
  if (ref->cols() % dtype_block_elems(dt) != 0)
    throw Error(Errc::invalid_argument,
                where + ": " + what + " cols not a multiple of the block size");
  const uint64_t bytes = uint64_t{ref->rows()} * dtype_row_bytes(dt, ref->cols());
  const uint64_t size = segment_size(mem, ref->segment());
  const uint64_t offset = largest(*ref);
  if (offset > size || bytes > size - offset)
    throw Error(Errc::out_of_range, where + ": " + what + " [" + std::to_string(offset) + ", +" +
                                        std::to_string(bytes) + ") lies outside its segment of " +
                                        std::to_string(size) + " bytes");
}

// The program's slot table (validate_program's part for programs with slots): slots in order,
// each provably ending where the next may begin, the last within the arena at the symbols'
// largest values; every Arena ref within its slot at every N.
void check_slots(const fb::ProgramT& program, const ProgramMemory& mem) {
  const size_t n = program.slot_offsets.size() / kMonomials;
  if (program.slot_offsets.size() % kMonomials != 0 ||
      program.slot_sizes.size() != program.slot_offsets.size() || n > ArenaOffsets::kMaxSlots)
    throw Error(Errc::invalid_argument,
                "program: a slot table of " + std::to_string(program.slot_offsets.size()) +
                    " offset and " + std::to_string(program.slot_sizes.size()) +
                    " size coefficients (8 each per slot, at most " +
                    std::to_string(ArenaOffsets::kMaxSlots) + " slots)");
  if (program.max_seqs == 0 || program.max_pages == 0)
    throw Error(Errc::invalid_argument, "program: slots with max_seqs or max_pages 0");
  auto expr = [&](const std::vector<uint64_t>& table, size_t k) {
    return SymExpr::from_coefs(std::span(table).subspan(k * kMonomials, kMonomials));
  };
  const SymValues largest{program.max_tokens, program.max_seqs, program.max_pages};
  for (size_t k = 0; k < n; ++k) {
    const SymExpr offset = expr(program.slot_offsets, k),
                  end = offset + expr(program.slot_sizes, k);
    for (uint64_t c : offset.coefs())
      if (c % 4 != 0)
        throw Error(Errc::invalid_argument, "program: slot " + std::to_string(k) + " at " +
                                                offset.str() + " is not 4-byte aligned");
    if (k + 1 < n ? !provably_le(end, expr(program.slot_offsets, k + 1))
                  : end.eval(largest) > mem.arena_bytes)
      throw Error(Errc::out_of_range, "program: slot " + std::to_string(k) + " [" + offset.str() +
                                          ", " + end.str() + ") may overlap the next slot or " +
                                          "pass the arena of " + std::to_string(mem.arena_bytes) +
                                          " bytes");
  }
  for (size_t i = 0; i < program.ops.size(); ++i)
    for (const fb::TensorRef* r :
         {program.ops[i]->in0.get(), program.ops[i]->in1.get(), program.ops[i]->out.get()}) {
      if (!r || r->segment() != fb::SegmentKind::Arena) continue;
      if (r->slot() >= n)
        throw Error(Errc::out_of_range, op_name(*program.ops[i], i) + ": slot " +
                                            std::to_string(r->slot()) + " of " + std::to_string(n));
      const SymExpr size = expr(program.slot_sizes, r->slot());
      const uint64_t row_bytes = uint64_t{r->cols()} * 4;
      const bool fits = size.is_constant()
                            ? r->offset() + uint64_t{r->rows()} * row_bytes <= size.coef(0)
                            : r->offset() == 0 && row_bytes <= size.coef(1);  // 1: N's monomial
      if (!fits)
        throw Error(Errc::out_of_range, op_name(*program.ops[i], i) + ": a tensor of " +
                                            std::to_string(r->rows()) + " x " +
                                            std::to_string(r->cols()) +
                                            " does not fit its slot of " + size.str() + " bytes");
    }
}

template <typename T>
T* at(const ProgramMemory& mem, const ArenaOffsets& arena, const fb::TensorRef& ref) {
  switch (ref.segment()) {
    case fb::SegmentKind::Arena:
      return reinterpret_cast<T*>(mem.arena + arena(ref));
    case fb::SegmentKind::Kv:
      return reinterpret_cast<T*>(mem.kv + ref.offset());
    case fb::SegmentKind::Weights:
      return reinterpret_cast<T*>(const_cast<uint8_t*>(mem.weights) + ref.offset());
  }
  return nullptr;
}

ops::Matrix matrix(const ProgramMemory& mem, const fb::TensorRef& ref) {
  return ops::Matrix{static_cast<DType>(ref.dtype()), ref.rows(), ref.cols(),
                     at<const uint8_t>(mem, ArenaOffsets(), ref)};
}

}  // namespace

void check_step_symbols(const fb::ProgramT& program, const StepArgs& step, const std::string& who) {
  if (program.slot_offsets.empty()) return;
  if (step.n_seqs > program.max_seqs || step.page_table_cols > program.max_pages)
    throw Error(Errc::out_of_range, who + ": a step of " + std::to_string(step.n_seqs) +
                                        " sequences and " + std::to_string(step.page_table_cols) +
                                        " page-table columns passes the " + "program's " +
                                        std::to_string(program.max_seqs) + " and " +
                                        std::to_string(program.max_pages));
}

void ArenaOffsets::evaluate(const fb::ProgramT& program, const SymValues& v) {
  n_slots_ = std::min(program.slot_offsets.size() / kMonomials, kMaxSlots);
  const std::array<uint64_t, kMonomials> m = monomial_values(v);
  const uint64_t* c = program.slot_offsets.data();
  for (size_t k = 0; k < n_slots_; ++k, c += kMonomials) {
    uint64_t offset = 0;
    for (int j = 0; j < kMonomials; ++j) offset += c[j] * m[j];
    slot_[k] = offset;
  }
}

namespace {

struct TokenRow {
  int32_t token, pos, seq, logits_row;
};

}  // namespace

bool PreemptibleFlagSync::preempt_requested() {
  return step_.preempt_flag >= 0 &&
         load_(static_cast<uint32_t>(step_.preempt_flag)) >= step_.preempt_token;
}

bool PreemptibleFlagSync::wait_or_preempt(uint32_t flag, uint64_t seq, float predicted_us) {
  if (step_.preempt_flag < 0) {
    inner_.wait(flag, seq, predicted_us);
    return true;
  }
  // Slices short against an op (~100s of us) so that the preemption latency stays the longest
  // op's time plus one slice.
  constexpr auto kSlice = std::chrono::microseconds(200);
  for (;;) {
    if (load_(flag) >= seq) return true;
    if (preempt_requested()) return false;
    const auto now = Clock::now();
    if (now >= deadline_)
      throw Error(Errc::timeout, "flag " + std::to_string(flag) + " did not reach step " +
                                     std::to_string(seq) + " before the deadline");
    if (wait_until_(flag, seq, predicted_us, std::min(deadline_, now + kSlice))) return true;
  }
}

void validate_program(const fb::ProgramT& program, const ProgramMemory& mem) {
  if (program.max_tokens == 0) throw Error(Errc::invalid_argument, "program: max_tokens is 0");
  if (!program.kv) throw Error(Errc::invalid_argument, "program: no KV layout");
  const fb::KvLayoutT& kv = *program.kv;
  if (kv.page_tokens == 0 || kv.kv_dim == 0)
    throw Error(Errc::invalid_argument, "program: KV layout with zero page_tokens or kv_dim");
  if (kv.page_bytes != uint64_t{kv.n_layers} * kv_layer_page_bytes(kv))
    throw Error(Errc::invalid_argument, "program: KV page_bytes disagrees with its geometry");
  if (kv.pages_offset > mem.kv_bytes || kv.page_bytes * kv.n_pages > mem.kv_bytes - kv.pages_offset)
    throw Error(Errc::out_of_range, "program: " + std::to_string(kv.n_pages) +
                                        " KV pages do not fit the KV segment of " +
                                        std::to_string(mem.kv_bytes) + " bytes");
  if (!program.slot_offsets.empty() || !program.slot_sizes.empty()) check_slots(program, mem);
  const ArenaOffsets largest(program, {program.max_tokens, program.max_seqs, program.max_pages});
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const fb::OpT& op = *program.ops[i];
    const std::string where = op_name(op, i);
    const bool has_weight = op.kind == fb::OpKind::Embed || op.kind == fb::OpKind::RmsNorm ||
                            op.kind == fb::OpKind::MatMul || op.kind == fb::OpKind::Logits ||
                            op.kind == fb::OpKind::AddBias;
    if (op.kind > fb::OpKind::MAX)
      throw Error(Errc::invalid_argument,
                  where + ": unknown op kind " + std::to_string(static_cast<int>(op.kind)));
    const bool has_in0 = op.kind != fb::OpKind::Embed;
    const bool has_in1 = op.kind == fb::OpKind::KvWrite || op.kind == fb::OpKind::SwiGlu ||
                         op.kind == fb::OpKind::Add;
    const bool has_out = op.kind != fb::OpKind::KvWrite;
    check_ref(op.in0.get(), mem, largest, where, "in0", has_in0);
    check_ref(op.in1.get(), mem, largest, where, "in1", has_in1);
    check_ref(op.weight.get(), mem, largest, where, "weight", has_weight);
    check_ref(op.out.get(), mem, largest, where, "out", has_out);
    for (const fb::TensorRef* r : {op.in0.get(), op.in1.get(), op.out.get()}) {
      if (r && r->segment() != fb::SegmentKind::Arena)
        throw Error(Errc::invalid_argument, where + ": activations must live in the arena");
      if (r && static_cast<DType>(r->dtype()) != DType::F32)
        throw Error(Errc::invalid_argument, where + ": activations must be F32");
      if (r && op.kind != fb::OpKind::Logits && r->rows() < program.max_tokens)
        throw Error(Errc::out_of_range, where + ": a tensor holds fewer rows than max_tokens");
    }
    if (has_weight && op.weight->segment() != fb::SegmentKind::Weights)
      throw Error(Errc::invalid_argument, where + ": weight must live in the weights segment");
    if (op.kind == fb::OpKind::MatMul || op.kind == fb::OpKind::Logits) {
      const fb::TensorRef& w = *op.weight;
      if (op.in0->cols() != w.cols() || op.out->cols() != w.rows())
        throw Error(Errc::invalid_argument, where + ": matmul shapes disagree");
      const uint32_t row_end = op.row_end ? op.row_end : w.rows();
      if (op.row_begin > row_end || row_end > w.rows())
        throw Error(Errc::out_of_range, where + ": row range outside the weight");
    }
    if (op.kind == fb::OpKind::Rope || op.kind == fb::OpKind::Attention ||
        op.kind == fb::OpKind::KvWrite) {
      if (op.head_dim == 0 || op.n_heads == 0 || op.head_dim % 2 != 0)
        throw Error(Errc::invalid_argument, where + ": bad head geometry");
      if (op.kind == fb::OpKind::Rope && op.in0->cols() != uint32_t{op.n_heads} * op.head_dim)
        throw Error(Errc::invalid_argument, where + ": rope width != n_heads * head_dim");
      if (op.kind == fb::OpKind::Attention &&
          (op.n_kv_heads == 0 || op.n_heads % op.n_kv_heads != 0 ||
           uint32_t{op.n_kv_heads} * op.head_dim != kv.kv_dim))
        throw Error(Errc::invalid_argument,
                    where + ": attention heads disagree with the KV layout");
      if (op.kind == fb::OpKind::KvWrite && op.in0->cols() != kv.kv_dim)
        throw Error(Errc::invalid_argument, where + ": KV write width != kv_dim");
      if (op.layer < 0 || static_cast<uint32_t>(op.layer) >= kv.n_layers)
        throw Error(Errc::out_of_range, where + ": layer outside the KV layout");
    }
    if (op.kind == fb::OpKind::SwiGlu && op.ffn_act != static_cast<uint8_t>(ops::FfnAct::silu) &&
        op.ffn_act != static_cast<uint8_t>(ops::FfnAct::gelu_tanh))
      throw Error(Errc::invalid_argument,
                  where + ": unknown ffn activation " + std::to_string(op.ffn_act));
    if (!std::isfinite(op.scale))
      throw Error(Errc::invalid_argument, where + ": scale is not finite");
    if (op.scale != 1.0f && op.kind != fb::OpKind::Embed)
      throw Error(Errc::invalid_argument, where + ": scale on an op that is not Embed");
    if (op.kind == fb::OpKind::RmsNorm && op.weight->cols() != op.in0->cols())
      throw Error(Errc::invalid_argument, where + ": norm weight width != input width");
    if (op.kind == fb::OpKind::AddBias) {
      const fb::TensorRef& b = *op.weight;
      if (static_cast<DType>(b.dtype()) != DType::F32 || b.rows() != 1 ||
          b.cols() != op.in0->cols())
        throw Error(Errc::invalid_argument,
                    where + ": bias must be one F32 row as wide as its input");
      if (op.out->offset() != op.in0->offset() || op.out->slot() != op.in0->slot() ||
          op.out->cols() != op.in0->cols())
        throw Error(Errc::invalid_argument, where + ": a bias is added in place (out = in0)");
    }
    if (op.kind == fb::OpKind::Rope) {
      if (op.rope_mode != static_cast<uint8_t>(ops::RopeMode::normal) &&
          op.rope_mode != static_cast<uint8_t>(ops::RopeMode::neox))
        throw Error(Errc::invalid_argument,
                    where + ": unknown rope mode " + std::to_string(op.rope_mode));
      if (!(op.freq_base > 0) || !std::isfinite(op.freq_base) || !(op.freq_scale > 0) ||
          !std::isfinite(op.freq_scale))
        throw Error(Errc::invalid_argument, where +
                                                ": rope freq_base and freq_scale must be "
                                                "positive and finite");
      if (op.freq_factors) {
        check_ref(op.freq_factors.get(), mem, largest, where, "freq_factors", true);
        const fb::TensorRef& f = *op.freq_factors;
        if (f.segment() != fb::SegmentKind::Weights ||
            static_cast<DType>(f.dtype()) != DType::F32 || f.rows() != 1 ||
            f.cols() != op.head_dim / 2u)
          throw Error(Errc::invalid_argument,
                      where + ": rope freq_factors must be one F32 weights row of head_dim/2 = " +
                          std::to_string(op.head_dim / 2) + " values");
      }
    } else if (op.freq_factors) {
      throw Error(Errc::invalid_argument, where + ": freq_factors on an op that is not Rope");
    }
  }
}

uint32_t kv_row_bytes(DType type, uint32_t kv_dim) {
  if (type == DType::F32) return kv_dim * 4;
  if (type == DType::F16) return kv_dim * 2;
  if (type == DType::Q8_0) {
    if (kv_dim % kQK != 0)
      throw Error(Errc::invalid_argument, "program: Q8_0 KV rows of " + std::to_string(kv_dim) +
                                              " values (a multiple of 32)");
    return static_cast<uint32_t>(dtype_row_bytes(DType::Q8_0, kv_dim));
  }
  throw Error(Errc::invalid_argument, "program: KV values of dtype " +
                                          std::to_string(static_cast<uint32_t>(type)) +
                                          " (F32, F16 or Q8_0)");
}

uint32_t kv_row_bytes(const fb::KvLayoutT& kv) {
  return kv_row_bytes(static_cast<DType>(kv.dtype), kv.kv_dim);
}

uint64_t kv_layer_page_bytes(const fb::KvLayoutT& kv) {
  return uint64_t{2} * kv.page_tokens * kv_row_bytes(kv);
}

uint64_t kv_layer_stride(const fb::KvLayoutT& kv) {
  return uint64_t{kv.n_pages} * kv_layer_page_bytes(kv);
}

uint64_t kv_layer_offset(const fb::KvLayoutT& kv, uint32_t layer) {
  return kv.pages_offset + uint64_t{layer} * kv_layer_stride(kv);
}

uint64_t kv_row_offset(const fb::KvLayoutT& kv, uint32_t layer, uint32_t which, uint32_t page,
                       uint32_t row) {
  return kv_layer_offset(kv, layer) + uint64_t{page} * kv_layer_page_bytes(kv) +
         (uint64_t{which} * kv.page_tokens + row) * kv_row_bytes(kv);
}

StepProgress interpret_program(const fb::ProgramT& program, const ProgramMemory& mem,
                               const StepArgs& step, FlagSync& flags) {
  if (step.first_op > program.ops.size())
    throw Error(Errc::out_of_range, "step: first_op " + std::to_string(step.first_op) +
                                        " past the program's " +
                                        std::to_string(program.ops.size()) + " ops");
  if (step.n_tokens == 0 || step.n_tokens > program.max_tokens)
    throw Error(Errc::out_of_range, "step: n_tokens " + std::to_string(step.n_tokens) +
                                        " outside [1, " + std::to_string(program.max_tokens) + "]");
  const fb::KvLayoutT& kv = *program.kv;
  check_step_symbols(program, step, "step");
  const ArenaOffsets arena(program, step_symbols(step));  // the step's slots, once
  const auto* rows = reinterpret_cast<const TokenRow*>(mem.arena + step.tokens_offset);
  const auto* page_tables = reinterpret_cast<const int32_t*>(mem.arena + step.page_tables_offset);
  const int n = static_cast<int>(step.n_tokens);

  std::vector<int32_t> token_ids(n), positions(n);
  for (int t = 0; t < n; ++t) {
    token_ids[t] = rows[t].token;
    positions[t] = rows[t].pos;
    if (rows[t].seq < 0 || static_cast<uint32_t>(rows[t].seq) >= step.n_seqs)
      throw Error(Errc::out_of_range, "step: token " + std::to_string(t) + " names sequence " +
                                          std::to_string(rows[t].seq));
    if (rows[t].pos < 0 ||
        static_cast<uint32_t>(rows[t].pos) >= step.page_table_cols * kv.page_tokens)
      throw Error(Errc::out_of_range,
                  "step: position " + std::to_string(rows[t].pos) + " past the context");
  }
  // Address of the K (which = 0) or V (which = 1) row of a position of a sequence.
  auto kv_row = [&](int layer, int which, int seq, int pos) {
    const int32_t page =
        page_tables[static_cast<size_t>(seq) * step.page_table_cols + pos / kv.page_tokens];
    if (page < 0 || static_cast<uint32_t>(page) >= kv.n_pages)
      throw Error(Errc::out_of_range, "step: page table names page " + std::to_string(page));
    return mem.kv + kv_row_offset(kv, static_cast<uint32_t>(layer), static_cast<uint32_t>(which),
                                  static_cast<uint32_t>(page),
                                  static_cast<uint32_t>(pos) % kv.page_tokens);
  };
  // KV rows hold F32, F16 or Q8_0 values (KvLayout.dtype; kv_row_bytes validates it);
  // activations are F32.
  const auto kv_type = static_cast<DType>(kv.dtype);
  kv_row_bytes(kv);
  auto store_row = [&](uint8_t* dst, const float* src) {
    quantize_row(kv_type, src, dst, kv.kv_dim);
  };

  std::vector<float> k_scratch, v_scratch;
  StepProgress progress{step.first_op, 0, false};
  for (uint32_t i = step.first_op; i < program.ops.size(); ++i) {
    const fb::OpT& op = *program.ops[i];
    // Preemption point: between ops, and inside cross-device waits (the other device may have
    // stopped before publishing what this op waits for). Nothing of op i has run yet.
    bool go = !flags.preempt_requested();
    for (size_t w = 0; go && w < op.wait_flags.size(); ++w)
      go = flags.wait_or_preempt(op.wait_flags[w], step.seq, op.predicted_us);
    if (!go) {
      progress.next_op = i;
      progress.preempted = true;
      return progress;
    }
    switch (op.kind) {
      case fb::OpKind::Embed:
        ops::embed(matrix(mem, *op.weight), token_ids.data(), n, at<float>(mem, arena, *op.out));
        if (op.scale != 1.0f)
          ops::scale(at<float>(mem, arena, *op.out), op.scale, int64_t{n} * op.out->cols());
        break;
      case fb::OpKind::RmsNorm:
        ops::rmsnorm(at<float>(mem, arena, *op.in0), at<float>(mem, arena, *op.weight), n,
                     static_cast<int>(op.in0->cols()), op.eps, at<float>(mem, arena, *op.out));
        break;
      case fb::OpKind::MatMul: {
        const ops::Matrix w = matrix(mem, *op.weight);
        const int t0 = static_cast<int>(std::min<uint32_t>(op.seq_begin, step.n_tokens));
        const int t1 = static_cast<int>(op.seq_end ? std::min<uint32_t>(op.seq_end, step.n_tokens)
                                                   : step.n_tokens);
        if (t1 > t0)
          ops::matmul(w, at<float>(mem, arena, *op.in0) + size_t(t0) * w.cols, t1 - t0,
                      at<float>(mem, arena, *op.out) + size_t(t0) * w.rows, op.row_begin,
                      op.row_end ? op.row_end : w.rows);
        break;
      }
      case fb::OpKind::Logits: {
        const ops::Matrix w = matrix(mem, *op.weight);
        const uint32_t t0 = std::min<uint32_t>(op.seq_begin, step.n_tokens);
        const uint32_t t1 =
            op.seq_end ? std::min<uint32_t>(op.seq_end, step.n_tokens) : step.n_tokens;
        for (uint32_t t = t0; t < t1; ++t) {
          if (rows[t].logits_row < 0) continue;
          if (static_cast<uint32_t>(rows[t].logits_row) >= op.out->rows())
            throw Error(Errc::out_of_range, "step: logits_row past the logits tensor");
          ops::matmul(w, at<float>(mem, arena, *op.in0) + size_t(t) * w.cols, 1,
                      at<float>(mem, arena, *op.out) + size_t(rows[t].logits_row) * w.rows,
                      op.row_begin, op.row_end ? op.row_end : w.rows);
        }
        break;
      }
      case fb::OpKind::Rope: {
        ops::RopeParams rope{op.freq_base, op.freq_scale, nullptr,
                             static_cast<ops::RopeMode>(op.rope_mode)};
        if (op.freq_factors) rope.freq_factors = at<float>(mem, arena, *op.freq_factors);
        ops::rope(at<float>(mem, arena, *op.in0), n, op.n_heads, op.head_dim, positions.data(),
                  rope);
        break;
      }
      case fb::OpKind::AddBias: {
        const uint32_t t0 = std::min<uint32_t>(op.seq_begin, step.n_tokens);
        const uint32_t t1 =
            op.seq_end ? std::min<uint32_t>(op.seq_end, step.n_tokens) : step.n_tokens;
        if (t1 > t0)
          ops::add_bias(at<float>(mem, arena, *op.in0) + size_t(t0) * op.in0->cols(),
                        at<float>(mem, arena, *op.weight), static_cast<int>(t1 - t0),
                        op.in0->cols());
        break;
      }
      case fb::OpKind::KvWrite: {
        const float* k = at<float>(mem, arena, *op.in0);
        const float* v = at<float>(mem, arena, *op.in1);
        for (int t = 0; t < n; ++t) {
          store_row(kv_row(op.layer, 0, rows[t].seq, rows[t].pos), k + size_t(t) * kv.kv_dim);
          store_row(kv_row(op.layer, 1, rows[t].seq, rows[t].pos), v + size_t(t) * kv.kv_dim);
        }
        break;
      }
      case fb::OpKind::Attention: {
        // The reference gathers a sequence's pages into one contiguous fp32 cache once per run of
        // the step's tokens of that sequence (on the pool's threads), then runs ops::attention
        // over the run: the gather is linear in the context, not once per token.
        const uint32_t width = uint32_t{op.n_heads} * op.head_dim;
        for (int t0 = 0; t0 < n;) {
          int t1 = t0 + 1;
          int32_t max_pos = rows[t0].pos;
          for (; t1 < n && rows[t1].seq == rows[t0].seq; ++t1)
            max_pos = std::max(max_pos, rows[t1].pos);
          const int64_t len = int64_t{max_pos} + 1;
          k_scratch.resize(size_t(len) * kv.kv_dim);
          v_scratch.resize(size_t(len) * kv.kv_dim);
          const int seq = rows[t0].seq;
          for (int which = 0; which < 2; ++which)
            ops::gather_rows(
                kv_type,
                [&](int64_t p) { return kv_row(op.layer, which, seq, static_cast<int>(p)); }, len,
                kv.kv_dim, (which == 0 ? k_scratch : v_scratch).data());
          ops::attention(at<float>(mem, arena, *op.in0) + size_t(t0) * width, k_scratch.data(),
                         v_scratch.data(), t1 - t0, positions.data() + t0, op.n_heads,
                         op.n_kv_heads, op.head_dim,
                         at<float>(mem, arena, *op.out) + size_t(t0) * width);
          t0 = t1;
        }
        break;
      }
      case fb::OpKind::SwiGlu:
        ops::gated_ffn(static_cast<ops::FfnAct>(op.ffn_act), at<float>(mem, arena, *op.in0),
                       at<float>(mem, arena, *op.in1), int64_t{n} * op.in0->cols(),
                       at<float>(mem, arena, *op.out));
        break;
      case fb::OpKind::Add: {
        float* out = at<float>(mem, arena, *op.out);
        const float* a = at<float>(mem, arena, *op.in0);
        const int64_t count = int64_t{n} * op.out->cols();
        if (out != a) std::memcpy(out, a, size_t(count) * 4);
        ops::add(out, at<float>(mem, arena, *op.in1), count);
        break;
      }
    }
    if (op.publish_flag >= 0) flags.publish(static_cast<uint32_t>(op.publish_flag), step.seq);
    ++progress.ops_run;
  }
  progress.next_op = static_cast<uint32_t>(program.ops.size());
  return progress;
}

}  // namespace duet
