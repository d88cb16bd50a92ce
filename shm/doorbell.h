#pragma once
// Step doorbells: how the frontend starts a step on a device service and reads the step's report
// through shared memory (issue 7, stack overhead).
//
// Why not the RunStep/StepDone messages: a ZeroMQ message crosses the sender's I/O thread, the
// receiver's I/O thread and the receiver's loop, each a thread wake-up; a step cost ~6 wake-ups
// (~1.9 ms on 2 loaded cores, more than a tiny model's whole step) where the in-process mode
// pays 2. A doorbell is one futex wake each way. It keeps ARCHITECTURE.md's two planes: a
// doorbell is completion flags plus the fixed-size words they guard, in the stack's flags
// segment (the data plane, like every other completion flag); programs, registration, status,
// profiling and everything else stay flatbuffers over ZeroMQ (the control plane).
//
// Layout. The engine's flags segment holds its FlagTable, then a doorbell region:
//   [FlagTable][region header: magic, instance, slots][slot 0][slot 1]...
// A slot belongs to one device. Two flags of the table belong to it: the ring flag (the
// frontend publishes the ring number after writing the request words) and the report flag (the
// device publishes the ring number after writing the report words). Both are ordinary
// completion flags, so every wait on them has a deadline and watches the stack epoch.
//
// Rules.
// - One ring in flight per slot: the frontend rings again only once it read the report or gave
//   the step up. A device that is still reading an abandoned request sees the newer ring
//   (seqlock on the request words) and serves the newest.
// - A request carries the epoch it was rung under; the device refuses one from an older epoch
//   (shm::epoch_for_step). A listener starts after the last ring it finds: a device that
//   (re)starts never runs a step rung before it existed.
// - The device writes the report and publishes the report flag BEFORE publishing its last op's
//   flag (the step's done flag, when no op of the other device waits on it: DoorbellRef's
//   hold_flag in the program), so a frontend woken by the done flag reads the report at once.
// - The region carries an instance number (random, per engine): a device attached to an engine
//   that has since been replaced (same segment name, new segment) is told apart.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "shm/completion_flag.h"
#include "shm/segment.h"

namespace duet::shm {

// Where one device's doorbell is (sent to the device in its programs).
struct DoorbellRef {
  uint32_t ring_flag = 0;      // index in the flags segment's FlagTable
  uint32_t report_flag = 0;    // index in the flags segment's FlagTable
  uint64_t region_offset = 0;  // bytes from the flags segment's start to the doorbell region
  uint32_t slot = 0;
  uint64_t instance = 0;  // the region's instance number
};

// What RunStep carries.
struct DoorbellRequest {
  uint64_t ring = 0;  // set by ring()
  uint32_t program_id = 0;
  uint64_t seq = 0;
  uint32_t n_tokens = 0;
  uint32_t n_seqs = 1;
  uint64_t tokens_offset = 0;
  uint64_t page_tables_offset = 0;
  uint32_t page_table_cols = 0;
  uint32_t first_op = 0;
  int32_t preempt_flag = -1;
  uint64_t preempt_token = 0;
  uint64_t epoch = 0;
  uint32_t deadline_ms = 0;
};

// What StepDone / StepFailed carry that the frontend reads.
struct DoorbellReport {
  uint64_t ring = 0;
  uint64_t seq = 0;
  int32_t code = 0;  // duet::Errc; 0: the step ran
  double measured_us = 0;
  double modeled_us = 0;
  double wait_us = 0;
  uint32_t next_op = 0;
  uint32_t ops_run = 0;
  bool preempted = false;
  std::string message;  // why it failed (truncated to kMessageBytes - 1)
};

class DoorbellRegion {
 public:
  static constexpr uint64_t kMagic = 0x31444C4254455544ull;  // "DUETBLD1" little-endian
  static constexpr size_t kMessageBytes = 256;
  struct Slot;

  static size_t bytes_for(uint32_t n_slots);
  // Writes a fresh header and zeroed slots. base must be 64-byte aligned.
  static DoorbellRegion format(uint8_t* base, size_t bytes, uint32_t n_slots, uint64_t instance);
  // Validates magic, size and the instance (bad_format when it is another engine's region).
  static DoorbellRegion attach(uint8_t* base, size_t bytes, uint64_t instance);
  DoorbellRegion() = default;

