#include "shm/completion_flag.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <string>

#include "core/base/error.h"
#include "shm/segment.h"

namespace duet::shm {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux, as clock_nanosleep below

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

timespec to_timespec(int64_t ns) {
  timespec ts{};
  ts.tv_sec = ns / 1'000'000'000;
  ts.tv_nsec = ns % 1'000'000'000;
  return ts;
}

uint32_t* futex_word(std::atomic<uint32_t>& word) {
  return reinterpret_cast<uint32_t*>(&word);
}

// Shared (non-private) futex: the key is the mapping's page, so it works across processes.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, int64_t timeout_ns) {
  timespec ts = to_timespec(std::max<int64_t>(timeout_ns, 0));
  // EAGAIN (value changed), ETIMEDOUT and EINTR all mean "look again"; the caller re-checks.
  syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void sleep_until(Clock::time_point until) {
  timespec ts = to_timespec(
      std::chrono::duration_cast<std::chrono::nanoseconds>(until.time_since_epoch()).count());
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr) == EINTR) {
  }
}

}  // namespace

void CompletionFlag::publish(uint64_t value) {
  uint64_t current = seq.load(std::memory_order_relaxed);  // the one producer's own value
  if (value < current) {
    throw Error(Errc::invalid_argument, "completion flag: publish(" + std::to_string(value) +
                                            ") would move it back from " + std::to_string(current));
  }
  // seq_cst, not just release: the store must be ordered before the load of `sleepers`
  // (see the protocol in the header).
  seq.store(value, std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_seq_cst) > 0) wake_all();
}

void CompletionFlag::wake_all() {
  wake_gen.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(wake_gen);
}

void WaitStats::add(const WaitResult& r) {
  futex_waits += r.futex_waits;
  switch (r.status) {
    case WaitStatus::ready:
      ready[static_cast<int>(r.path)] += 1;
      ready_ns[static_cast<int>(r.path)] += r.waited_ns;
      break;
    case WaitStatus::timeout:
      timeouts += 1;
      break;
    case WaitStatus::epoch_changed:
      epoch_changes += 1;
      break;
    case WaitStatus::interrupted:
      interrupts += 1;
      break;
  }
}

uint64_t WaitStats::waits() const {
  uint64_t n = timeouts + epoch_changes + interrupts;
  for (uint64_t c : ready) n += c;
  return n;
}

WaitResult wait_for_flag(CompletionFlag& flag, const std::atomic<uint64_t>& epoch, uint64_t target,
                         const WaitOptions& options) {
  if (options.deadline == Clock::time_point{}) {
    throw Error(Errc::invalid_argument, "completion flag wait: WaitOptions.deadline is not set");
  }
  const Clock::time_point start = Clock::now();
  const uint64_t epoch0 =
      options.expected_epoch != 0 ? options.expected_epoch : epoch.load(std::memory_order_acquire);
  WaitResult result;
  auto finish = [&](WaitStatus status, WaitPath path) {
    result.status = status;
    result.path = path;
    result.seen_seq = flag.load();
    result.waited_ns = ns_between(start, Clock::now());
    return result;
  };
  auto epoch_moved = [&] { return epoch.load(std::memory_order_acquire) != epoch0; };
  auto interrupted = [&] {
    return options.interrupt_word &&
           options.interrupt_word->load(std::memory_order_seq_cst) >= options.interrupt_at;
  };

  // A complete tensor is complete even if its producer has died since: ready wins.
  if (flag.load() >= target) return finish(WaitStatus::ready, WaitPath::immediate);
  if (epoch_moved()) return finish(WaitStatus::epoch_changed, WaitPath::immediate);
  if (interrupted()) return finish(WaitStatus::interrupted, WaitPath::immediate);
  if (start >= options.deadline) return finish(WaitStatus::timeout, WaitPath::immediate);

  if (options.predicted_ns > 0) {
    sleep_until(std::min(start + std::chrono::nanoseconds(options.predicted_ns), options.deadline));
    if (flag.load() >= target) return finish(WaitStatus::ready, WaitPath::sleep);
    if (epoch_moved()) return finish(WaitStatus::epoch_changed, WaitPath::sleep);
    if (interrupted()) return finish(WaitStatus::interrupted, WaitPath::sleep);
    if (Clock::now() >= options.deadline) return finish(WaitStatus::timeout, WaitPath::sleep);
  }

  if (options.spin_budget_ns > 0) {
    const Clock::time_point spin_end =
        std::min(Clock::now() + std::chrono::nanoseconds(options.spin_budget_ns), options.deadline);
    for (uint32_t i = 1;; ++i) {
      if (flag.load() >= target) return finish(WaitStatus::ready, WaitPath::spin);
      if ((i & 63) == 0) {  // the clock and the epoch's line are looked at every 64 spins
        if (epoch_moved()) return finish(WaitStatus::epoch_changed, WaitPath::spin);
        if (interrupted()) return finish(WaitStatus::interrupted, WaitPath::spin);
        if (Clock::now() >= spin_end) break;
      }
      cpu_pause();
    }
    if (Clock::now() >= options.deadline) return finish(WaitStatus::timeout, WaitPath::spin);
  }

  const int64_t slice_ns = std::max<int64_t>(options.futex_slice_ns, 1000);
  for (;;) {
    flag.sleepers.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t gen = flag.wake_gen.load(std::memory_order_seq_cst);  // before seq: see header
    const bool done = flag.seq.load(std::memory_order_seq_cst) >= target;
    const bool moved = epoch.load(std::memory_order_seq_cst) != epoch0;
    const bool stop = interrupted();
    const int64_t left_ns = ns_between(Clock::now(), options.deadline);
    if (!done && !moved && !stop && left_ns > 0) {
      result.futex_waits += 1;
      futex_wait(flag.wake_gen, gen, std::min(left_ns, slice_ns));
      flag.sleepers.fetch_sub(1, std::memory_order_seq_cst);
      continue;
    }
    flag.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (done) return finish(WaitStatus::ready, WaitPath::futex);
    if (moved) return finish(WaitStatus::epoch_changed, WaitPath::futex);
    if (stop) return finish(WaitStatus::interrupted, WaitPath::futex);
    return finish(WaitStatus::timeout, WaitPath::futex);
  }
}

