#include "services/frontend/request_journal.h"

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "core/base/error.h"
#include "services/frontend/request.h"

namespace duet::frontend {

namespace {

struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t n_slots;
  uint64_t slot_bytes;
  uint32_t max_ids;
  uint32_t static_bytes;
  uint8_t reserved[32];
};
static_assert(sizeof(Header) == 64);

constexpr uint64_t kCopiesBytes = 256;  // two 128-byte copies

uint32_t crc(const void* p, size_t n, uint32_t seed = 0) {
  return static_cast<uint32_t>(
      crc32(seed, static_cast<const Bytef*>(p), static_cast<uInt>(n)));  // zlib
}

const char* const kReasons[] = {"", "eos", "length", "stop", "cancelled"};

uint32_t reason_code(std::string_view reason) {
  for (uint32_t i = 1; i < std::size(kReasons); ++i)
    if (reason == kReasons[i]) return i;
  return 0;
}

uint64_t unix_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

// The static area: fixed fields, then length-prefixed routing frames and stop strings.
class BlobWriter {
 public:
  void put(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
  }
  template <class T>
  void num(T v) {
    put(&v, sizeof v);
  }
  void str(const std::string& s) {
    num<uint16_t>(static_cast<uint16_t>(s.size()));
    put(s.data(), s.size());
  }
  std::vector<uint8_t> bytes;
};

class BlobReader {
 public:
  BlobReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  template <class T>
  T num() {
    T v{};
    take(&v, sizeof v);
    return v;
  }
  std::string str() {
    const uint16_t len = num<uint16_t>();
    std::string s(len, '\0');
    take(s.data(), len);
    return s;
  }

 private:
  void take(void* out, size_t n) {
    if (n > n_ - at_) throw Error(Errc::bad_format, "journal: static area ends early");
    std::memcpy(out, p_ + at_, n);
    at_ += n;
  }
  const uint8_t* p_;
  size_t n_, at_ = 0;
};

std::vector<uint8_t> static_blob(const JournalRecord& r) {
  BlobWriter w;
  w.num(r.client_request_id);
  w.num(r.seq_id);
  w.num(r.priority);
  w.num<uint8_t>(r.stream);
  w.num<uint8_t>(r.ignore_eos);
  w.num(r.logprobs);
  w.num(r.max_tokens);
  w.num(r.max_positions);
  w.num(r.heartbeat_ms);
  w.num(r.sampling.temperature);
  w.num(r.sampling.top_k);
  w.num(r.sampling.top_p);
  w.num(r.sampling.seed);
  w.num<uint16_t>(static_cast<uint16_t>(r.routing.size()));
  for (const auto& f : r.routing) w.str(f);
  w.num<uint16_t>(static_cast<uint16_t>(r.stop.size()));
  for (const auto& s : r.stop) w.str(s);
  return std::move(w.bytes);
}

void read_static(const uint8_t* p, size_t n, JournalRecord& r) {
  BlobReader rd(p, n);
  r.client_request_id = rd.num<uint64_t>();
  r.seq_id = rd.num<uint64_t>();
  r.priority = rd.num<uint8_t>();
  r.stream = rd.num<uint8_t>() != 0;
  r.ignore_eos = rd.num<uint8_t>() != 0;
  r.logprobs = rd.num<int8_t>();
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs)
    throw Error(Errc::bad_format, "journal: logprobs " + std::to_string(r.logprobs));
  r.max_tokens = rd.num<int32_t>();
  r.max_positions = rd.num<int32_t>();
  r.heartbeat_ms = rd.num<uint32_t>();
  r.sampling.temperature = rd.num<float>();
  r.sampling.top_k = rd.num<int32_t>();
  r.sampling.top_p = rd.num<float>();
  r.sampling.seed = rd.num<uint64_t>();
  const uint16_t n_routing = rd.num<uint16_t>();
  for (uint16_t i = 0; i < n_routing; ++i) r.routing.push_back(rd.str());
  const uint16_t n_stop = rd.num<uint16_t>();
  for (uint16_t i = 0; i < n_stop; ++i) r.stop.push_back(rd.str());
  r.sampling.validate();
}

}  // namespace

