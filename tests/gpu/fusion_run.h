#pragma once
// The fusion tests' run (gpu_fusion_test: the CPU integer path; gpu_kernel_fusion_test: the GPU
// kernels): a prefill of 11 tokens and 3 decode steps of a program, fused or not, through a real
// GpuRunner, with the NPU half (if the plan has one) on the reference interpreter.
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/model/model.h"
#include "core/program/program.h"
#include "services/gpu_svc/gpu_runner.h"
#include "services/gpu_svc/op_fusion.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/local_flags.h"
#include "tests/support/program_setup.h"

namespace duet::gpu::testing {

// Every step's logits, and how many ops of the last (decode) step a fused launch did (no span of
// their own).
struct FusionRun {
  std::vector<float> logits;
  size_t ops_folded = 0;
  size_t matmuls_folded = 0;   // of them matmuls (into a sibling's launch)
  size_t sibling_ops = 0;      // the program's sibling groups' ops past their first
  uint32_t launches = 0;       // kernels the last step enqueued
  size_t quantize_groups = 0;  // with fuse: the program's *_quantize groups (CPU integer path)
};

// `target` picks the kernels (FusionTarget::gpu_kernels: GpuKernels::set_gpu_kernels, on any
// device) and the fusion plan the counts come from; `deadline` bounds each step (its flags wait
// half of it); `chains`: GpuRunner::set_step_chains (the decode steps' ops as chains);
// `min_chunk_keys` (0: the default): GpuKernels::set_attention_min_chunk_keys, and then a prompt
// of 40 tokens, so that a chunk of 16 keys splits the decode steps' attention in two.
inline FusionRun run_fusion_steps(ClDevice& dev, const LlamaModel& m, const BuiltPrograms& built,
                                  bool fuse, FusionTarget target, std::chrono::seconds deadline,
                                  bool chains = false, uint32_t min_chunk_keys = 0) {
  HostBuffer arena(dev, built.arena.bytes), kv(dev, built.kv.bytes());
  const ProgramMemory mem{arena.at(0),      built.arena.bytes, kv.at(0),
                          built.kv.bytes(), m.file().data(),   m.file().size()};
  test_support::fill_page_table(mem.arena, built, test_support::PageOrder::reversed);
  test_support::LocalFlags flags(4096, deadline / 2);
  GpuRunner runner(dev, nullptr);
  if (target == FusionTarget::gpu_kernels) runner.kernels().set_gpu_kernels(true);
  runner.set_fusion(fuse);
  runner.set_step_chains(chains);
  if (min_chunk_keys) runner.kernels().set_attention_min_chunk_keys(min_chunk_keys);
  // The ops a fused launch also did are told apart by their missing device times: profiled
  // queues on every device (gpu.op_timing's auto leaves a copying device's off).
  runner.set_op_timing(true);
  runner.register_program(1, built.gpu, mem);
  FusionRun out;
  uint64_t seq = 0;
  auto step = [&](const std::vector<int32_t>& tokens, int pos) {
    test_support::write_token_rows(mem.arena, built, tokens, pos,
                                   test_support::LogitsRows::every_token);
    const StepArgs args =
        test_support::step_args(built, ++seq, static_cast<uint32_t>(tokens.size()));
    StepReport report;
    test_support::run_both_halves(
        [&] {
          if (!built.npu.ops.empty()) interpret_program(built.npu, mem, args, flags);
        },
        [&] { report = runner.run_step(1, args, deadline, &flags); });
    const float* l = reinterpret_cast<const float*>(mem.arena + built.arena.logits);
    out.logits.insert(out.logits.end(), l, l + tokens.size() * m.hp().n_vocab);
    out.ops_folded = out.matmuls_folded = 0;
    for (const OpTiming& op : report.ops) {
      const bool folded = op.start_ns == 0 && op.end_ns == 0;
      out.ops_folded += folded;
      out.matmuls_folded += folded && built.gpu.ops[op.op_index]->kind == fb::OpKind::MatMul;
    }
    out.launches = report.launches;
  };
  for (const FusedGroup& g : plan_fusion(built.gpu, target)) {
    out.quantize_groups += fuse && target == FusionTarget::cpu_integer &&
                           (g.kind == Fusion::add_norm_quantize ||
                            g.kind == Fusion::norm_quantize || g.kind == Fusion::swiglu_quantize);
    if (g.kind == Fusion::sibling_matmuls) out.sibling_ops += g.ops - 1;
  }
  std::vector<int32_t> prompt = {1, 703, 1975, 310, 263, 1243, 322, 42, 17, 5, 900};
  while (min_chunk_keys && prompt.size() < 40) prompt.push_back(prompt[prompt.size() - 11] + 1);
  step(prompt, 0);
  int pos = static_cast<int>(prompt.size());
  for (int32_t tok : {100, 7, 1500}) step({tok}, pos++);
  return out;
}

}  // namespace duet::gpu::testing