// The header is one cache line; the epoch is read by spinning waiters, written only on a bump.
struct FlagTable::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t n_flags;
  std::atomic<uint64_t> epoch;
  uint8_t reserved[40];
};

size_t FlagTable::bytes_for(uint32_t n_flags) {
  static_assert(sizeof(Header) == 64);
  return sizeof(Header) + size_t{n_flags} * sizeof(CompletionFlag);
}

FlagTable FlagTable::format(uint8_t* base, size_t bytes, uint32_t n_flags) {
  if (n_flags == 0) throw Error(Errc::invalid_argument, "flag table: needs at least one flag");
  check_format_region(base, bytes, 64, bytes_for(n_flags), "flag table",
                      std::to_string(n_flags) + " flags");
  auto* header = new (base) Header{};
  header->magic = kMagic;
  header->version = kVersion;
  header->n_flags = n_flags;
  header->epoch.store(1, std::memory_order_relaxed);
  auto* flags = reinterpret_cast<CompletionFlag*>(base + sizeof(Header));
  for (uint32_t i = 0; i < n_flags; ++i) new (&flags[i]) CompletionFlag{};
  std::atomic_thread_fence(std::memory_order_release);
  return FlagTable(header, flags, n_flags);
}

FlagTable FlagTable::format(Segment& segment, uint32_t n_flags) {
  return format(segment.data(), segment.size(), n_flags);
}

FlagTable FlagTable::attach(uint8_t* base, size_t bytes) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 64 != 0 || bytes < sizeof(Header)) {
    throw Error(Errc::bad_format, "flag table: region is unaligned or smaller than its header");
  }
  auto* header = reinterpret_cast<Header*>(base);
  if (header->magic != kMagic) {
    throw Error(Errc::bad_format, "flag table: bad magic (not a flag table, or not formatted yet)");
  }
  if (header->version != kVersion) {
    throw Error(Errc::bad_format, "flag table: version " + std::to_string(header->version) +
                                      ", this build reads " + std::to_string(kVersion));
  }
  if (header->n_flags == 0 || bytes_for(header->n_flags) > bytes) {
    throw Error(Errc::bad_format, "flag table: header claims " + std::to_string(header->n_flags) +
                                      " flags, region of " + std::to_string(bytes) +
                                      " bytes cannot hold them");
  }
  return FlagTable(header, reinterpret_cast<CompletionFlag*>(base + sizeof(Header)),
                   header->n_flags);
}

FlagTable FlagTable::attach(Segment& segment) {
  if (!segment.writable()) {
    throw Error(Errc::invalid_argument,
                "flag table: segment " + segment.name() + " must be mapped read-write");
  }
  return attach(segment.data(), segment.size());
}

CompletionFlag& FlagTable::flag(uint32_t index) const {
  if (index >= n_flags_) {
    throw Error(Errc::out_of_range, "flag index " + std::to_string(index) + " past the table's " +
                                        std::to_string(n_flags_) + " flags");
  }
  return flags_[index];
}

FlagTable::Header& FlagTable::header() const {
  if (header_ == nullptr) throw Error(Errc::invalid_argument, "flag table: not attached");
  return *header_;
}

uint64_t FlagTable::epoch() const {
  return header().epoch.load(std::memory_order_acquire);
}

uint64_t FlagTable::bump_epoch() const {
  uint64_t next = header().epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
  for (uint32_t i = 0; i < n_flags_; ++i) {
    if (flags_[i].sleepers.load(std::memory_order_seq_cst) > 0) flags_[i].wake_all();
  }
  return next;
}

WaitResult FlagTable::wait(uint32_t index, uint64_t target, const WaitOptions& options) const {
  CompletionFlag& f = flag(index);
  return wait_for_flag(f, header().epoch, target, options);
}

}  // namespace duet::shm
