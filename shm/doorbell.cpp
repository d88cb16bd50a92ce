#include "shm/doorbell.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <new>
#include <random>

#include "core/base/error.h"
#include "shm/segment.h"

namespace duet::shm {
namespace {

using Clock = std::chrono::steady_clock;

// Request and report words. Every word is an atomic: a device may read a request while an
// impatient frontend rewrites it (the seqlock below then discards what it read).
enum RequestWord : size_t {
  kReqRing,
  kReqProgram,
  kReqSeq,
  kReqTokensSeqs,  // n_tokens | n_seqs << 32
  kReqTokensOffset,
  kReqTablesOffset,
  kReqColsFirstOp,  // page_table_cols | first_op << 32
  kReqPreemptFlag,
  kReqPreemptToken,
  kReqEpoch,
  kReqDeadline,
  kRequestWords
};
enum ReportWord : size_t {
  kRepRing,
  kRepSeq,
  kRepCode,
  kRepMeasured,
  kRepModeled,
  kRepWait,
  kRepNextOpsRun,  // next_op | ops_run << 32
  kRepPreempted,
  kReportWords
};

uint64_t lo_hi(uint32_t lo, uint32_t hi) {
  return uint64_t{lo} | uint64_t{hi} << 32;
}

}  // namespace

struct DoorbellRegion::Header {
  uint64_t magic;
  uint64_t instance;
  uint32_t n_slots;
  uint8_t reserved[44];
};

struct alignas(64) DoorbellRegion::Slot {
  std::atomic<uint64_t> request[16];
  std::atomic<uint64_t> report[16];
  char message[kMessageBytes];  // written before the report flag, read after it
};
static_assert(kRequestWords <= 16 && kReportWords <= 16);

size_t DoorbellRegion::bytes_for(uint32_t n_slots) {
  static_assert(sizeof(Header) == 64);
  return sizeof(Header) + size_t{n_slots} * sizeof(Slot);
}

DoorbellRegion DoorbellRegion::format(uint8_t* base, size_t bytes, uint32_t n_slots,
                                      uint64_t instance) {
  if (n_slots == 0 || instance == 0)
    throw Error(Errc::invalid_argument, "doorbell region: needs a slot and an instance number");
  check_format_region(base, bytes, 64, bytes_for(n_slots), "doorbell region",
                      std::to_string(n_slots) + " slots");
  auto* header = new (base) Header{};
  header->magic = kMagic;
  header->instance = instance;
  header->n_slots = n_slots;
  auto* slots = reinterpret_cast<Slot*>(base + sizeof(Header));
  for (uint32_t i = 0; i < n_slots; ++i) {
    auto* s = new (&slots[i]) Slot;
    for (auto& w : s->request) w.store(0, std::memory_order_relaxed);
    for (auto& w : s->report) w.store(0, std::memory_order_relaxed);
    std::memset(s->message, 0, sizeof s->message);
  }
  std::atomic_thread_fence(std::memory_order_release);
  return DoorbellRegion(header, slots, n_slots);
}

DoorbellRegion DoorbellRegion::attach(uint8_t* base, size_t bytes, uint64_t instance) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % 64 != 0 || bytes < sizeof(Header))
    throw Error(Errc::bad_format, "doorbell region: unaligned or smaller than its header");
  auto* header = reinterpret_cast<Header*>(base);
  if (header->magic != kMagic)
    throw Error(Errc::bad_format,
                "doorbell region: bad magic (the flags segment has no doorbells)");
  if (header->n_slots == 0 || bytes_for(header->n_slots) > bytes)
    throw Error(Errc::bad_format, "doorbell region: header claims " +
                                      std::to_string(header->n_slots) + " slots, " +
                                      std::to_string(bytes) + " bytes cannot hold them");
  if (header->instance != instance)
    throw Error(Errc::bad_format, "doorbell region: instance " + std::to_string(header->instance) +
                                      ", expected " + std::to_string(instance) +
                                      " (the frontend's engine was replaced)");
  return DoorbellRegion(header, reinterpret_cast<Slot*>(base + sizeof(Header)), header->n_slots);
}

uint64_t DoorbellRegion::instance() const {
  if (!header_) throw Error(Errc::invalid_argument, "doorbell region: not attached");
  return header_->instance;
}

DoorbellRegion::Slot& DoorbellRegion::slot(uint32_t index) const {
  if (index >= n_slots_)
    throw Error(Errc::out_of_range, "doorbell slot " + std::to_string(index) + " past the " +
                                        std::to_string(n_slots_) + " slots");
  return slots_[index];
}

uint64_t new_doorbell_instance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0)
    v = (uint64_t{rd()} << 32) ^ rd() ^
        static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return v;
}

// ---- frontend side ----------------------------------------------------------------------------

DoorbellBell::DoorbellBell(FlagTable table, DoorbellRegion region, DoorbellRef ref)
    : table_(table), region_(region), ref_(ref) {
  region_.slot(ref_.slot);  // out_of_range now rather than at the first ring
  table_.flag(ref_.ring_flag);
  table_.flag(ref_.report_flag);
  last_ring_ = table_.load(ref_.ring_flag);
}

