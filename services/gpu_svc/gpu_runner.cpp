// GpuRunner's registration: checking a program's ops against the kernels, wrapping its weights,
// arena and KV in device buffers (packed or tiled copies where the kernels want them) and
// forgetting it. The step itself is in gpu_runner_step.cpp.
#include "services/gpu_svc/gpu_runner.h"

#include <chrono>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/model/kv_budget.h"
#include "services/gpu_svc/gpu_runner_program.h"
#include "services/gpu_svc/kv_pieces.h"

namespace duet::gpu {
namespace {

using Clock = std::chrono::steady_clock;

std::string op_label(const fb::OpT& op, size_t index) {
  return "op " + std::to_string(index) + " (" + fb::EnumNameOpKind(op.kind) + ", layer " +
         std::to_string(op.layer) + ")";
}

}  // namespace

GpuRunner::GpuRunner(ClDevice& dev, const SocProfile* soc)
    : dev_(dev), kernels_(dev), soc_(soc), picker_(QueuePicker::from_env()) {
  if (copies()) publisher_ = std::make_unique<EventPoller>();
  const std::string timing = setting_text("DUET_GPU_OP_TIMING");  // checked: auto|on|off
  op_timing_ = timing == "on" || (timing == "auto" && dev.zero_copy());
}

GpuRunner::~GpuRunner() {
  dev_.use_low_priority(false);  // drains the low-priority queue
  dev_.use_narrow(false);        // drains the narrow queue
  dev_.use_op_timing(true);      // drains the untimed queue
  clFinish(dev_.queue());
  wait_callbacks(Clock::now() + std::chrono::seconds(5));
  for (auto& [key, mem] : buffers_) clReleaseMemObject(mem);
}

size_t GpuRunner::n_ops(uint32_t id) const {
  auto it = programs_.find(id);
  if (it == programs_.end())
    throw Error(Errc::not_found, "gpu_svc: no program " + std::to_string(id));
  return it->second->prog.ops.size();
}

cl_mem GpuRunner::wrap(const void* host, uint64_t bytes, bool read_only, bool fill) {
  if (!host || bytes == 0) bytes = 64;  // OpenCL has no empty buffers; nothing valid addresses it
  auto key = std::make_pair(host, bytes);
  if (auto it = buffers_.find(key); it != buffers_.end()) return it->second;
  if (bytes > dev_.info().max_alloc_bytes)
    throw Error(Errc::out_of_range, "gpu_svc: a segment of " + std::to_string(bytes) +
                                        " bytes exceeds " + dev_.info().name +
                                        "'s largest buffer (" +
                                        std::to_string(dev_.info().max_alloc_bytes) + " bytes)");
  cl_int err = CL_SUCCESS;
  const cl_mem_flags access = read_only ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE;
  cl_mem m = nullptr;
  if (!host || (!fill && !dev_.zero_copy())) {
    m = clCreateBuffer(dev_.context(), access, bytes, nullptr, &err);
  } else if (dev_.zero_copy()) {
    m = clCreateBuffer(dev_.context(), access | CL_MEM_USE_HOST_PTR, bytes, const_cast<void*>(host),
                       &err);
  } else {
    // Discrete device: weights are copied once here, the arena around every step.
    m = clCreateBuffer(dev_.context(), access | CL_MEM_COPY_HOST_PTR, bytes,
                       const_cast<void*>(host), &err);
  }
  check_cl(err, "clCreateBuffer");
  buffers_.emplace(key, m);
  return m;
}

void GpuRunner::check_device_memory(const ProgramMemory& mem) const {
  auto held = [&](const void* host) {
    for (const auto& [key, m] : buffers_)
      if (key.first == host) return true;
    return false;
  };
  uint64_t holding = 0;
  for (const auto& [key, m] : buffers_) holding += key.second;
  const uint64_t weights = held(mem.weights) ? 0 : mem.weights_bytes;
  const uint64_t arena = held(mem.arena) ? 0 : mem.arena_bytes;
  const uint64_t kv = !mem.kv || held(mem.kv) ? 0 : mem.kv_bytes;
  const auto limit_text = setting_override("DUET_GPU_MEMORY");  // checked: a size
  const uint64_t limit =
      limit_text ? parse_setting_size(*limit_text) : dev_.info().global_mem_bytes;
  if (holding + weights + arena + kv <= limit) return;
  throw Error(Errc::out_of_range,
              "gpu_svc: " + dev_.info().name + " has " + format_bytes(limit) + " of memory (" +
                  (limit_text ? "DUET_GPU_MEMORY" : "its global memory") +
                  "); this program needs " + format_bytes(weights + arena + kv) +
                  " more (weights " + format_bytes(weights) + ", arena " + format_bytes(arena) +
                  ", KV pool " + format_bytes(kv) + ") beside the " + format_bytes(holding) +
                  " held: lower the KV budget (`stack up --kv-memory`, DUET_KV_MEMORY)");
}

void GpuRunner::register_program(uint32_t id, fb::ProgramT program, const ProgramMemory& mem) {
  validate_program(program, mem);
  auto p = std::make_unique<Program>();
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const fb::OpT& op = *program.ops[i];
    const std::string where = "gpu_svc: " + op_label(op, i);
    auto fail = [&](const std::string& what) {
      throw Error(Errc::invalid_argument, where + ": " + what);
    };
    for (const fb::TensorRef* r : {op.in0.get(), op.in1.get(), op.out.get()})
      if (r && r->offset() % 4 != 0)
        fail("activation offset " + std::to_string(r->offset()) + " is not 4-byte aligned");
    if (op.weight) {
      const auto wt = static_cast<DType>(op.weight->dtype());
      const uint64_t align = wt == DType::F32 ? 4 : 2;
      if (op.weight->offset() % align != 0)
        fail("weight offset is not " + std::to_string(align) + "-byte aligned");
      if (op.kind != fb::OpKind::RmsNorm && op.kind != fb::OpKind::AddBias) {
        kernel_type_suffix(wt);  // throws unsupported for a type the kernels do not read
        if (op.weight->cols() % kQK != 0)
          fail("weight width " + std::to_string(op.weight->cols()) + " is not a multiple of 32");
        if (dtype_is_k_quant(wt) && op.weight->cols() % kQK_K != 0)
          fail(std::string(dtype_name(wt)) + " weight width " + std::to_string(op.weight->cols()) +
               " is not a multiple of 256");
      } else if (wt != DType::F32) {
        fail("norm weight and bias must be F32");
      }
    }
    if (op.freq_factors && op.freq_factors->offset() % 4 != 0)
      fail("rope freq_factors offset is not 4-byte aligned");
    if (!op.wait_flags.empty() || op.publish_flag >= 0) p->uses_flags = true;
    if (!op.wait_flags.empty()) p->waits = true;
    switch (op.kind) {
      case fb::OpKind::Embed:
        if (op.out->cols() != op.weight->cols()) fail("output width != embedding width");
        break;
      case fb::OpKind::RmsNorm:
        if (op.out->cols() != op.in0->cols()) fail("output width != input width");
        break;
      case fb::OpKind::SwiGlu:  // ffn_act checked by validate_program
      case fb::OpKind::Add:
        if (op.in0->cols() != op.out->cols() || op.in1->cols() != op.out->cols())
          fail("operand widths differ");
        break;
      case fb::OpKind::KvWrite:
        if (op.in1->cols() != program.kv->kv_dim) fail("V width != kv_dim");
        p->uses_kv = true;
        break;
      case fb::OpKind::Attention:
        if (op.head_dim > GpuKernels::kMaxHeadDim)
          fail("head_dim " + std::to_string(op.head_dim) + " exceeds the kernel's " +
               std::to_string(GpuKernels::kMaxHeadDim));
        if (op.in0->cols() != uint32_t{op.n_heads} * op.head_dim ||
            op.out->cols() != op.in0->cols())
          fail("Q/output width != n_heads * head_dim");
        if (program.kv->dtype == fb::DTypeCode::Q8_0 && op.head_dim % 32 != 0)
          fail("Q8_0 KV needs head_dim a multiple of 32, not " + std::to_string(op.head_dim));
        kernels_.reserve_attention(op.n_heads, op.head_dim, program.max_tokens);
        p->uses_kv = true;
        break;
      default:
        break;
    }
  }
  p->mem = mem;
  if (copies()) check_device_memory(mem);
  p->weights = wrap(mem.weights, mem.weights_bytes, true);
  if (copies()) packed_.pack_program(dev_, p->weights, mem.weights, program);
  if (kernels_.int8_matmul())
    for (const auto& op : program.ops)
      if ((op->kind == fb::OpKind::MatMul || op->kind == fb::OpKind::Logits) && op->weight &&
          has_tiled_layout(static_cast<DType>(op->weight->dtype())))
        p->tiled.try_emplace(
            op->weight->offset(),
            tiled_.get(dev_, static_cast<DType>(op->weight->dtype()), op->weight->rows(),
                       op->weight->cols(),
                       static_cast<const uint8_t*>(mem.weights) + op->weight->offset()));
  p->arena = wrap(mem.arena, mem.arena_bytes, false);
  if (mem.kv) {
    p->kv = map_kv_pieces(
        *program.kv, mem.kv, mem.kv_bytes, kv_buffer_limit(dev_.info().max_alloc_bytes),
        [this](const void* host, uint64_t bytes) { return wrap(host, bytes, false, false); });
    std::vector<uint8_t>& current = kv_current_[mem.kv];
    current.resize(std::max<size_t>(current.size(), program.kv->n_pages), 0);
    p->kv_current = &current;
  }
  // The integer path's fused launches read the matmuls' inputs in place: a copying device has
  // none of them. The GPU kernels' run on the device's copies.
  if (kernels_.gpu_kernels())
    p->fusion = plan_fusion(program, FusionTarget::gpu_kernels);
  else if (kernels_.int8_matmul() && !copies())
    p->fusion = plan_fusion(program);
  p->prog = std::move(program);
  programs_[id] = std::move(p);
}

void GpuRunner::unregister_program(uint32_t id) {
  programs_.erase(id);
}

}  // namespace duet::gpu