struct RequestJournal::Copy {
  uint64_t commit;  // through std::atomic_ref: 0 = not valid, stored last
  uint32_t state, n_prompt, n_generated, n_prefilled;
  int32_t pos, next_token;
  uint32_t has_next, finish;
  uint64_t draws, finished_unix_ms;
  uint32_t static_len, static_crc, ids_crc, copy_crc;
  uint8_t pad[56];
  uint32_t self_crc() const {
    return crc(reinterpret_cast<const uint8_t*>(this) + 8, offsetof(Copy, copy_crc) - 8);
  }
};

uint32_t RequestJournal::static_bytes_for(size_t n_stop, size_t stop_bytes) {
  const size_t fixed = 64 + 2 + kMaxRoutingBytes + 8 /* frame lengths */ + 2;
  const size_t bytes = fixed + n_stop * (2 + stop_bytes);
  return static_cast<uint32_t>((bytes + 63) / 64 * 64);
}

uint64_t RequestJournal::bytes_for(const Geometry& g) {
  const uint64_t slot = (kCopiesBytes + g.static_bytes + uint64_t{g.max_ids} * 4 + 63) / 64 * 64;
  return sizeof(Header) + slot * g.n_slots;
}

std::string RequestJournal::segment_name_for(const std::string& stack_id, uint32_t model_index) {
  return shm::segment_name(stack_id, model_index == 0 ? std::string("journal")
                                                      : "journal_m" + std::to_string(model_index));
}

std::unique_ptr<RequestJournal> RequestJournal::open_or_create(const std::string& stack_id,
                                                               Geometry g, uint32_t model_index) {
  const std::string name = segment_name_for(stack_id, model_index);
  try {
    shm::Segment seg = shm::Segment::open(name);
    try {
      auto j = std::make_unique<RequestJournal>(seg.data(), seg.size(), g, false);
      j->segment_ = std::move(seg);
      return j;
    } catch (const Error&) {
      seg.unlink();  // another geometry, or not a journal: what it held cannot be read
    }
  } catch (const Error& e) {
    if (e.code() != Errc::not_found) throw;
  }
  shm::Segment seg = shm::Segment::create(name, bytes_for(g));
  auto j = std::make_unique<RequestJournal>(seg.data(), seg.size(), g, true);
  j->segment_ = std::move(seg);
  return j;
}

RequestJournal::RequestJournal(uint8_t* base, uint64_t bytes, Geometry g, bool format)
    : base_(base), bytes_(bytes), g_(g) {
  static_assert(sizeof(Copy) == 128 && std::is_standard_layout_v<Copy>);
  if (g.n_slots == 0 || g.n_slots > kMaxSlots || g.max_ids == 0 || g.static_bytes % 64 != 0)
    throw Error(Errc::invalid_argument, "journal: geometry of " + std::to_string(g.n_slots) +
                                            " slots of " + std::to_string(g.max_ids) + " ids");
  slot_bytes_ = (kCopiesBytes + g.static_bytes + uint64_t{g.max_ids} * 4 + 63) / 64 * 64;
  if (bytes < bytes_for(g))
    throw Error(Errc::out_of_range, "journal: " + std::to_string(bytes) +
                                        " bytes, its geometry "
                                        "needs " +
                                        std::to_string(bytes_for(g)));
  auto* h = reinterpret_cast<Header*>(base_);
  if (format) {
    std::memset(base_, 0, bytes_for(g));
    h->magic = kMagic;
    h->version = kVersion;
    h->n_slots = g.n_slots;
    h->slot_bytes = slot_bytes_;
    h->max_ids = g.max_ids;
    h->static_bytes = g.static_bytes;
    std::atomic_thread_fence(std::memory_order_release);
  } else if (h->magic != kMagic || h->version != kVersion || h->n_slots != g.n_slots ||
             h->slot_bytes != slot_bytes_ || h->max_ids != g.max_ids ||
             h->static_bytes != g.static_bytes) {
    throw Error(Errc::bad_format, "journal: the segment's header is not this geometry's journal");
  }
  slots_.resize(g.n_slots);
}

uint8_t* RequestJournal::slot_base(uint32_t slot) const {
  return base_ + sizeof(Header) + uint64_t{slot} * slot_bytes_;
}
RequestJournal::Copy* RequestJournal::copy(uint32_t slot, int which) const {
  return reinterpret_cast<Copy*>(slot_base(slot) + 128 * which);
}
uint8_t* RequestJournal::static_area(uint32_t slot) const {
  return slot_base(slot) + kCopiesBytes;
}
int32_t* RequestJournal::ids(uint32_t slot) const {
  return reinterpret_cast<int32_t*>(static_area(slot) + g_.static_bytes);
}

