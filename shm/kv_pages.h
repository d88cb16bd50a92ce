#pragma once
// KV-cache pages in a shared segment, with prefix sharing (issue 20 item 4). The allocator's whole
// state lives IN the segment, so a restarted frontend re-attaches and finds who owned, borrowed
// and published what:
//
//   [header: 64 B][page entries: n_pages x 32 B][borrows: n_pages x 16 B]
//   [block tokens: n_pages x page_tokens x 4 B][pad to 4096][page 0][page 1]...
//   entry  = { owner: u64 (the sequence that writes it; 0 = free; kCached = its writer ended and
//              it holds a published block), hash: u64 (its block's chain hash; 0 = unpublished),
//              ordinal: u32 (its place in its writer's page table = its block index),
//              refs: u32 (sequences that borrow it), parent: u32 (the page of the previous
//              block when published; kNoPage for block 0), tick: u32 (last use, for LRU) }
//   borrow = { owner: u64 (0 = empty slot), tail: u32 (the page of its last borrowed block),
//              blocks: u32 (how many blocks it borrows: the chain tail, parent, ... to block 0) }
//   block tokens: the token ids of each published page's block, so a match compares the tokens
//              themselves (a hash collision never shares a page) and a restart rebuilds its index.
//
// Sharing (vLLM's prefix caching): a page whose block of page_tokens positions is complete is
// published under hash(previous block's hash, its tokens). A new sequence's prompt is matched
// block by block (same parent page, same tokens): it borrows the matched chain (refs++ on each)
// and computes from the first unmatched token. A sequence's page table is its borrowed chain
// followed by its own pages in ordinal order; pages_of(owner) returns exactly that, from the
// segment alone (position p lives in pages_of(owner)[p / page_tokens]).
//
// A shared page is read-only for every user: a sequence writes only pages it owns that are not
// published (writable_by()); publish() happens only once a block is complete, a borrowed chain
// is always whole blocks, so the append position of a sequence is always in a page it owns alone.
//
// When the writer ends, its published pages stay as kCached (refs > 0: still borrowed; refs 0:
// an evictable cached prefix, reused by later requests); unpublished pages are freed. alloc()
// takes free pages first, then evicts cached refs-0 pages, least recently used first (deeper
// blocks first on a tie). available() = free + evictable is what admission may promise.
//
// Single writer: only the frontend calls the mutating functions; other processes (the device
// services, status tools) may read concurrently. owner is stored last with release semantics,
// readers load it with acquire. A writer killed mid-call leaves entries tagged with its sequences:
// reclaim_except() frees (or caches) them on restart.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace duet::shm {

class Segment;

class KvPages {
 public:
  static constexpr uint64_t kMagic = 0x3150564B54455544ull;  // "DUETKVP1" little-endian
  static constexpr uint32_t kVersion = 2;                    // 2: refcounts, borrows, hashes
  static constexpr uint64_t kPageAlignment = 4096;
  static constexpr uint64_t kFree = 0;
  static constexpr uint64_t kCached = ~uint64_t{0};  // owner of a published page whose writer ended
  static constexpr uint32_t kNoPage = ~uint32_t{0};
  static constexpr uint32_t kDefaultPageTokens = 16;

  // Segment bytes needed for n_pages pages of page_bytes (a multiple of 64).
  static uint64_t bytes_for(uint32_t n_pages, uint64_t page_bytes,
                            uint32_t page_tokens = kDefaultPageTokens);
  // Writes a fresh header and an all-free page table. base must be 4096-byte aligned.
  static KvPages format(uint8_t* base, uint64_t bytes, uint32_t n_pages, uint64_t page_bytes,
                        uint32_t page_tokens = kDefaultPageTokens);
  static KvPages format(Segment& segment, uint32_t n_pages, uint64_t page_bytes,
                        uint32_t page_tokens = kDefaultPageTokens);
  // Validates magic, version and geometry against bytes (bad_format otherwise). A read-only
  // segment gives a reader: the mutating calls then throw invalid_argument.
  static KvPages attach(uint8_t* base, uint64_t bytes);
  static KvPages attach(Segment& segment);

  // The chain hash of a block: hash of the previous block's hash (0 for block 0) and its tokens.
  static uint64_t block_hash(uint64_t prev_hash, std::span<const int32_t> tokens);

  // Takes n pages for owner (free ones first, lowest indices; then evicted cached pages), appended
  // after the owner's existing pages (borrowed ones included); returns their indices in
  // page-table order. All or nothing: busy if fewer than n are available.
  std::vector<uint32_t> alloc(uint32_t n, uint64_t owner);
  // Ends owner: drops its borrows (refs--), caches its published pages, frees the rest. Returns
  // how many pages it held (borrowed + own).
  uint32_t free_owner(uint64_t owner);
  // free_owner() for every owner not in live (a restarted frontend's reclaim); returns how many.
  uint32_t reclaim_except(std::span<const uint64_t> live);

