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

}  // namespace duet::gpu