uint64_t DoorbellBell::ring(DoorbellRequest r) {
  if (!valid()) throw Error(Errc::invalid_argument, "doorbell: not attached");
  DoorbellRegion::Slot& s = region_.slot(ref_.slot);
  r.ring = ++last_ring_;
  // Seqlock writer: the ring word goes to 0 first, so a reader copying the words meanwhile sees
  // a ring word that does not match the ring flag and drops its copy.
  s.request[kReqRing].store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  s.request[kReqProgram].store(r.program_id, std::memory_order_relaxed);
  s.request[kReqSeq].store(r.seq, std::memory_order_relaxed);
  s.request[kReqTokensSeqs].store(lo_hi(r.n_tokens, r.n_seqs), std::memory_order_relaxed);
  s.request[kReqTokensOffset].store(r.tokens_offset, std::memory_order_relaxed);
  s.request[kReqTablesOffset].store(r.page_tables_offset, std::memory_order_relaxed);
  s.request[kReqColsFirstOp].store(lo_hi(r.page_table_cols, r.first_op), std::memory_order_relaxed);
  s.request[kReqPreemptFlag].store(static_cast<uint64_t>(static_cast<int64_t>(r.preempt_flag)),
                                   std::memory_order_relaxed);
  s.request[kReqPreemptToken].store(r.preempt_token, std::memory_order_relaxed);
  s.request[kReqEpoch].store(r.epoch, std::memory_order_relaxed);
  s.request[kReqDeadline].store(r.deadline_ms, std::memory_order_relaxed);
  s.request[kReqRing].store(r.ring, std::memory_order_release);
  table_.publish(ref_.ring_flag, r.ring);  // wakes the device if it sleeps in the futex
  return r.ring;
}

std::optional<DoorbellReport> DoorbellBell::report(uint64_t ring) const {
  if (!valid() || table_.load(ref_.report_flag) < ring) return std::nullopt;
  const DoorbellRegion::Slot& s = region_.slot(ref_.slot);
  DoorbellReport r;
  r.ring = s.report[kRepRing].load(std::memory_order_relaxed);
  if (r.ring != ring) return std::nullopt;  // a later ring's report: not ours (cannot happen)
  r.seq = s.report[kRepSeq].load(std::memory_order_relaxed);
  r.code = static_cast<int32_t>(s.report[kRepCode].load(std::memory_order_relaxed));
  r.measured_us = std::bit_cast<double>(s.report[kRepMeasured].load(std::memory_order_relaxed));
  r.modeled_us = std::bit_cast<double>(s.report[kRepModeled].load(std::memory_order_relaxed));
  r.wait_us = std::bit_cast<double>(s.report[kRepWait].load(std::memory_order_relaxed));
  const uint64_t ops = s.report[kRepNextOpsRun].load(std::memory_order_relaxed);
  r.next_op = static_cast<uint32_t>(ops);
  r.ops_run = static_cast<uint32_t>(ops >> 32);
  r.preempted = s.report[kRepPreempted].load(std::memory_order_relaxed) != 0;
  if (r.code != 0)
    r.message.assign(s.message, strnlen(s.message, DoorbellRegion::kMessageBytes - 1));
  return r;
}

std::optional<DoorbellReport> DoorbellBell::wait_report(uint64_t ring, Clock::time_point deadline,
                                                        uint64_t epoch, bool* epoch_changed) const {
  if (epoch_changed) *epoch_changed = false;
  if (!valid()) throw Error(Errc::invalid_argument, "doorbell: not attached");
  WaitOptions o;
  o.deadline = deadline;
  o.expected_epoch = epoch;
  const WaitResult w = table_.wait(ref_.report_flag, ring, o);
  if (w.status == WaitStatus::epoch_changed && epoch_changed) *epoch_changed = true;
  if (w.status != WaitStatus::ready) return std::nullopt;
  return report(ring);
}

// ---- device side ------------------------------------------------------------------------------

DoorbellListener::DoorbellListener(const std::string& flags_segment, DoorbellRef ref,
                                   Handler handler)
    : segment_(Segment::open(flags_segment)), ref_(ref), handler_(std::move(handler)) {
  table_ = FlagTable::attach(segment_);
  table_.flag(ref_.ring_flag);  // out_of_range now, not in the thread
  table_.flag(ref_.report_flag);
  if (ref_.region_offset % 64 != 0 || ref_.region_offset >= segment_.size())
    throw Error(Errc::out_of_range,
                "doorbell: region offset " + std::to_string(ref_.region_offset) + " outside " +
                    flags_segment + " (" + std::to_string(segment_.size()) + " bytes)");
  region_ = DoorbellRegion::attach(segment_.data() + ref_.region_offset,
                                   segment_.size() - ref_.region_offset, ref_.instance);
  region_.slot(ref_.slot);
  // Rings from before this listener existed (a device that restarted) are never served.
  last_ring_ = table_.load(ref_.ring_flag);
  thread_ = std::thread([this] { serve(); });
}

DoorbellListener::~DoorbellListener() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