  // Publishes owner's page (which must hold a complete block: the caller says so) under
  // hash = block_hash(hash of the parent page or 0, tokens); parent is the page of the previous
  // block in owner's page table (kNoPage for block 0). invalid_argument if the page is not
  // owner's, is published already, or tokens is not page_tokens long.
  uint64_t publish(uint64_t owner, uint32_t page, uint32_t parent, std::span<const int32_t> tokens);
  // The page holding the block of `tokens` after parent (kNoPage: block 0) under hash, if one is
  // published (its tokens compared, not just the hash); kNoPage otherwise. `hint` is a page an
  // index believes holds it (checked; kNoPage: scan).
  uint32_t find_block(uint64_t hash, uint32_t parent, std::span<const int32_t> tokens,
                      uint32_t hint = kNoPage) const;
  // Owner (open, with no pages and no borrow yet) borrows chain = the pages of blocks 0..k-1:
  // refs++ on each. invalid_argument if the chain is not a published parent chain or owner
  // already holds pages; busy when the borrow table is full.
  void borrow(uint64_t owner, std::span<const uint32_t> chain);
  // Forgets positions >= n_past of owner: borrowed blocks past it are dropped (refs--) and own
  // published pages past it unpublished (or, if borrowed by others, handed to kCached); its own
  // pages stay. invalid_argument if position n_past falls inside a page it does not own alone
  // (the next write would land in a shared page: recompute from the block's start instead).
  void truncate(uint64_t owner, uint32_t n_past);
  // Whether owner may write KV rows into page (owns it and it is unpublished).
  bool writable_by(uint32_t page, uint64_t owner) const;

  std::vector<uint32_t> pages_of(uint64_t owner) const;  // page table: borrowed chain + own
  std::vector<uint64_t> owners() const;    // distinct live owners holding or borrowing pages
  uint64_t owner_of(uint32_t page) const;  // kFree if free, kCached; out_of_range
  uint32_t refs_of(uint32_t page) const;   // sequences borrowing it
  uint64_t hash_of(uint32_t page) const;   // 0 = unpublished
  uint32_t parent_of(uint32_t page) const;
  uint32_t borrowed_blocks(uint64_t owner) const;  // 0 when it borrows none
  // (hash, page) of every published page: what a restarted frontend rebuilds its index from.
  std::vector<std::pair<uint64_t, uint32_t>> published() const;

  struct Counts {
    uint32_t free = 0;    // owner kFree
    uint32_t cached = 0;  // published, writer ended, nobody borrows it: evictable
    uint32_t used = 0;    // held by a live sequence or borrowed (n_pages - free - cached)
    uint32_t shared = 0;  // borrowed by at least one sequence (refs > 0)
  };
  Counts counts() const;
  uint32_t free_count() const;  // owner kFree
  uint32_t available() const;   // free + evictable cached: what alloc() can take
  uint64_t evictions() const;   // cached pages alloc() reclaimed, since format

  uint32_t n_pages() const { return n_pages_; }
  uint32_t page_tokens() const { return page_tokens_; }
  uint64_t page_bytes() const { return page_bytes_; }
  uint64_t page_offset(uint32_t page) const;  // bytes from the segment's start; out_of_range
  uint8_t* page(uint32_t page) const { return base_ + page_offset(page); }

 private:
  struct Header;
  struct Entry;
  struct Borrow;
  KvPages(uint8_t* base, uint32_t n_pages, uint64_t page_bytes, uint32_t page_tokens,
          uint64_t pages_offset)
      : base_(base),
        n_pages_(n_pages),
        page_tokens_(page_tokens),
        page_bytes_(page_bytes),
        pages_offset_(pages_offset) {}
  Header* header() const;
  Entry* entries() const;
  Borrow* borrows() const;
  int32_t* block_tokens(uint32_t page) const;
  Borrow* borrow_of(uint64_t owner) const;
  static uint64_t pages_offset_for(uint32_t n_pages, uint32_t page_tokens);
  // An own page of an ending owner: cached (last used at tick now) if published, else free.
  void release(uint32_t page, uint32_t now);
  void unref(uint32_t page, uint32_t now);
  void drop_borrow(Borrow& b);
  uint32_t touch();
  void check_writer(const char* op) const;
  void check_page(uint32_t page) const;

  uint8_t* base_;
  uint32_t n_pages_;
  uint32_t page_tokens_;
  uint64_t page_bytes_;
  uint64_t pages_offset_;
  bool writable_ = true;
};

}  // namespace duet::shm
