#pragma once
// What the single-process program tests (tests/program, tests/gpu, tests/npu, tests/agent) share:
// completion flags in process memory instead of shm, the tiny-fortune model files, a plan that
// keeps both devices busy. Header-only:
// DUET_SOURCE_DIR is defined per test executable (tests/CMakeLists.txt).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/program/program.h"

namespace duet::test_support {

// tests/data/tiny-fortune/fortune-<variant>.gguf (variant: f16, q8_0, q4_0).
inline std::string tiny_fortune_path(const std::string& variant) {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-" + variant + ".gguf";
}

// Every matmul split by tokens: the NPU takes `npu_tokens` of each step's tokens, the GPU the
// rest (so both devices run in every step, as the preemption tests need).
inline Plan activation_split_plan(int npu_tokens) {
  Plan p;
  p.name = "activation_split";
  for (Placement& pl : p.matmul) pl = {Strategy::activation_split, 0, npu_tokens};
  return p;
}

// Flags in process memory; waits spin-yield until a deadline and then throw Error(timeout).
class LocalFlags : public FlagSync {
 public:
  explicit LocalFlags(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(30))
      : flags_(n), timeout_(timeout) {}
  void wait(uint32_t flag, uint64_t seq, float) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (flags_.at(flag).load(std::memory_order_acquire) < seq) {
      if (std::chrono::steady_clock::now() > deadline)
        throw Error(Errc::timeout,
                    "flag " + std::to_string(flag) + " did not reach " + std::to_string(seq));
      std::this_thread::yield();
    }
  }
  void publish(uint32_t flag, uint64_t seq) override {
    flags_.at(flag).store(seq, std::memory_order_release);
  }
  uint64_t load(uint32_t flag) const { return flags_.at(flag).load(std::memory_order_acquire); }

 private:
  std::vector<std::atomic<uint64_t>> flags_;
  std::chrono::milliseconds timeout_;
};

}  // namespace duet::test_support
