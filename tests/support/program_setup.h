#pragma once
// What the tests that run the tiny-fortune programs by hand share (tests/program, tests/gpu,
// tests/npu): the spec they build from, host memory for the segments, the token table and page
// table they fill, the step arguments, and running the two devices' halves side by side.
// Header-only.
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/model/model.h"
#include "core/program/program.h"

namespace duet::test_support {

// One row of the arena's token table (ArenaPlan::tokens).
struct TokenRow {
  int32_t token, pos, seq, logits_row;
};

// A spec for `plan` with room for max_tokens tokens and as many logits rows.
inline ProgramSpec program_spec(const LlamaModel& m, Plan plan, uint32_t max_tokens,
                                uint32_t max_ctx, std::string name) {
  ProgramSpec spec;
  spec.model = &m;
  spec.plan = std::move(plan);
  spec.max_tokens = max_tokens;
  spec.max_logit_rows = max_tokens;
  spec.max_ctx = max_ctx;
  spec.name = std::move(name);
  return spec;
}

// Zeroed arena and KV bytes of `built`, and the model's weights, in this process.
struct HostProgramMemory {
  HostProgramMemory(const BuiltPrograms& built, const LlamaModel& m)
      : arena(built.arena.bytes, 0), kv(built.kv.bytes(), 0) {
    mem = {arena.data(), arena.size(), kv.data(), kv.size(), m.file().data(), m.file().size()};
  }
  std::vector<uint8_t> arena, kv;
  ProgramMemory mem;
};

enum class PageOrder { in_order, reversed };

// Sequence 0's page table: its pages in order, or last first (so a runner that ignores the
// table reads the wrong pages).
inline void fill_page_table(uint8_t* arena, const BuiltPrograms& b,
                            PageOrder order = PageOrder::in_order) {
  auto* pt = reinterpret_cast<int32_t*>(arena + b.arena.page_tables);
  const uint32_t n = b.max_pages_per_seq;
  for (uint32_t i = 0; i < n; ++i)
    pt[i] = static_cast<int32_t>(order == PageOrder::in_order ? i : n - 1 - i);
}

inline TokenRow* token_rows(uint8_t* arena, const BuiltPrograms& b) {
  return reinterpret_cast<TokenRow*>(arena + b.arena.tokens);
}

enum class LogitsRows { every_token, last_token };

// `tokens` of sequence 0 at positions pos, pos + 1, ...: every token gets its own logits row
// (row t), or only the last one does (row 0).
inline void write_token_rows(uint8_t* arena, const BuiltPrograms& b,
                             const std::vector<int32_t>& tokens, int pos, LogitsRows logits) {
  TokenRow* rows = token_rows(arena, b);
  const int n = static_cast<int>(tokens.size());
  for (int t = 0; t < n; ++t) {
    const int32_t row = logits == LogitsRows::every_token ? t : (t == n - 1 ? 0 : -1);
    rows[t] = {tokens[t], pos + t, 0, row};
  }
}

// A step of n_tokens tokens of one sequence over `b`'s token and page tables.
inline StepArgs step_args(const BuiltPrograms& b, uint64_t seq, uint32_t n_tokens) {
  return StepArgs{seq, n_tokens, 1, b.arena.tokens, b.arena.page_tables, b.max_pages_per_seq};
}

// Runs `npu_half` on a second thread beside `gpu_half` on this one, and rethrows the first
// failure of either: the other half's is most often its consequence (a wait on a flag the
// failed half never published).
inline void run_both_halves(const std::function<void()>& npu_half,
                            const std::function<void()>& gpu_half) {
  std::mutex mu;
  std::exception_ptr first_error;
  auto run = [&](const std::function<void()>& half) {
    try {
      half();
    } catch (...) {
      std::lock_guard lock(mu);
      if (!first_error) first_error = std::current_exception();
    }
  };
  std::thread npu([&] { run(npu_half); });
  run(gpu_half);
  npu.join();
  if (first_error) std::rethrow_exception(first_error);
}

// One step of sequence `seq` over `tokens` from position `pos`, every token its own logits row,
// with both halves of `b` run at once by the reference interpreter: the logits rows (n_vocab
// floats each).
inline std::vector<float> interpret_step(const BuiltPrograms& b, HostProgramMemory& host,
                                         FlagSync& flags, uint64_t seq,
                                         const std::vector<int32_t>& tokens, int pos,
                                         size_t n_vocab) {
  write_token_rows(host.arena.data(), b, tokens, pos, LogitsRows::every_token);
  const StepArgs args = step_args(b, seq, static_cast<uint32_t>(tokens.size()));
  run_both_halves([&] { interpret_program(b.npu, host.mem, args, flags); },
                  [&] { interpret_program(b.gpu, host.mem, args, flags); });
  const float* logits = reinterpret_cast<const float*>(host.arena.data() + b.arena.logits);
  return {logits, logits + tokens.size() * n_vocab};
}

}  // namespace duet::test_support