std::optional<JournalRecord> RequestJournal::read_slot(uint32_t slot, int* newest) const {
  int best = -1;
  uint64_t best_commit = 0;
  for (int w = 0; w < 2; ++w) {
    const Copy* c = copy(slot, w);
    const uint64_t commit =
        std::atomic_ref<uint64_t>(const_cast<Copy*>(c)->commit).load(std::memory_order_acquire);
    if (commit == 0 || commit <= best_commit) continue;
    const bool sane = c->copy_crc == c->self_crc() &&
                      (c->state == uint32_t(JournalRecord::State::live) ||
                       c->state == uint32_t(JournalRecord::State::finished)) &&
                      c->n_prompt > 0 && uint64_t{c->n_prompt} + c->n_generated <= g_.max_ids &&
                      c->static_len <= g_.static_bytes && c->n_prefilled <= c->n_prompt &&
                      c->pos >= 0 && c->finish < std::size(kReasons) &&
                      c->static_crc == crc(static_area(slot), c->static_len) &&
                      c->ids_crc == crc(ids(slot), (size_t{c->n_prompt} + c->n_generated) * 4);
    if (!sane) continue;
    best = w;
    best_commit = commit;
  }
  if (best < 0) return std::nullopt;
  const Copy* c = copy(slot, best);
  JournalRecord r;
  try {
    read_static(static_area(slot), c->static_len, r);
  } catch (const Error&) {
    return std::nullopt;
  }
  r.slot = slot;
  r.state = static_cast<JournalRecord::State>(c->state);
  r.prompt.assign(ids(slot), ids(slot) + c->n_prompt);
  r.generated.assign(ids(slot) + c->n_prompt, ids(slot) + c->n_prompt + c->n_generated);
  r.n_prefilled = c->n_prefilled;
  r.pos = c->pos;
  if (c->has_next) r.next_token = c->next_token;
  r.draws = c->draws;
  r.finish_reason = kReasons[c->finish];
  r.finished_unix_ms = c->finished_unix_ms;
  *newest = best;
  return r;
}

std::vector<JournalRecord> RequestJournal::recover() {
  std::vector<JournalRecord> out;
  uint64_t max_commit = 0;
  for (uint32_t s = 0; s < g_.n_slots; ++s)
    for (int w = 0; w < 2; ++w) max_commit = std::max(max_commit, copy(s, w)->commit);
  commit_seq_ = max_commit;
  for (uint32_t s = 0; s < g_.n_slots; ++s) {
    int newest = -1;
    std::optional<JournalRecord> r = read_slot(s, &newest);
    if (r) {
      out.push_back(std::move(*r));
    } else {
      free(s);  // never written, freed, or half-written: nothing in it is trusted
    }
  }
  return out;
}

void RequestJournal::adopt(const JournalRecord& r) {
  int newest = -1;
  const std::optional<JournalRecord> check = read_slot(r.slot, &newest);
  if (!check || check->client_request_id != r.client_request_id)
    throw Error(Errc::invalid_argument,
                "journal: slot " + std::to_string(r.slot) + " does not hold that record");
  SlotState& st = slots_[r.slot];
  const Copy* c = copy(r.slot, newest);
  st.state = r.state;
  st.n_prompt = c->n_prompt;
  st.n_ids = c->n_prompt + c->n_generated;
  st.ids_crc = c->ids_crc;
  st.static_bytes = c->static_len;
  st.static_crc = c->static_crc;
  st.newest = newest;
  st.order = c->commit;
}

