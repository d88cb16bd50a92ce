#pragma once
// QueuePicker: which of gpu_svc's two PoCL queues runs a step (cl_device.h, "narrow queue").
//
// On a CPU device PoCL's all-cores "pthread" driver hands every kernel to worker threads; for a
// step of a few tokens the hand-offs cost more than the kernels (tiny-fortune, one-token decode:
// 0.57 ms a step, 75% of it thread wake-ups and PoCL's command bookkeeping). Its "basic" driver
// runs the kernels on the flushing thread: 0.31 ms for that step, but one core, so it loses on
// large steps (261-token prefill 23 vs 17 ms) and on a big model's decode (llama3.2-1b Q4_0 one
// token: 17.1 vs 14.8 ms). Which one wins depends on the model, the step's token count and the
// machine, so the picker measures instead of assuming: per (program, token count, context
// bucket) it runs the
// first steps alternately on both, then the one whose recent steps were faster, and re-measures
// the other every `reprobe_every` steps (load changes). An estimate is the median of an arm's
// last three times, so one slow first run (PoCL compiling a kernel variant) does not decide.
// Steps over max_tokens always go wide (one core cannot win there). The context matters as much
// as the token count: attention reads every earlier position, in parallel over heads and
// tokens, so 8 decoders at 16 positions run faster on one core (0.86 vs 1.05 ms) and at 320
// positions slower (3.4 vs 2.7 ms; bench/gpu/narrow_side_by_side.sh). The context bucket is
// that of the step's longest context, in doubling ranges: [0, 64), [64, 128), [128, 256), ...
// Because the narrow queue's advantage only shrinks as the context grows, a bucket not yet
// measured takes the answer of a measured neighbour where that answer carries over: wide from a
// smaller context where wide won, narrow from a larger one where narrow won. Otherwise every
// bucket a decode grows into paid three probes on the losing queue (llama3.2-1b Q4_K_M: 31-35 ms
// against 17 wide, 8% of a 32-token decode). Such a bucket still re-measures the other queue
// every reprobe interval (its neighbour's) and decides on its own once both have their samples.
// A re-measurement costs (loser / winner - 1) of a step, so its interval grows with that ratio
// to keep re-measuring under ~0.5% of the shape's time: at least reprobe_every steps, at most 16x.
// Not thread-safe: the runner runs one step at a time.
#include <array>
#include <compare>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

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
  // context: the step's longest context (positions a token attends to, itself included).
  StepQueue pick(uint32_t program, uint32_t n_tokens, uint32_t context);
  // A whole step of that shape took `us` (host wall clock) on `q`.
  void observe(uint32_t program, uint32_t n_tokens, uint32_t context, StepQueue q, double us);
  // The context bucket: 0 below 64 positions, then one per doubling.
  static uint32_t context_bucket(uint32_t context);
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
  bool measured(const Shape& s) const {
    return s.arm[0].n >= o_.samples && s.arm[1].n >= o_.samples;
  }
  static StepQueue faster(const Shape& s) {
    return s.arm[1].estimate() < s.arm[0].estimate() ? StepQueue::narrow : StepQueue::wide;
  }
  // The answer a measured neighbouring bucket gives this one (above), if any: its winner and
  // its loser / winner time ratio (the re-measurement interval's).
  struct Carried {
    StepQueue queue;
    double loser_over_winner;
  };
  std::optional<Carried> carried_over(uint32_t program, uint32_t n_tokens,
                                      uint32_t context_bucket) const;
  static double loser_over_winner(const Shape& s);
  // The winner of a decided shape, re-measuring the other queue at the interval above.
  StepQueue keep(Shape& s, StepQueue best, double ratio);  // ratio: loser / winner
  Options o_;
  struct Key {
    uint32_t program, n_tokens, context_bucket;
    auto operator<=>(const Key&) const = default;
  };
  Shape& shape(uint32_t program, uint32_t n_tokens, uint32_t context) {
    return shapes_[Key{program, n_tokens, context_bucket(context)}];
  }
  std::map<Key, Shape> shapes_;
};

}  // namespace duet::gpu
