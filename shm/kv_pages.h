#pragma once
// KV-cache pages in a shared segment. The allocator's whole state lives IN the segment, so a
// restarted frontend re-attaches and finds who owned what:
//
//   [header: 64 bytes][page table: n_pages x 16-byte entries][pad to 4096][page 0][page 1]...
//   entry = { owner: u64 (a request id; 0 = free), ordinal: u32 (the page's place in its
//             owner's page table), reserved: u32 }
//
// pages_of(owner) returns the owner's pages in ordinal order: that IS the sequence's page table
// (position p lives in pages_of(owner)[p / page_tokens]), recoverable after a crash.
//
// Single writer: only the frontend calls alloc/free_owner/reclaim_except; other processes
// (the device services, status tools) may read concurrently. Entries are written ordinal first,
// then owner with a release store; readers load owner with acquire. A writer killed in the middle
// of alloc() leaves some pages tagged with the owner: reclaim_except() frees them on restart.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace duet::shm {

class Segment;

class KvPages {
 public:
  static constexpr uint64_t kMagic = 0x3150564B54455544ull;  // "DUETKVP1" little-endian
  static constexpr uint32_t kVersion = 1;
  static constexpr uint64_t kPageAlignment = 4096;
  static constexpr uint64_t kFree = 0;

  // Segment bytes needed for n_pages pages of page_bytes (a multiple of 64).
  static uint64_t bytes_for(uint32_t n_pages, uint64_t page_bytes);
  // Writes a fresh header and an all-free page table. base must be 4096-byte aligned.
  static KvPages format(uint8_t* base, uint64_t bytes, uint32_t n_pages, uint64_t page_bytes);
  static KvPages format(Segment& segment, uint32_t n_pages, uint64_t page_bytes);
  // Validates magic, version and geometry against bytes (bad_format otherwise). A read-only
  // segment gives a reader: alloc/free_owner/reclaim_except then throw invalid_argument.
  static KvPages attach(uint8_t* base, uint64_t bytes);
  static KvPages attach(Segment& segment);

  // Takes n free pages (lowest indices first) for owner, appended after the owner's existing
  // pages; returns their indices in page-table order. All or nothing: busy if fewer are free.
  std::vector<uint32_t> alloc(uint32_t n, uint64_t owner);
  // Frees every page of owner; returns how many.
  uint32_t free_owner(uint64_t owner);
  // Frees the pages of every owner not in live (a restarted frontend's reclaim); returns how many.
  uint32_t reclaim_except(std::span<const uint64_t> live);

  std::vector<uint32_t> pages_of(uint64_t owner) const;  // in page-table order
  std::vector<uint64_t> owners() const;                  // distinct owners holding pages, sorted
  uint64_t owner_of(uint32_t page) const;                // kFree if free; out_of_range
  uint32_t free_count() const;

  uint32_t n_pages() const { return n_pages_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t page_offset(uint32_t page) const;  // bytes from the segment's start; out_of_range
  uint8_t* page(uint32_t page) const { return base_ + page_offset(page); }

 private:
  struct Header;
  struct Entry;
  KvPages(uint8_t* base, uint32_t n_pages, uint64_t page_bytes, uint64_t pages_offset)
      : base_(base), n_pages_(n_pages), page_bytes_(page_bytes), pages_offset_(pages_offset) {}
  Entry* entries() const;
  static uint64_t pages_offset_for(uint32_t n_pages);
  void release(uint32_t page);
  void check_writer(const char* op) const;

  uint8_t* base_;
  uint32_t n_pages_;
  uint64_t page_bytes_;
  uint64_t pages_offset_;
  bool writable_ = true;
};

}  // namespace duet::shm
