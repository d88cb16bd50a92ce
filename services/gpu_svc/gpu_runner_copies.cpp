// GpuRunner in copies mode (a discrete GPU, which cannot map the shm segments;
// docs/ARCHITECTURE.md): an op's output read back for the frontend or the other device, the KV
// pages a step names uploaded the first time, and a step's new KV rows read back once its kernels
// are done.
#include <algorithm>
#include <vector>

#include "core/base/error.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/gpu_runner_program.h"
#include "services/gpu_svc/kv_pieces.h"

namespace duet::gpu {

cl_event GpuRunner::read_back_output(const Program& p, const ArenaOffsets& at, const fb::OpT& op,
                                     const void* token_rows, const int32_t* page_tables,
                                     const StepArgs& step, uint32_t t0, uint32_t t1) {
  const uint32_t n = step.n_tokens;
  cl_command_queue q = dev_.queue();
  const auto* rows = static_cast<const TokenRow*>(token_rows);
  cl_event e = nullptr;
  auto read = [&](cl_mem buf, uint8_t* host, uint64_t offset, uint64_t bytes) {
    if (e) clReleaseEvent(e);
    e = nullptr;
    check_cl(clEnqueueReadBuffer(q, buf, CL_FALSE, offset, bytes, host + offset, 0, nullptr, &e),
             "clEnqueueReadBuffer");
  };
  // Rows [r0, r1) of token rows [a, b) of a [tokens][cols] f32 tensor.
  auto read_rect = [&](const fb::TensorRef& t, uint32_t a, uint32_t b, uint32_t r0, uint32_t r1) {
    if (b <= a || r1 <= r0) return;
    if (e) clReleaseEvent(e);
    e = nullptr;
    const size_t buffer_origin[3] = {at(t) + size_t{r0} * 4, a, 0};
    const size_t host_origin[3] = {size_t{r0} * 4, a, 0};
    const size_t region[3] = {size_t{r1 - r0} * 4, b - a, 1};
    const size_t pitch = size_t{t.cols()} * 4;
    check_cl(clEnqueueReadBufferRect(q, p.arena, CL_FALSE, buffer_origin, host_origin, region,
                                     pitch, 0, pitch, 0, p.mem.arena + at(t), 0, nullptr, &e),
             "clEnqueueReadBufferRect");
  };
  const fb::KvLayoutT& kvl = *p.prog.kv;
  switch (op.kind) {
    case fb::OpKind::MatMul:
      read_rect(*op.out, t0, t1, op.row_begin, op.row_end ? op.row_end : op.weight->rows());
      break;
    case fb::OpKind::Logits:
      for (uint32_t t = t0; t < t1; ++t)
        if (rows[t].logits_row >= 0)
          read_rect(*op.out, static_cast<uint32_t>(rows[t].logits_row),
                    static_cast<uint32_t>(rows[t].logits_row) + 1, op.row_begin,
                    op.row_end ? op.row_end : op.weight->rows());
      break;
    case fb::OpKind::KvWrite:
      for (uint32_t t = 0; t < n; ++t) {
        const KvSlot slot = kv_slot_of(rows[t], page_tables, step, kvl);
        const KvPiece& piece = p.kv.of_layer(static_cast<uint32_t>(op.layer));
        for (uint32_t which = 0; which < 2; ++which)
          read(piece.mem, p.mem.kv + piece.base,
               kv_row_offset(kvl, static_cast<uint32_t>(op.layer), which, slot.page, slot.row) -
                   piece.base,
               kv_row_bytes(kvl));
      }
      break;
    case fb::OpKind::Rope:
      read(p.arena, p.mem.arena, at(*op.in0), uint64_t{n} * op.in0->cols() * 4);
      break;
    case fb::OpKind::AddBias:
      read_rect(*op.in0, t0, t1, 0, op.in0->cols());
      break;
    default:
      read(p.arena, p.mem.arena, at(*op.out), uint64_t{n} * op.out->cols() * 4);
      break;
  }
  return e;
}

void GpuRunner::upload_new_kv_pages(const Program& p, const StepArgs& step,
                                    const int32_t* page_tables) {
  const fb::KvLayoutT& kvl = *p.prog.kv;
  std::vector<uint8_t>& current = *p.kv_current;
  std::vector<uint32_t> pages;
  for (uint64_t i = 0; i < uint64_t{step.n_seqs} * step.page_table_cols; ++i) {
    const int32_t page = page_tables[i];
    if (page >= 0 && static_cast<uint32_t>(page) < kvl.n_pages && !current[page])
      pages.push_back(static_cast<uint32_t>(page));
  }
  std::sort(pages.begin(), pages.end());
  pages.erase(std::unique(pages.begin(), pages.end()), pages.end());
  if (pages.empty()) return;
  const uint64_t stride = kv_layer_stride(kvl), page_bytes = kv_layer_page_bytes(kvl);
  p.kv.for_each_layer_run([&](uint32_t l0, uint32_t l1, const KvPiece& piece) {
    for (const uint32_t page : pages) {
      const size_t origin[3] = {kv_row_offset(kvl, l0, 0, page, 0) - piece.base, 0, 0};
      const size_t region[3] = {page_bytes, l1 - l0 + 1, 1};
      check_cl(clEnqueueWriteBufferRect(dev_.queue(), piece.mem, CL_FALSE, origin, origin, region,
                                        stride, 0, stride, 0, p.mem.kv + piece.base, 0, nullptr,
                                        nullptr),
               "clEnqueueWriteBufferRect(kv)");
    }
    kv_bytes_uploaded_ += pages.size() * page_bytes * (l1 - l0 + 1);
  });
  // Current once every write is enqueued (after a failed enqueue the next step tries again): this
  // step's kernels follow them on its in-order queue, and a step ends only once that has drained.
  for (const uint32_t page : pages) current[page] = 1;
}

void GpuRunner::read_back_kv_rows(const Program& p, const void* token_rows,
                                  const int32_t* page_tables, const StepArgs& step) {
  const auto* rows = static_cast<const TokenRow*>(token_rows);
  const fb::KvLayoutT& kvl = *p.prog.kv;
  const uint64_t stride = kv_layer_stride(kvl), row_bytes = kv_row_bytes(kvl);
  for (uint32_t t = 0; t < step.n_tokens; ++t) {
    const KvSlot slot = kv_slot_of(rows[t], page_tables, step, kvl);
    p.kv.for_each_layer_run([&](uint32_t l0, uint32_t l1, const KvPiece& piece) {
      for (uint32_t which = 0; which < 2; ++which) {
        const size_t origin[3] = {kv_row_offset(kvl, l0, which, slot.page, slot.row) - piece.base,
                                  0, 0};
        const size_t region[3] = {row_bytes, l1 - l0 + 1, 1};
        check_cl(clEnqueueReadBufferRect(dev_.queue(), piece.mem, CL_FALSE, origin, origin, region,
                                         stride, 0, stride, 0, p.mem.kv + piece.base, 0, nullptr,
                                         nullptr),
                 "clEnqueueReadBufferRect(kv rows)");
      }
    });
  }
}

}  // namespace duet::gpu
