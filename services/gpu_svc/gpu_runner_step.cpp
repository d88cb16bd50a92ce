// GpuRunner's op dispatch: a step's token rows, flags and KV pieces, each op's kernel launch in
// order, the preemption check and the step's timing report (copies mode's transfers:
// gpu_runner_copies.cpp).
#include <algorithm>
#include <array>
#include <span>
#include <string>
#include <thread>

#include "core/base/error.h"
#include "core/model/ops.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/op_shape.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/gpu_runner_program.h"
#include "services/gpu_svc/kv_pieces.h"

namespace duet::gpu {
namespace {

using Clock = std::chrono::steady_clock;

// Ops of a preemptible step enqueued ahead of its preemption check (see run_step). Measured on
// PoCL (tiny-fortune, 64-token gpu-only prefill, 2026-11-22): a preemptible step took 1.5x a plain
// one with 1 op in flight, 1.14x with 2, 1.03x with 3, 0.96-0.97x with 4.
constexpr size_t kPreemptibleOpsInFlight = 4;

// The completion callback's context: owned by the callback, which deletes it.
struct PublishContext {
  FlagSync* flags;
  uint32_t flag;
  uint64_t seq;
  std::atomic<int>* pending;
};

void CL_CALLBACK publish_on_complete(cl_event, cl_int status, void* user) {
  auto* ctx = static_cast<PublishContext*>(user);
  // A failed command never publishes: the consumer then times out rather than reading garbage.
  if (status == CL_COMPLETE) ctx->flags->publish(ctx->flag, ctx->seq);
  ctx->pending->fetch_sub(1, std::memory_order_acq_rel);
  delete ctx;
}

// The device timestamps (ns) of an op's first kernel's start and last kernel's end; {0, 0} when
// the runtime gives none.
std::pair<cl_ulong, cl_ulong> event_span(cl_event first, cl_event last) {
  cl_ulong start = 0, end = 0;
  if (clGetEventProfilingInfo(first, CL_PROFILING_COMMAND_START, sizeof start, &start, nullptr) !=
          CL_SUCCESS ||
      clGetEventProfilingInfo(last, CL_PROFILING_COMMAND_END, sizeof end, &end, nullptr) !=
          CL_SUCCESS ||
      end < start)
    return {0, 0};
  return {start, end};
}

int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

MatmulArgs GpuRunner::matmul_args(const Program& p, const ArenaOffsets& at, const fb::OpT& op,
                                  uint32_t n, uint64_t tok_off) {
  const uint32_t t0 = std::min(op.seq_begin, n);
  const uint32_t t1 = op.seq_end ? std::min(op.seq_end, n) : n;
  MatmulArgs a;
  a.wtype = static_cast<DType>(op.weight->dtype());
  a.w = p.weights;
  a.w_off = op.weight->offset();
  a.k = op.weight->cols();
  a.x_off = at(*op.in0);
  a.x_stride = op.in0->cols();
  a.y_off = at(*op.out);
  a.y_stride = op.out->cols();
  a.row_begin = op.row_begin;
  a.row_end = op.row_end ? op.row_end : op.weight->rows();
  a.tokens = TokenRange{t0, std::max(t0, t1)};
  a.tok_off = tok_off;
  a.rows_from_table = op.kind == fb::OpKind::Logits;
  a.packed_rows = packed_.rows(p.weights, op.weight->offset());
  if (auto t = p.tiled.find(op.weight->offset()); t != p.tiled.end()) a.tiled = t->second->mem();
  if (op.role < kMatmulRoles) a.role = static_cast<MatmulRole>(op.role);
  return a;
}

void GpuRunner::wait_callbacks(Clock::time_point deadline) {
  while (pending_callbacks_.load(std::memory_order_acquire) > 0) {
    if (Clock::now() >= deadline)
      throw Error(Errc::timeout, "gpu_svc: completion callbacks did not run by the deadline");
    std::this_thread::yield();
  }
}

StepReport GpuRunner::run_step(uint32_t id, const StepArgs& step,
                               std::chrono::milliseconds deadline_ms, FlagSync* flags) {
  const auto started = Clock::now();
  const auto deadline = started + deadline_ms;
  auto it = programs_.find(id);
  if (it == programs_.end())
    throw Error(Errc::not_found, "gpu_svc: no program " + std::to_string(id) + " registered");
  Program& p = *it->second;
  const fb::ProgramT& prog = p.prog;
  const fb::KvLayoutT& kvl = *prog.kv;
  const uint32_t n = step.n_tokens;
  auto bad = [](Errc c, const std::string& what) { throw Error(c, "gpu_svc step: " + what); };

  // The step's tables are host memory (shm): check them before any kernel reads them.
  if (n == 0 || n > prog.max_tokens)
    bad(Errc::out_of_range,
        "n_tokens " + std::to_string(n) + " outside [1, " + std::to_string(prog.max_tokens) + "]");
  if (step.tokens_offset % 4 != 0 ||
      step.tokens_offset + uint64_t{n} * sizeof(TokenRow) > p.mem.arena_bytes)
    bad(Errc::out_of_range, "token table at " + std::to_string(step.tokens_offset) +
                                " is misaligned or outside the arena");
  const auto* rows = reinterpret_cast<const TokenRow*>(p.mem.arena + step.tokens_offset);
  const int32_t* page_tables = nullptr;
  if (p.uses_kv) {
    const uint64_t pt_bytes = uint64_t{step.n_seqs} * step.page_table_cols * 4;
    if (step.n_seqs == 0 || step.page_table_cols == 0 || step.page_tables_offset % 4 != 0 ||
        step.page_tables_offset + pt_bytes > p.mem.arena_bytes)
      bad(Errc::out_of_range, "page tables are empty, misaligned or outside the arena");
    page_tables = reinterpret_cast<const int32_t*>(p.mem.arena + step.page_tables_offset);
  }
  std::vector<int32_t> max_pos(step.n_seqs, -1);
  uint32_t n_logit_rows = 0;
  for (uint32_t t = 0; t < n; ++t) {
    const TokenRow& r = rows[t];
    if (r.seq < 0 || static_cast<uint32_t>(r.seq) >= step.n_seqs)
      bad(Errc::out_of_range,
          "token " + std::to_string(t) + " names sequence " + std::to_string(r.seq));
    if (r.pos < 0 || (p.uses_kv && static_cast<uint64_t>(r.pos) >=
                                       uint64_t{step.page_table_cols} * kvl.page_tokens))
      bad(Errc::out_of_range, "token " + std::to_string(t) + " has position " +
                                  std::to_string(r.pos) + " past the context");
    max_pos[r.seq] = std::max(max_pos[r.seq], r.pos);
    if (r.logits_row >= 0) ++n_logit_rows;
  }
  if (page_tables)
    for (uint32_t s = 0; s < step.n_seqs; ++s)
      for (int32_t pg = 0;
           max_pos[s] >= 0 && pg <= max_pos[s] / static_cast<int32_t>(kvl.page_tokens); ++pg) {
        const int32_t page = page_tables[uint64_t{s} * step.page_table_cols + pg];
        if (page < 0 || static_cast<uint32_t>(page) >= kvl.n_pages)
          bad(Errc::out_of_range, "sequence " + std::to_string(s) + " maps page slot " +
                                      std::to_string(pg) + " to page " + std::to_string(page) +
                                      " of " + std::to_string(kvl.n_pages));
      }
  for (size_t i = 0; i < prog.ops.size(); ++i) {
    const fb::OpT& op = *prog.ops[i];
    if (op.kind == fb::OpKind::Embed)
      for (uint32_t t = 0; t < n; ++t)
        if (rows[t].token < 0 || static_cast<uint32_t>(rows[t].token) >= op.weight->rows())
          bad(Errc::out_of_range,
              "token " + std::to_string(t) + " has id " + std::to_string(rows[t].token) +
                  " outside the vocabulary [0, " + std::to_string(op.weight->rows()) + ")");
    if (op.kind == fb::OpKind::Logits)
      for (uint32_t t = 0; t < n; ++t)
        if (rows[t].logits_row >= 0 && static_cast<uint32_t>(rows[t].logits_row) >= op.out->rows())
          bad(Errc::out_of_range, "token " + std::to_string(t) + " writes logits row " +
                                      std::to_string(rows[t].logits_row) +
                                      " past the logits tensor");
  }

  check_step_symbols(prog, step, "gpu_svc step");
  const ArenaOffsets at(prog, step_symbols(step));  // the step's slot offsets, evaluated once
  if (p.uses_flags && !flags)
    bad(Errc::invalid_argument, "the program uses completion flags but none were given");
  if (step.first_op > prog.ops.size())
    bad(Errc::out_of_range, "first_op " + std::to_string(step.first_op) + " past the program's " +
                                std::to_string(prog.ops.size()) + " ops");
  const bool preemptible = step.preempt_flag >= 0;
  if (preemptible && !flags) bad(Errc::invalid_argument, "a preemptible step needs the flags");

  // A proactive step (Agent.xpu: the preemptible ones, which only the proactive engine posts)
  // runs on the low-priority queue where the device has one (cl_device.h). Otherwise a small
  // step may run on the narrow queue (queue_picker.h); whole steps are timed for it.
  const bool low = preemptible && dev_.has_low_priority();
  const uint32_t context =
      static_cast<uint32_t>(*std::max_element(max_pos.begin(), max_pos.end()) + 1);
  // Until the narrow queue's program is built (cl_device.h narrow_ready) the picker's rule takes
  // the wide one rather than wait; DUET_GPU_NARROW=on waits for it.
  const bool narrow_usable =
      dev_.has_narrow() && (dev_.narrow_ready() || picker_.options().mode == QueuePicker::Mode::on);
  const StepQueue on = !low && narrow_usable ? picker_.pick(id, n, context) : StepQueue::wide;
  dev_.use_low_priority(low);
  dev_.use_narrow(on == StepQueue::narrow);
  dev_.use_op_timing(op_timing_);
  if (low) ++low_priority_steps_;
  const auto enqueued = Clock::now();
  cl_command_queue q = dev_.queue();
  if (copies()) {
    // What the host wrote for this step. A program that never waits on the other device reads
    // nothing of the arena but its own outputs and the tables, so its activations stay on the
    // device (read-backs below); one that waits gets the whole arena, as the other device left
    // it (its uploads at a wait send whole tensors, whose other parts must be current there).
    auto upload = [&](uint64_t offset, uint64_t bytes) {
      check_cl(clEnqueueWriteBuffer(q, p.arena, CL_FALSE, offset, bytes, p.mem.arena + offset, 0,
                                    nullptr, nullptr),
               "clEnqueueWriteBuffer(arena)");
    };
    if (p.waits) {
      upload(0, p.mem.arena_bytes);
    } else {
      upload(step.tokens_offset, uint64_t{n} * sizeof(TokenRow));
      if (page_tables)
        upload(step.page_tables_offset, uint64_t{step.n_seqs} * step.page_table_cols * 4);
    }
    // KV rows are written only by this device (KvWrite and Attention are GPU ops:
    // core/program/program_builder.cpp) and read back as written, and every program of a KV
    // segment shares one device copy (buffers_), so a page goes up the first time a step names
    // it (kv_current_: a restarted gpu_svc starts from what host memory holds) and is current
    // from then on, whichever device the step hands off to.
    if (page_tables) upload_new_kv_pages(p, step, page_tables);
  }

  StepReport report;
  report.seq = step.seq;
  std::vector<std::pair<cl_event, cl_event>> op_events;
  op_events.reserve(prog.ops.size());
  std::vector<double> op_wait_us;  // per enqueued op: its host wait on flags
  op_wait_us.reserve(prog.ops.size());
  struct EventGuard {
    std::vector<std::pair<cl_event, cl_event>>& v;
    ~EventGuard() {
      for (auto& [a, b] : v) {
        if (a) clReleaseEvent(a);
        if (b && b != a) clReleaseEvent(b);
      }
    }
  } guard{op_events};

  const uint64_t tok = step.tokens_offset;
  const TokenRange all{0, n};
  kernels_.reuse_quantized_inputs();  // only this step's own ops write the arena, until a wait
  const uint64_t launches_before = kernels_.launches();
  Clock::time_point done_at = enqueued;
  bool kv_rows_written = false;  // copies mode: KV rows to bring back at the step's end
  report.next_op = static_cast<uint32_t>(prog.ops.size());
  // Step chains: ops recorded into a chain get their events when it is enqueued (placeholders
  // until then: `chained`), the first the chain's span for the trace, the others its end.
  // An op that waits for or publishes a flag is launched apart (the chain so far first).
  const bool chain = chains_ && fuse_ && n == 1 && !preemptible && !copies() && !p.waits &&
                     kernels_.chain_available();
  std::vector<size_t> chained;  // indices into op_events waiting for their chain's event
  const auto fill_chained = [&] {
    cl_event e = kernels_.take_chain_event();
    if (!e) return;
    for (size_t c = 0; c < chained.size(); ++c) {
      clRetainEvent(e);
      op_events[chained[c]] = {c == 0 ? e : nullptr, e};
    }
    chained.clear();
    clReleaseEvent(e);
  };
  if (chain) kernels_.begin_chain();
  try {
    for (size_t i = step.first_op; i < prog.ops.size(); ++i) {
      const fb::OpT& op = *prog.ops[i];
      const double waited_before = report.wait_us;
      const uint64_t stages_before = kernels_.chained_stages();
      bool apart = chain && !op.wait_flags.empty();
      const size_t group_ops =
          fuse_ && !p.fusion.empty() ? std::max<size_t>(p.fusion[i].ops, 1) : 1;
      for (size_t c = i; chain && c < std::min(prog.ops.size(), i + group_ops); ++c)
        apart = apart || prog.ops[c]->publish_flag >= 0;
      if (apart) kernels_.end_chain();
      if (!op.wait_flags.empty()) kernels_.forget_quantized_input();  // another device wrote
      if (preemptible) {
        // Preemption point: a few ops in flight (the one running and the next ones, queued), so
        // the step stops within kPreemptibleOpsInFlight ops of the request while the device
        // never waits for the host's check (with one op in flight the queue drained and PoCL's
        // workers went idle at every op).
        if (op_events.size() >= kPreemptibleOpsInFlight)
          dev_.wait(op_events[op_events.size() - kPreemptibleOpsInFlight].second, deadline,
                    "an earlier op");
        bool go = !flags->preempt_requested();
        const auto w0 = Clock::now();
        for (size_t w = 0; go && w < op.wait_flags.size(); ++w)
          go = flags->wait_or_preempt(op.wait_flags[w], step.seq, op.predicted_us);
        report.wait_us += std::chrono::duration<double, std::micro>(Clock::now() - w0).count();
        if (!go) {
          report.next_op = static_cast<uint32_t>(i);
          report.preempted = true;
          break;
        }
      }
      if (!op.wait_flags.empty()) {
        const auto w0 = Clock::now();
        for (uint32_t f : op.wait_flags) flags->wait(f, step.seq, op.predicted_us);
        report.wait_us += std::chrono::duration<double, std::micro>(Clock::now() - w0).count();
        if (copies()) {
          // Another device wrote into host memory meanwhile: upload the inputs, once our own
          // earlier read-backs have landed there (a runtime may read the host copy at enqueue).
          dev_.drain(deadline, "the read-backs before a cross-device input");
          for (const fb::TensorRef* r : {op.in0.get(), op.in1.get()})
            if (r)
              check_cl(
                  clEnqueueWriteBuffer(q, p.arena, CL_FALSE, at(*r), uint64_t{n} * r->cols() * 4,
                                       p.mem.arena + at(*r), 0, nullptr, nullptr),
                  "clEnqueueWriteBuffer(input)");
        }
      }
      const uint32_t t0 = std::min(op.seq_begin, n);
      const uint32_t t1 = op.seq_end ? std::min(op.seq_end, n) : n;
      const bool kv_op = op.kind == fb::OpKind::KvWrite || op.kind == fb::OpKind::Attention;
      const KvArgs kv = kv_op
                            ? p.kv.args(kvl, static_cast<uint32_t>(std::max<int16_t>(op.layer, 0)),
                                        step.page_tables_offset, step.page_table_cols)
                            : KvArgs{};
      cl_event first = nullptr, last = nullptr;
      // A fused group (op_fusion.h) launches ops [i, i + covered) as one kernel.
      size_t covered = 1;
      if (fuse_ && !p.fusion.empty() && p.fusion[i].kind != Fusion::none) {
        const FusedGroup g = p.fusion[i];
        // The matmuls it launches (sibling_matmuls) or feeds (*_quantize: the op after it).
        std::array<MatmulArgs, GpuKernels::kMaxSiblings> mm;
        size_t n_mm = 0;
        if (g.kind == Fusion::sibling_matmuls)
          for (; n_mm < g.ops; ++n_mm) mm[n_mm] = matmul_args(p, at, *prog.ops[i + n_mm], n, tok);
        else if (g.kind != Fusion::rope_pair)
          mm[n_mm++] = matmul_args(p, at, *prog.ops[i + g.ops], n, tok);
        const FusedLaunch fused = launch_fused(kernels_, prog, i, g, p.arena, at, p.weights, tok,
                                               all, std::span<const MatmulArgs>(mm.data(), n_mm));
        last = fused.event;
        if (last) covered = fused.ops;
        if (!last && kernels_.chained_stages() != stages_before) covered = g.ops;  // recorded
      }
      if (!last && kernels_.chained_stages() == stages_before) switch (op.kind) {
          case fb::OpKind::Embed:
            last =
                kernels_.embed(p.arena, static_cast<DType>(op.weight->dtype()), p.weights,
                               op.weight->offset(), op.weight->cols(), tok, at(*op.out),
                               op.out->cols(), all, packed_.rows(p.weights, op.weight->offset()));
            if (op.scale != 1.0f) {
              first = last;
              last = kernels_.scale(p.arena, at(*op.out), op.out->cols(), op.scale, op.out->cols(),
                                    all);
            }
            break;
          case fb::OpKind::RmsNorm:
            last =
                kernels_.rmsnorm(p.arena, at(*op.in0), op.in0->cols(), at(*op.out), op.out->cols(),
                                 p.weights, op.weight->offset(), op.in0->cols(), op.eps, all);
            break;
          case fb::OpKind::MatMul:
          case fb::OpKind::Logits:
            last = kernels_.matmul(p.arena, matmul_args(p, at, op, n, tok));
            break;
          case fb::OpKind::Rope: {
            RopeArgs r;
            r.freq_base = op.freq_base;
            r.freq_scale = op.freq_scale;
            r.mode = op.rope_mode;
            r.w = p.weights;
            r.has_factors = op.freq_factors != nullptr;
            if (op.freq_factors) r.factors_off = op.freq_factors->offset();
            last = kernels_.rope(p.arena, at(*op.in0), op.in0->cols(), op.n_heads, op.head_dim, r,
                                 tok, all);
            break;
          }
          case fb::OpKind::AddBias: {
            const TokenRange rows{t0, std::max(t0, t1)};
            last = kernels_.add_bias(p.arena, at(*op.in0), op.in0->cols(), p.weights,
                                     op.weight->offset(), op.in0->cols(), rows);
            break;
          }
          case fb::OpKind::KvWrite:
            last = kernels_.kv_write(p.arena, at(*op.in0), op.in0->cols(), at(*op.in1),
                                     op.in1->cols(), kv, tok, all);
            break;
          case fb::OpKind::Attention:
            last = kernels_.attention(p.arena, at(*op.in0), op.in0->cols(), at(*op.out),
                                      op.out->cols(), kv, tok, op.n_heads, op.n_kv_heads,
                                      op.head_dim, all, context, &first);
            break;
          case fb::OpKind::SwiGlu:
            last = op.ffn_act == static_cast<uint8_t>(ops::FfnAct::gelu_tanh)
                       ? kernels_.geglu(p.arena, at(*op.in0), op.in0->cols(), at(*op.in1),
                                        op.in1->cols(), at(*op.out), op.out->cols(), op.out->cols(),
                                        all)
                       : kernels_.swiglu(p.arena, at(*op.in0), op.in0->cols(), at(*op.in1),
                                         op.in1->cols(), at(*op.out), op.out->cols(),
                                         op.out->cols(), all);
            break;
          case fb::OpKind::Add:
            last = kernels_.add(p.arena, at(*op.in0), op.in0->cols(), at(*op.in1), op.in1->cols(),
                                at(*op.out), op.out->cols(), op.out->cols(), all);
            break;
        }
      if (!first) first = last;
      if (apart) kernels_.begin_chain();
      fill_chained();  // a chain enqueued before this op's own launch
      if (!last && kernels_.chained_stages() != stages_before) chained.push_back(op_events.size());
      op_events.emplace_back(first, last);
      op_wait_us.push_back(report.wait_us - waited_before);
      // The ops the fused launch also did: no time of their own (the trace shows the launch on
      // its first op), the launch's end as their end (what a preemption check waits for).
      for (size_t c = 1; c < covered; ++c) {
        if (last) clRetainEvent(last);
        op_events.emplace_back(nullptr, last);
        op_wait_us.push_back(0);
      }
      const size_t group_begin = i;
      i += covered - 1;
      const fb::OpT& done = *prog.ops[i];  // the last op launched: its flag says it is done
      // A discrete GPU's driver may hold enqueued commands until a flush: start each op while
      // the host enqueues the next.
      if (preemptible || copies()) check_cl(clFlush(q), "clFlush");
      // Host memory is where the frontend (logits), a restarted gpu_svc (KV rows) and the other
      // device (an op's output it waits for: the builder flags every cross-device producer) look.
      // A program that waits brings back every op's output, right after it: its whole-tensor
      // uploads at a wait must not overwrite this device's part. One that does not brings its KV
      // rows back once, at the step's end (a few rectangles, not two reads a layer and token).
      const bool kv_at_end =
          copies() && !p.waits && op.kind == fb::OpKind::KvWrite && done.publish_flag < 0;
      kv_rows_written = kv_rows_written || kv_at_end;
      // A fused launch's ops each bring back what they would apart (the last one's event says
      // when all of it is back: the queue is in order).
      cl_event readback = nullptr;
      for (size_t c = group_begin; copies() && !kv_at_end && c <= i; ++c) {
        const fb::OpT& o = *prog.ops[c];
        if (!(p.waits || (c == i && o.publish_flag >= 0) || o.kind == fb::OpKind::Logits ||
              o.kind == fb::OpKind::KvWrite))
          continue;
        const uint32_t c0 = std::min(o.seq_begin, n);
        const uint32_t c1 = o.seq_end ? std::min(o.seq_end, n) : n;
        if (cl_event e = read_back_output(p, at, o, rows, page_tables, step, c0, c1)) {
          if (readback) clReleaseEvent(readback);
          readback = e;
        }
      }
      if (done.publish_flag >= 0) {
        pending_callbacks_.fetch_add(1, std::memory_order_acq_rel);
        auto* ctx = new PublishContext{flags, static_cast<uint32_t>(done.publish_flag), step.seq,
                                       &pending_callbacks_};
        cl_int err = CL_SUCCESS;
        if (publisher_)
          publisher_->watch(readback ? readback : last,
                            [ctx](cl_int status) { publish_on_complete(nullptr, status, ctx); });
        else
          err =
              clSetEventCallback(readback ? readback : last, CL_COMPLETE, publish_on_complete, ctx);
        if (err != CL_SUCCESS) {
          pending_callbacks_.fetch_sub(1, std::memory_order_acq_rel);
          delete ctx;
          if (readback) clReleaseEvent(readback);
          check_cl(err, "clSetEventCallback");
        }
        check_cl(clFlush(q), "clFlush");  // the consumer is waiting: start now
      }
      if (readback) clReleaseEvent(readback);
    }
    kernels_.end_chain();
    fill_chained();
    if (kv_rows_written) {
      // The rows are read once the kernels are done. Enqueued behind running kernels, NVIDIA's
      // reads into host (pageable) memory cost ~8 ms a decode step of the 1B on the H100 (32
      // rectangles); after them, 0.1 ms (bench/gpu/RESULTS.md, "2026-11-28: discrete GPUs").
      dev_.drain(deadline, "the step's kernels");
      read_back_kv_rows(p, rows, page_tables, step);
    }
    dev_.drain(deadline, "the step's kernels");
    done_at = Clock::now();
    wait_callbacks(deadline);
    if (dev_.has_narrow() && !low && step.first_op == 0 && !report.preempted) {
      // Its own time: what it waited for the other device's flags is not the queue's doing.
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - enqueued).count();
      picker_.observe(id, n, context, on, std::max(0.0, us - report.wait_us));
    }
  } catch (...) {
    // Callbacks of ops already enqueued hold `flags`, which the caller may free once we
    // return: let them run first (an error path, so a blocking clFinish is acceptable).
    try {
      kernels_.end_chain();  // a chain recorded half-way is enqueued (its outputs are unused)
    } catch (const Error&) {
    }
    fill_chained();
    clFinish(q);
    try {
      wait_callbacks(Clock::now() + std::chrono::seconds(5));
    } catch (const Error&) {
    }
    throw;
  }
  report.ops_run = static_cast<uint32_t>(op_events.size());
  report.launches = static_cast<uint32_t>(kernels_.launches() - launches_before);
  // Device time onto the host clock: the last kernel ended when the host saw the step done (a
  // little before, by the wake-up), so every span is shifted by that one offset and kept inside
  // [enqueued, done_at].
  int64_t offset_ns = 0;
  const int64_t lo_ns = ns_of(enqueued), hi_ns = ns_of(done_at);
  for (size_t j = op_events.size(); j-- > 0;) {
    if (!op_events[j].first) continue;  // an op a fused launch did (no span of its own)
    const cl_ulong last_end = event_span(op_events[j].first, op_events[j].second).second;
    if (last_end > 0) offset_ns = hi_ns - static_cast<int64_t>(last_end);
    break;
  }
  for (size_t j = 0; j < op_events.size(); ++j) {
    const size_t i = step.first_op + j;
    const fb::OpT& op = *prog.ops[i];
    OpTiming ot;
    ot.op_index = static_cast<uint32_t>(i);
    const auto [dev_start, dev_end] = event_span(op_events[j].first, op_events[j].second);
    ot.measured_us = static_cast<double>(dev_end - dev_start) / 1e3;
    if (dev_end > 0) {
      ot.start_ns = std::clamp(static_cast<int64_t>(dev_start) + offset_ns, lo_ns, hi_ns);
      ot.end_ns = std::clamp(static_cast<int64_t>(dev_end) + offset_ns, ot.start_ns, hi_ns);
    }
    ot.wait_us = op_wait_us[j];
    if (soc_) {
      OpShape s;
      s.kind = static_cast<OpKind>(op.kind);
      s.wtype = op.weight ? static_cast<DType>(op.weight->dtype()) : DType::F16;
      s.n = n;
      const uint32_t t0 = std::min(op.seq_begin, n);
      const uint32_t t1 = op.seq_end ? std::min(op.seq_end, n) : n;
      switch (op.kind) {
        case fb::OpKind::MatMul:
        case fb::OpKind::Logits:
          s.m = (op.row_end ? op.row_end : op.weight->rows()) - op.row_begin;
          s.k = op.weight->cols();
          s.n = op.kind == fb::OpKind::Logits ? n_logit_rows : (t1 > t0 ? t1 - t0 : 0);
          break;
        case fb::OpKind::Attention:
          s.m = int64_t{op.n_heads} * op.head_dim;
          s.k = context;
          break;
        case fb::OpKind::KvWrite:
          s.m = kvl.kv_dim;
          break;
        default:
          s.m = op.out ? op.out->cols() : 0;
          break;
      }
      ot.modeled_us = gpu_modeled_us(*soc_, s);
    }
    report.measured_us += ot.measured_us;
    report.modeled_us += ot.modeled_us;
    report.ops.push_back(ot);
  }
  report.wall_us = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
  // Without op timing (an untimed queue) the ops have no device times: the step's own measure
  // is then its time from the first enqueue to done.
  if (!dev_.queue_timed())
    report.measured_us = std::chrono::duration<double, std::micro>(done_at - enqueued).count();
  return report;
}

}  // namespace duet::gpu
