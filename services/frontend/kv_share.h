#pragma once
// One KV page pool that several ProgramEngines of a stack step together (Agent.xpu, issue 9).
//
// The main engine and the preemptible proactive engine each have their own arena and flags (a
// parked step's activations must not be touched by the other engine's steps), but their programs
// name the same KV segment: one shm::KvPages pool and one sequence table. A sequence's page table
// IS its KvPages owner entry, so any engine sharing the pool can step any open sequence: a
// proactive request prefilled on the proactive engine decodes in the main engine's steps (next to
// the reactive requests) by being named in them. Nothing moves: zero KV bytes copied.
//
// The pool is made by the first engine built with a KvShare and lives while any engine holds it;
// its destructor removes the segment. Sequences of a step parked on one engine are `held`: no
// engine may step, truncate or close them until that step is over.
//
// Prefix sharing (issue 20 item 4; shm/kv_pages.h has the segment's side): every complete block
// of page_tokens positions a sequence writes is published once the step that wrote it is over;
// a new sequence's prompt is matched block by block (share_prefix) and borrows the matched pages
// instead of recomputing them, keeping at least its last prompt token to compute (its logits
// sample the first token), so its next write always lands in a page of its own. The pool's
// identity is the model and KV type (one pool per engine set of a stack), so a block's tokens and
// position say everything its KV depends on; the main and proactive engines share blocks (their
// plans give the same bits up to the devices' rounding, tests/agent). Pages whose writer and
// borrowers all ended stay cached (evictable, least recently used first) and count as free for
// admission: reserve() and ensure_pages() use KvPages::available().
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "shm/kv_pages.h"
#include "shm/segment.h"

namespace duet::frontend {

struct KvPool {
  struct Sequence {
    int max_positions = 0;
    int n_past = 0;
    uint32_t pages = 0;     // pages it holds
    uint32_t reserved = 0;  // pages promised to it (reserve): it may grow to them at any time
    // Prefix sharing: blocks [0, blocks_done) are published or borrowed; tail holds the tokens
    // of positions blocks_done * page_tokens onwards as steps write them (what publish needs).
    // publishable turns false when those tokens are not known (a truncate into a block).
    uint32_t blocks_done = 0;
    std::vector<int32_t> tail;
    bool publishable = true;
  };
  struct PrefixStats {
    uint64_t lookups = 0;     // sequences share_prefix() was asked about
    uint64_t hits = 0;        // of those, sequences that borrowed at least one block
    uint64_t hit_blocks = 0;  // blocks borrowed instead of computed
    uint64_t hit_tokens = 0;  // their positions
    uint64_t published = 0;   // blocks published
    uint64_t kept_free = 0;   // matches not borrowed: the cached page was promised as free
  };
  // A fresh pool in a new segment `name` (Error if the name exists).
  static std::shared_ptr<KvPool> create(const std::string& name, uint32_t n_pages,
                                        uint64_t page_bytes,
                                        uint32_t page_tokens = shm::KvPages::kDefaultPageTokens);
  // Prefix sharing (call with mu held). share_prefix: an open sequence with nothing in it borrows
  // the published blocks its prompt starts with (at most prompt.size() - 1 positions, whole
  // blocks); returns the positions now in its KV (0: none matched, or sharing is off).
  // record_tokens: a step is about to write tokens at pos0.. of seq_id (prepare). publish_done:
  // the sequence's KV now holds n_past positions; its complete blocks are published.
  int share_prefix(uint64_t seq_id, std::span<const int32_t> prompt);
  void record_tokens(uint64_t seq_id, int pos0, std::span<const int32_t> tokens);
  void publish_done(uint64_t seq_id, int n_past);
  // Forgets positions >= n_past of seq_id (truncate_seq): shm::KvPages::truncate plus the
  // sequence's bookkeeping.
  void truncate(uint64_t seq_id, int n_past);
  // A restarted frontend's pool (issue 22): the existing segment `name` attached (KvPages::attach
  // validates it) and the prefix index rebuilt from the blocks published in it. No sequence is
  // open: adopt_seq() re-opens each one the frontend continues, pages->reclaim_except() ends the
  // rest (their published blocks stay cached).
  static std::shared_ptr<KvPool> attach(const std::string& name);
  // Re-opens seq_id as the segment has it (call with mu held): its page table is
  // pages->pages_of(seq_id) (borrowed chain + own pages), n_past the positions its KV holds.
  // Its unpublished complete blocks are not published later (their tokens were in the dead
  // frontend's heap); from a block boundary on it publishes again.
  void adopt_seq(uint64_t seq_id, int max_positions, int n_past);
  // The existing segment `name` when it is a KV pool of this geometry (a restarted frontend
  // adopting its requests, issue 22: pages, owners and published blocks stay as they are and
  // attach() rebuilds the prefix index), else nullptr (the caller makes a fresh pool).
  static std::shared_ptr<KvPool> attach_existing(const std::string& name, uint32_t n_pages,
                                                 uint64_t page_bytes, uint32_t page_tokens);
  // Error(busy) when seq_id belongs to a parked step (call with mu held).
  void check_not_held(uint64_t seq_id, const char* what) const;
  // Promises seq_id `pages` pages in all (call with mu held): Error(busy) when the free pages,
  // less those promised to other sequences and not yet taken, are too few now;
  // Error(out_of_range) when more than the whole pool. Admission control (issue 20): a running
  // sequence never finds the pool empty.
  void reserve(uint64_t seq_id, uint32_t pages);
  uint32_t promised_not_taken() const;  // over every sequence (call with mu held)
  KvPool() = default;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool() {
    try {
      if (segment.valid()) segment.unlink();
    } catch (...) {
    }
  }

  std::string name;
  uint32_t n_pages = 0;
  uint64_t page_bytes = 0;
  uint32_t page_tokens = shm::KvPages::kDefaultPageTokens;
  bool sharing = true;  // prefix sharing on (DUET_KV_PREFIX=off: every sequence computes all)
  shm::Segment segment;
  std::optional<shm::KvPages> pages;
  // Engine calls are serialized by the serving loop, though from two threads (a preemptible step
  // runs on a worker): the mutex orders them.
  std::mutex mu;
  std::map<uint64_t, Sequence> seqs;
  std::set<uint64_t> held;        // sequences of a parked step
  uint64_t reserve_refusals = 0;  // reserve() answered busy (an admission waited for KV)
  // Block hash -> a page publishing it. A hint: KvPages::find_block checks the segment, which a
  // restarted frontend rebuilds this from (KvPages::published()).
  std::unordered_map<uint64_t, uint32_t> index;
  PrefixStats prefix;
};

// What the engines of one stack that share their KV hold: the pool once the first of them made
// it. Copies of a StackEngineConfig share one KvShare.
struct KvShare {
  std::mutex mu;
  std::weak_ptr<KvPool> pool;
  // The pool's segment is "kv.<tag>": each model of a several-model stack (issue 25) shares a
  // pool of its own between its engines ("shared" for the first, "shared_m<i>" for model i).
  std::string tag = "shared";
};

// The share's pool if one lives (its geometry must be n_pages of page_bytes: invalid_argument
// otherwise), else a new one in segment `name` (a stale segment of that name, left by a frontend
// that crashed, is removed first; with `adopt`, one of this geometry is attached instead).
std::shared_ptr<KvPool> join_kv_pool(KvShare& share, const std::string& name, uint32_t n_pages,
                                     uint64_t page_bytes,
                                     uint32_t page_tokens = shm::KvPages::kDefaultPageTokens,
                                     bool adopt = false);

}  // namespace duet::frontend