std::optional<uint32_t> RequestJournal::begin(const JournalRecord& r) {
  const std::vector<uint8_t> blob = static_blob(r);
  size_t routing_bytes = 0;
  for (const auto& f : r.routing) routing_bytes += f.size();
  if (blob.size() > g_.static_bytes || routing_bytes > kMaxRoutingBytes || r.prompt.empty() ||
      r.prompt.size() + size_t(std::max(0, r.max_tokens)) > g_.max_ids)
    return std::nullopt;
  std::optional<uint32_t> pick;
  for (uint32_t s = 0; s < g_.n_slots && !pick; ++s)
    if (slots_[s].state == JournalRecord::State::free) pick = s;
  if (!pick) {
    uint64_t oldest = UINT64_MAX;
    for (uint32_t s = 0; s < g_.n_slots; ++s)
      if (slots_[s].state == JournalRecord::State::finished && slots_[s].order < oldest) {
        oldest = slots_[s].order;
        pick = s;
      }
  }
  if (!pick) return std::nullopt;
  const uint32_t s = *pick;
  free(s);  // both copies invalid before the static area and ids change under them
  std::memcpy(static_area(s), blob.data(), blob.size());
  std::memcpy(ids(s), r.prompt.data(), r.prompt.size() * 4);
  SlotState& st = slots_[s];
  st.n_prompt = st.n_ids = static_cast<uint32_t>(r.prompt.size());
  st.ids_crc = crc(r.prompt.data(), r.prompt.size() * 4);
  st.static_bytes = static_cast<uint32_t>(blob.size());
  st.static_crc = crc(blob.data(), blob.size());
  st.newest = -1;
  write_copy(s, JournalProgress{}, JournalRecord::State::live);
  st.order = commit_seq_;
  return s;
}

void RequestJournal::update(uint32_t slot, const JournalProgress& r) {
  SlotState& st = slots_.at(slot);
  if (st.state == JournalRecord::State::free)
    throw Error(Errc::invalid_argument, "journal: update of free slot " + std::to_string(slot));
  const size_t n_ids = st.n_prompt + r.generated.size();
  if (n_ids < st.n_ids || n_ids > g_.max_ids)
    throw Error(Errc::out_of_range, "journal: slot " + std::to_string(slot) + " holds " +
                                        std::to_string(st.n_ids) + " ids, the update has " +
                                        std::to_string(n_ids) + " (at most " +
                                        std::to_string(g_.max_ids) + ")");
  // The new ids go past every copy's count: no valid copy covers them until the commit.
  const size_t from = st.n_ids - st.n_prompt;
  if (n_ids > st.n_ids) {
    std::memcpy(ids(slot) + st.n_ids, r.generated.data() + from, (n_ids - st.n_ids) * 4);
    st.ids_crc = crc(r.generated.data() + from, (n_ids - st.n_ids) * 4, st.ids_crc);
    st.n_ids = static_cast<uint32_t>(n_ids);
  }
  write_copy(slot, r,
             r.finish_reason.empty() ? JournalRecord::State::live : JournalRecord::State::finished);
}

void RequestJournal::write_copy(uint32_t slot, const JournalProgress& r,
                                JournalRecord::State state) {
  SlotState& st = slots_[slot];
  const int w = st.newest == 0 ? 1 : 0;
  Copy* c = copy(slot, w);
  std::atomic_ref<uint64_t>(c->commit).store(0, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Copy next{};
  next.state = static_cast<uint32_t>(state);
  next.n_prompt = st.n_prompt;
  next.n_generated = st.n_ids - st.n_prompt;
  next.n_prefilled = r.n_prefilled;
  next.pos = r.pos;
  next.has_next = r.next_token.has_value();
  next.next_token = r.next_token.value_or(0);
  next.finish = reason_code(r.finish_reason);
  next.draws = r.draws;
  next.finished_unix_ms = state == JournalRecord::State::finished ? unix_ms() : 0;
  next.static_len = st.static_bytes;
  next.static_crc = st.static_crc;
  next.ids_crc = st.ids_crc;
  next.copy_crc = next.self_crc();
  std::memcpy(reinterpret_cast<uint8_t*>(c) + 8, reinterpret_cast<const uint8_t*>(&next) + 8,
              sizeof(Copy) - 8);
  // Everything above is visible before the commit that makes the copy valid.
  std::atomic_ref<uint64_t>(c->commit).store(++commit_seq_, std::memory_order_release);
  st.newest = w;
  st.state = state;
}

void RequestJournal::free(uint32_t slot) {
  for (int w = 0; w < 2; ++w)
    std::atomic_ref<uint64_t>(copy(slot, w)->commit).store(0, std::memory_order_release);
  slots_.at(slot) = SlotState{};
}

uint32_t RequestJournal::live_slots() const {
  uint32_t n = 0;
  for (const SlotState& s : slots_) n += s.state == JournalRecord::State::live;
  return n;
}

}  // namespace duet::frontend
