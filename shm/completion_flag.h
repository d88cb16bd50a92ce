#pragma once
// Completion flags: cross-process "tensor X of step S is complete" signals in shared memory.
//
// A flag is a 64-bit sequence number on its own 64-byte cache line. The producer writes the
// tensor, then publish(seq) (a release store: everything written before it is visible to a
// consumer whose wait returned ready). The consumer waits for flag >= target:
//   1. sleep the predicted time (clock_nanosleep, e.g. the op's modelled time from the profile),
//   2. spin with the pause instruction for a spin budget,
//   3. sleep in a NON-private futex (FUTEX_WAIT/FUTEX_WAKE without FUTEX_PRIVATE_FLAG, so wakes
//      cross processes; std::atomic::wait uses private futexes and would not), in bounded slices.
// Every wait has a deadline and watches the table's stack epoch: bump_epoch() (the supervisor,
// when a producer died) wakes every sleeper, so no waiter hangs on a dead producer.
//
// The futex word. A futex is 32 bits, the sequence 64: the futex is a separate 32-bit
// `wake_gen` on the flag's line, incremented (and woken) by a producer only when `sleepers` > 0.
// Race-free protocol (all four accesses seq_cst, a Dekker pattern):
//   waiter:   sleepers += 1; g = wake_gen; s = seq; e = epoch;
//             if (s < target && e unchanged) futex_wait(&wake_gen, g, slice); sleepers -= 1
//   producer: seq = v; if (sleepers > 0) { wake_gen += 1; futex_wake(&wake_gen, all) }
// Either the producer sees sleepers > 0 (then wake_gen != g, so futex_wait returns at once or is
// woken), or the waiter's read of seq comes after the store and sees v. wake_gen is read BEFORE
// seq: a waiter that read the new wake_gen necessarily reads the new seq. bump_epoch() follows
// the producer's side for every flag with sleepers. The bounded slice is a second safety net
// (a bumper killed between its two steps).
// Known costs: the predicted sleep is not cut short by an epoch bump (it is one op's predicted
// time, bounded by the deadline); a waiter kill -9'd inside the futex phase leaves `sleepers`
// raised, so that flag's publishes pay a needless futex_wake (~1 us) until it is re-formatted.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace duet::shm {

class Segment;

struct alignas(64) CompletionFlag {
  std::atomic<uint64_t> seq{0};       // the last published sequence number (monotonic)
  std::atomic<uint32_t> wake_gen{0};  // the futex word (see above)
  std::atomic<uint32_t> sleepers{0};  // waiters in (or entering) futex_wait
  uint8_t reserved[48];

  uint64_t load() const { return seq.load(std::memory_order_acquire); }
  // Release-publishes seq (must be >= the current value: invalid_argument otherwise) and wakes
  // futex sleepers, if any. Only the flag's one producer publishes.
  void publish(uint64_t value);
  // Wakes every futex sleeper so it re-checks (used by bump_epoch).
  void wake_all();
};
static_assert(sizeof(CompletionFlag) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "flags are shared between processes: atomics must be lock-free");

// interrupted: the wait's interrupt word (WaitOptions) reached its mark before the flag did.
enum class WaitStatus { ready, timeout, epoch_changed, interrupted };
// How a wait ended: immediate (ready at the first look), sleep (ready right after the predicted
// sleep), spin, futex. For a timeout, an epoch change or an interrupt: the phase it was in.
enum class WaitPath { immediate = 0, sleep = 1, spin = 2, futex = 3 };
inline constexpr int kWaitPaths = 4;

struct WaitOptions {
  std::chrono::steady_clock::time_point deadline;  // required (unset: invalid_argument)
  int64_t predicted_ns = 0;                        // sleep this long first (0: no sleep)
  int64_t spin_budget_ns = 20'000;                 // then spin this long (0: straight to the futex)
  uint64_t expected_epoch = 0;  // epoch the caller works in; 0: the epoch when the wait starts
  int64_t futex_slice_ns = 50'000'000;  // longest single futex sleep (re-checks deadline/epoch)
  // A second way to end the wait: once *interrupt_word >= interrupt_at (e.g. another flag's seq:
  // a preempt request). Checked with the epoch, so the same protocol holds: whoever moves the
  // word must then wake this flag's sleepers (CompletionFlag::wake_all) for a sleeping waiter to
  // see it at once. nullptr: none.
  const std::atomic<uint64_t>* interrupt_word = nullptr;
  uint64_t interrupt_at = 0;
};

struct WaitResult {
  WaitStatus status = WaitStatus::ready;
  WaitPath path = WaitPath::immediate;
  uint64_t seen_seq = 0;  // the flag's value when the wait ended
  int64_t waited_ns = 0;
  uint32_t futex_waits = 0;  // futex_wait calls made
};

// Per-waiter metrics: how waits were satisfied and the time spent, summed.
struct WaitStats {
  uint64_t ready[kWaitPaths] = {};
  int64_t ready_ns[kWaitPaths] = {};
  uint64_t timeouts = 0;
  uint64_t epoch_changes = 0;
  uint64_t interrupts = 0;
  uint64_t futex_waits = 0;
  void add(const WaitResult& r);
  uint64_t waits() const;
};

// A table of flags in a segment (or a region of one), addressed by index:
//   [header: 64 bytes][flag 0][flag 1]...  every flag on its own 64-byte line.
// A non-owning view: the memory must outlive it and be mapped read-write.
class FlagTable {
 public:
  static constexpr uint64_t kMagic = 0x31474C4654455544ull;  // "DUETFLG1" little-endian
  static constexpr uint32_t kVersion = 1;

  static size_t bytes_for(uint32_t n_flags);
  // Writes a fresh header (epoch 1) and zeroed flags. base must be 64-byte aligned.
  static FlagTable format(uint8_t* base, size_t bytes, uint32_t n_flags);
  static FlagTable format(Segment& segment, uint32_t n_flags);
  // Validates magic, version and that the flags fit in bytes (bad_format otherwise).
  static FlagTable attach(uint8_t* base, size_t bytes);
  static FlagTable attach(Segment& segment);
  FlagTable() = default;  // an empty table (size 0) until assigned one of the above

  uint32_t size() const { return n_flags_; }
  CompletionFlag& flag(uint32_t index) const;  // out_of_range past size()
  void publish(uint32_t index, uint64_t seq) const { flag(index).publish(seq); }
  uint64_t load(uint32_t index) const { return flag(index).load(); }

  uint64_t epoch() const;
  // Increments the stack epoch and wakes every sleeping waiter; returns the new epoch.
  uint64_t bump_epoch() const;

  // Waits until flag(index) >= target. Never blocks past options.deadline.
  WaitResult wait(uint32_t index, uint64_t target, const WaitOptions& options) const;

 private:
  struct Header;
  Header& header() const;
  FlagTable(Header* header, CompletionFlag* flags, uint32_t n)
      : header_(header), flags_(flags), n_flags_(n) {}
  Header* header_ = nullptr;
  CompletionFlag* flags_ = nullptr;
  uint32_t n_flags_ = 0;
};

// The waiter on one flag given the epoch word to watch (FlagTable::wait calls it).
WaitResult wait_for_flag(CompletionFlag& flag, const std::atomic<uint64_t>& epoch, uint64_t target,
                         const WaitOptions& options);

}  // namespace duet::shm