bool DoorbellListener::read_request(uint64_t ring, DoorbellRequest& r) const {
  const DoorbellRegion::Slot& s = region_.slot(ref_.slot);
  if (s.request[kReqRing].load(std::memory_order_acquire) != ring) return false;
  r.ring = ring;
  r.program_id = static_cast<uint32_t>(s.request[kReqProgram].load(std::memory_order_relaxed));
  r.seq = s.request[kReqSeq].load(std::memory_order_relaxed);
  const uint64_t ts = s.request[kReqTokensSeqs].load(std::memory_order_relaxed);
  r.n_tokens = static_cast<uint32_t>(ts);
  r.n_seqs = static_cast<uint32_t>(ts >> 32);
  r.tokens_offset = s.request[kReqTokensOffset].load(std::memory_order_relaxed);
  r.page_tables_offset = s.request[kReqTablesOffset].load(std::memory_order_relaxed);
  const uint64_t cf = s.request[kReqColsFirstOp].load(std::memory_order_relaxed);
  r.page_table_cols = static_cast<uint32_t>(cf);
  r.first_op = static_cast<uint32_t>(cf >> 32);
  r.preempt_flag = static_cast<int32_t>(
      static_cast<int64_t>(s.request[kReqPreemptFlag].load(std::memory_order_relaxed)));
  r.preempt_token = s.request[kReqPreemptToken].load(std::memory_order_relaxed);
  r.epoch = s.request[kReqEpoch].load(std::memory_order_relaxed);
  r.deadline_ms = static_cast<uint32_t>(s.request[kReqDeadline].load(std::memory_order_relaxed));
  // Seqlock reader: the copy is good only if nobody started rewriting the words meanwhile.
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.request[kReqRing].load(std::memory_order_relaxed) == ring &&
         table_.load(ref_.ring_flag) == ring;
}

void DoorbellListener::write_report(const DoorbellReport& r) const {
  DoorbellRegion::Slot& s = region_.slot(ref_.slot);
  if (r.code != 0) {
    const size_t n = std::min(r.message.size(), DoorbellRegion::kMessageBytes - 1);
    std::memcpy(s.message, r.message.data(), n);
    s.message[n] = '\0';
  }
  s.report[kRepRing].store(r.ring, std::memory_order_relaxed);
  s.report[kRepSeq].store(r.seq, std::memory_order_relaxed);
  s.report[kRepCode].store(static_cast<uint64_t>(static_cast<int64_t>(r.code)),
                           std::memory_order_relaxed);
  s.report[kRepMeasured].store(std::bit_cast<uint64_t>(r.measured_us), std::memory_order_relaxed);
  s.report[kRepModeled].store(std::bit_cast<uint64_t>(r.modeled_us), std::memory_order_relaxed);
  s.report[kRepWait].store(std::bit_cast<uint64_t>(r.wait_us), std::memory_order_relaxed);
  s.report[kRepNextOpsRun].store(lo_hi(r.next_op, r.ops_run), std::memory_order_relaxed);
  s.report[kRepPreempted].store(r.preempted ? 1 : 0, std::memory_order_relaxed);
  // The report flag's publish is a seq_cst store: it orders every word above before it.
  table_.publish(ref_.report_flag, r.ring);
}

void DoorbellListener::serve() {
  int idle_slices = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    WaitOptions o;
    o.deadline = Clock::now() + std::chrono::milliseconds(kIdleSliceMs);
    o.spin_budget_ns = kIdleSpinNs;
    o.expected_epoch = table_.epoch();  // an epoch change only ends this slice early
    const WaitResult w = table_.wait(ref_.ring_flag, last_ring_ + 1, o);
    if (w.status != WaitStatus::ready) {
      // The segment's owner (the engine) removes it when it goes: nobody can ring any more, so
      // the thread ends instead of waking every slice for as long as the service lives.
      if (++idle_slices % kOrphanCheckSlices == 0 &&
          segment_identity(segment_.name()) != segment_.identity()) {
        orphaned_.store(true, std::memory_order_release);
        return;
      }
      continue;
    }
    idle_slices = 0;
    const uint64_t ring = table_.load(ref_.ring_flag);  // the newest: older ones were given up
    DoorbellRequest request;
    if (!read_request(ring, request)) continue;  // rewritten meanwhile: look again
    last_ring_ = ring;
    Deferred publish_after;
    DoorbellReport report;
    try {
      report = handler_(request, publish_after);
    } catch (const Error& e) {
      report = DoorbellReport{};
      report.code = static_cast<int32_t>(e.code());
      report.message = e.what();
    } catch (const std::exception& e) {
      report = DoorbellReport{};
      report.code = static_cast<int32_t>(Errc::internal);
      report.message = e.what();
    }
    report.ring = ring;
    report.seq = request.seq;
    served_.fetch_add(1, std::memory_order_relaxed);  // before the report: whoever read it sees it
    write_report(report);
    for (const auto& [flag, seq] : publish_after) {
      try {
        table_.publish(flag, seq);
      } catch (const Error&) {
        // A flag outside the table or moved past seq: the waiter's deadline covers it.
      }
    }
  }
}

}  // namespace duet::shm
