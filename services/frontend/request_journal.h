#pragma once
// The request journal (issue 22): what a generate request needs to continue after its frontend
// was killed, kept in a shm segment of the stack ("/duet-<stack>-journal"; the supervisor's
// `down` removes it with the stack's other segments), not in the frontend's heap. A restarted
// frontend reads it back (recover()), re-opens each request's sequence over the KV pages that
// are still in the pool (shm/kv_pages.h) and continues at the step that was in flight; clients
// resume their streams with schemas/client.fbs Resume.
//
// Layout (all little-endian, offsets from the segment's start):
//   [header 64 B: magic "DUETJRN1", version, n_slots, slot_bytes, max_ids, static_bytes]
//   [slot 0][slot 1]...  each slot_bytes (a multiple of 64):
//     copy A (128 B) | copy B (128 B)   progress records, written alternately
//     static area (static_bytes)        routing, request id, seq id, limits, sampling, stops
//     ids (max_ids x int32)             the prompt, then the generated ids, append-only
// A copy = { commit u64 (0: not valid; else the journal's write sequence, stored LAST with
// release semantics), state, prompt/generated counts, n_prefilled, pos, next token, sampler
// draws, finish reason, crc32 of the static area, of ids[0..n_prompt+n_generated) and of the
// copy itself }. An update writes the copy that is not the newest (its commit zeroed first), so a
// writer killed at any instruction leaves the previous copy intact: recover() takes the valid
// copy with the highest commit, where valid means every crc matches and every count is in
// bounds; a slot with none is freed, never trusted.
//
// Bounds: ids per slot = the frontend's max context (a request's prompt + max_tokens never
// exceeds it); the static area fits the frontend's stop-string limits and 256 bytes of routing.
// n_slots = running + queue limits (at most kMaxSlots). A request that finds no slot (every one
// live) or whose routing does not fit runs unjournaled: it is not resumable, as before issue 22,
// and `status` counts it under journal.unjournaled.
//
// Single writer: the frontend's serving thread. Cost per step and request: one 128-byte copy,
// the new ids and a crc32 of ~100 bytes (zlib).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/sampling.h"
#include "shm/segment.h"

namespace duet::frontend {

// What a journaled request is: its static part (written once) and its progress.
struct JournalRecord {
  enum class State : uint32_t { free = 0, live = 1, finished = 2 };
  // static
  std::vector<std::string> routing;  // the client's ROUTER identity frames
  uint64_t client_request_id = 0;
  uint64_t seq_id = 0;
  uint8_t priority = 0;
  bool stream = true;
  bool ignore_eos = false;
  int8_t logprobs = -1;  // Generate.logprobs
  int32_t max_tokens = 0;
  int32_t max_positions = 0;
  uint32_t heartbeat_ms = 0;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> prompt;
  // progress
  State state = State::live;
  std::vector<int32_t> generated;
  uint32_t n_prefilled = 0;
  int32_t pos = 0;
  std::optional<int32_t> next_token;
  uint64_t draws = 0;             // the sampler's (core/model/sampling.h restore)
  std::string finish_reason;      // finished: eos | length | stop | cancelled
  uint64_t finished_unix_ms = 0;  // wall clock, when it finished
  uint32_t slot = 0;              // where recover() found it
};

// A request's progress as update() writes it (views into the frontend's Request).
struct JournalProgress {
  std::span<const int32_t> generated;
  uint32_t n_prefilled = 0;
  int32_t pos = 0;
  std::optional<int32_t> next_token;
  uint64_t draws = 0;
  std::string_view finish_reason;  // "" while live
};

class RequestJournal {
 public:
  static constexpr uint64_t kMagic = 0x314E524A54455544ull;  // "DUETJRN1" little-endian
  static constexpr uint32_t kVersion = 2;                    // 2: logprobs in the static area
  static constexpr uint32_t kMaxSlots = 4096;
  static constexpr uint32_t kMaxRoutingBytes = 256;
  struct Geometry {
    uint32_t n_slots = 0;
    uint32_t max_ids = 0;       // prompt + generated ids per request
    uint32_t static_bytes = 0;  // see static_bytes_for
    bool operator==(const Geometry&) const = default;
  };
  // The static area that holds up to n_stop stop strings of stop_bytes each.
  static uint32_t static_bytes_for(size_t n_stop, size_t stop_bytes);
  static uint64_t bytes_for(const Geometry& g);
  // "/duet-<stack>-journal"; a stack's model i > 0 (issue 25) has its own, "...-journal_m<i>", so a
  // restarted frontend adopts each request into the model it was running on.
  static std::string segment_name_for(const std::string& stack_id, uint32_t model_index = 0);

  // The stack's journal: the existing segment when its header matches `g` (recover() then reads
  // what it holds), else a fresh one (a segment of another geometry or a bad header is removed).
  static std::unique_ptr<RequestJournal> open_or_create(const std::string& stack_id, Geometry g,
                                                        uint32_t model_index = 0);
  // Over memory the caller owns (tests): format = true writes an empty journal, else the header
  // must match `g` (bad_format otherwise).
  RequestJournal(uint8_t* base, uint64_t bytes, Geometry g, bool format);

  // Every slot with a valid copy: live and finished records. Slots without one are freed.
  // Call once, before the first write.
  std::vector<JournalRecord> recover();
  // Starts a record (state live, nothing generated) in a free slot, else in the slot of the
  // oldest finished record. nullopt when every slot is live or the record does not fit.
  std::optional<uint32_t> begin(const JournalRecord& r);
  // Writes the progress of a record begun here or recovered: generated may only have grown.
  // A finish_reason makes the record finished (kept for a client that missed its Done, until
  // begin() needs the slot).
  void update(uint32_t slot, const JournalProgress& p);
  void free(uint32_t slot);
  // Keeps a recovered record (recover() frees nothing it returns; this makes the slot this
  // process's to update).
  void adopt(const JournalRecord& r);

  const Geometry& geometry() const { return g_; }
  uint32_t live_slots() const;
  uint64_t commits() const { return commit_seq_; }

 private:
  struct Copy;
  struct SlotState {
    JournalRecord::State state = JournalRecord::State::free;
    uint32_t n_prompt = 0, n_ids = 0;  // ids written (prompt + generated)
    uint32_t ids_crc = 0;              // crc32 of those ids
    uint32_t static_bytes = 0, static_crc = 0;
    int newest = -1;     // the copy holding the newest commit
    uint64_t order = 0;  // commit of the begin (age of a finished record)
  };
  uint8_t* slot_base(uint32_t slot) const;
  Copy* copy(uint32_t slot, int which) const;
  uint8_t* static_area(uint32_t slot) const;
  int32_t* ids(uint32_t slot) const;
  void write_copy(uint32_t slot, const JournalProgress& p, JournalRecord::State state);
  std::optional<JournalRecord> read_slot(uint32_t slot, int* newest) const;

  shm::Segment segment_;  // empty for a journal over caller memory
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  Geometry g_;
  uint64_t slot_bytes_ = 0;
  uint64_t commit_seq_ = 0;
  std::vector<SlotState> slots_;
};

}  // namespace duet::frontend