  uint32_t slots() const { return n_slots_; }
  uint64_t instance() const;
  Slot& slot(uint32_t index) const;  // out_of_range past slots()

 private:
  struct Header;
  DoorbellRegion(Header* header, Slot* slots, uint32_t n)
      : header_(header), slots_(slots), n_slots_(n) {}
  Header* header_ = nullptr;
  Slot* slots_ = nullptr;
  uint32_t n_slots_ = 0;
};

// A random instance number for a new region (never 0).
uint64_t new_doorbell_instance();

// The frontend's end of one slot: rings and reads reports. A non-owning view: the table and the
// region's memory must outlive it.
class DoorbellBell {
 public:
  DoorbellBell() = default;
  DoorbellBell(FlagTable table, DoorbellRegion region, DoorbellRef ref);

  bool valid() const { return region_.slots() > 0; }
  const DoorbellRef& ref() const { return ref_; }
  uint64_t epoch() const { return table_.epoch(); }  // the stack epoch of the flags segment
  // Writes the request and publishes the ring flag; returns the ring number.
  uint64_t ring(DoorbellRequest request);
  // Without blocking: the report of `ring`, once the device published it.
  std::optional<DoorbellReport> report(uint64_t ring) const;
  // Waits for the report of `ring` until the deadline, or until the stack epoch moves past
  // `epoch` (0: the current one). nullopt: no report; `epoch_changed` says why.
  std::optional<DoorbellReport> wait_report(uint64_t ring,
                                            std::chrono::steady_clock::time_point deadline,
                                            uint64_t epoch, bool* epoch_changed = nullptr) const;

 private:
  FlagTable table_;
  DoorbellRegion region_;
  DoorbellRef ref_;
  uint64_t last_ring_ = 0;
};

// The device's end of one slot: a thread that waits for rings and runs each request with the
// handler. It maps the flags segment itself, so it lives as long as the listener.
class DoorbellListener {
 public:
  // Flags the handler asks the listener to publish after the report (the step's done flag).
  using Deferred = std::vector<std::pair<uint32_t, uint64_t>>;
  // Runs one request and returns its report (must not throw: an exception becomes a report with
  // Errc::internal). It may add flags to publish once the report is written.
  using Handler = std::function<DoorbellReport(const DoorbellRequest&, Deferred& publish_after)>;

  // Opens `flags_segment`, checks the region against `ref` (bad_format: another engine's region;
  // out_of_range: flags or slot outside it) and starts serving rings after the current one.
  DoorbellListener(const std::string& flags_segment, DoorbellRef ref, Handler handler);
  ~DoorbellListener();  // stops the thread (after the request it runs, if any)
  // Asks the thread to stop without waiting for it: a service closing several listeners asks
  // them all first, so their idle slices run out together instead of one after another.
  void request_stop() { stop_.store(true, std::memory_order_release); }
  DoorbellListener(const DoorbellListener&) = delete;
  DoorbellListener& operator=(const DoorbellListener&) = delete;

  uint64_t instance() const { return ref_.instance; }
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }
  // The engine that rang this doorbell is gone: its flags segment was removed (or made anew by a
  // restarted frontend). The thread has then ended by itself; the object only waits to be
  // destroyed (DoorbellListeners drops such listeners at the next attach).
  bool orphaned() const { return orphaned_.load(std::memory_order_acquire); }

  // How long an idle listener spins after a step before sleeping in the futex: the next decode
  // step usually rings within the frontend's sampling time.
  static constexpr int64_t kIdleSpinNs = 30'000;
  // Longest single wait of the idle loop (it re-checks the stop request in between).
  static constexpr int64_t kIdleSliceMs = 50;
  // Idle slices between two checks that the flags segment is still the engine's (one shm_open
  // and fstat: cheap, but not worth doing every slice).
  static constexpr int kOrphanCheckSlices = 20;

 private:
  void serve();
  bool read_request(uint64_t ring, DoorbellRequest& out) const;
  void write_report(const DoorbellReport& report) const;

  Segment segment_;
  FlagTable table_;
  DoorbellRegion region_;
  DoorbellRef ref_;
  Handler handler_;
  uint64_t last_ring_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> orphaned_{false};
  std::atomic<uint64_t> served_{0};
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace duet::shm
