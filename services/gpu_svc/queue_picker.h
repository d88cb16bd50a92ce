#pragma once
// QueuePicker: which of gpu_svc's two PoCL queues runs a step (cl_device.h, "narrow queue").
//
// On a CPU device PoCL's all-cores "pthread" driver hands every kernel to worker threads; for a
// step of a few tokens the hand-offs cost more than the kernels (tiny-fortune, one-token decode:
// 0.57 ms a step, 75% of it thread wake-ups and PoCL's command bookkeeping). Its "basic" driver
// runs the kernels on the flushing thread: 0.31 ms for that step, but one core, so it loses on
// large steps (261-token prefill 23 vs 17 ms) and on a big model's decode (llama3.2-1b Q4_0 one
// token: 17.1 vs 14.8 ms). Which one wins depends on the model, the step's token count and the
// machine, so the picker measures instead of assuming: per (program, token count) it runs the
// first steps alternately on both, then the one whose recent steps were faster, and re-measures
// the other every `reprobe_every` steps (load changes). An estimate is the median of an arm's
// last three times, so one slow first run (PoCL compiling a kernel variant) does not decide.
// Steps over max_tokens always go wide (one core cannot win there). Not thread-safe: the runner
// runs one step at a time.
#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

namespace duet::gpu {

enum class StepQueue : uint8_t { wide = 0, narrow = 1 };

struct QueuePickerOptions {
  enum class Mode : uint8_t {
    off,      // always wide
    measure,  // the rule above (the default)
    on,       // narrow for every step up to max_tokens (tests, A/B runs)
  };
  Mode mode = Mode::measure;
  uint32_t max_tokens = 16;
  uint64_t samples = 3;  // measured steps per arm before the faster one is chosen
  uint64_t reprobe_every = 64;
};

class QueuePicker {
 public:
  using Options = QueuePickerOptions;
  using Mode = QueuePickerOptions::Mode;
  // Reads DUET_GPU_NARROW (auto | off | on) and DUET_GPU_NARROW_MAX_TOKENS (1-4096); throws
  // Error(invalid_argument) naming the variable on anything else.
  static Options from_env();

  QueuePicker() = default;
  explicit QueuePicker(Options o) : o_(o) {}
  StepQueue pick(uint32_t program, uint32_t n_tokens);
  // A whole step of that shape took `us` (host wall clock) on `q`.
  void observe(uint32_t program, uint32_t n_tokens, StepQueue q, double us);
  const Options& options() const { return o_; }
  // Per shape: steps and median times of each arm (for gpu_svc's status).
  nlohmann::json to_json() const;

 private:
  struct Arm {
    std::array<double, 3> last{};  // ring of the latest times
    uint64_t n = 0;                // whole steps timed on this arm (the ring holds min(n, 3))
    double estimate() const;       // median of the ring; +inf before any time
  };
  struct Shape {
    Arm arm[2];
    uint64_t picks = 0;
  };
  Options o_;
  std::map<std::pair<uint32_t, uint32_t>, Shape> shapes_;
};

}  // namespace duet::gpu
