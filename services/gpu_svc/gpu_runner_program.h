#pragma once
// GpuRunner's registered program (internal to gpu_runner*.cpp): registration builds it, the
// step reads it.
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "core/program/program.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/kv_pieces.h"
#include "services/gpu_svc/op_fusion.h"
#include "services/gpu_svc/tiled_weights.h"

namespace duet::gpu {

struct GpuRunner::Program {
  fb::ProgramT prog;
  ProgramMemory mem;
  bool uses_flags = false;
  bool waits = false;  // some op waits on the other device's flags (reads what it wrote)
  cl_mem weights = nullptr, arena = nullptr;
  KvPieces kv;  // the KV segment, one buffer per group of layers (kv_pieces.h)
  std::vector<uint8_t>* kv_current = nullptr;  // copies mode: GpuRunner::kv_current_'s entry
  bool uses_kv = false;
  // CPU integer path: the tiled copies of its Q4_0/Q8_0/K-quant matmul weights, by offset.
  std::map<uint64_t, std::shared_ptr<const TiledTensor>> tiled;
  std::vector<FusedGroup> fusion;  // per op (op_fusion.h); empty where nothing can fuse
};

// A step's token table row (core/program: the frontend writes them at tokens_offset).
struct TokenRow {
  int32_t token, pos, seq, logits_row;
};

// Where a token's K and V rows live: its sequence's page for its position, and the row in it.
struct KvSlot {
  uint32_t page, row;
};
inline KvSlot kv_slot_of(const TokenRow& r, const int32_t* page_tables, const StepArgs& step,
                         const fb::KvLayoutT& kvl) {
  const auto pos = static_cast<uint32_t>(r.pos);
  return {static_cast<uint32_t>(
              page_tables[uint64_t(r.seq) * step.page_table_cols + pos / kvl.page_tokens]),
          pos % kvl.page_tokens};
}

}  // namespace duet::gpu
