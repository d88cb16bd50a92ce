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
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "shm/kv_pages.h"
#include "shm/segment.h"

namespace duet::frontend {

struct KvPool {
  struct Sequence {
    int max_positions = 0;
    int n_past = 0;
    uint32_t pages = 0;     // pages it holds
    uint32_t reserved = 0;  // pages promised to it (reserve): it may grow to them at any time
  };
  // A fresh pool in a new segment `name` (Error if the name exists).
  static std::shared_ptr<KvPool> create(const std::string& name, uint32_t n_pages,
                                        uint64_t page_bytes);
  // The existing segment `name` when it is a KV pool of n_pages of page_bytes (a restarted
  // frontend adopting its requests, issue 22: the pages and their owners stay as they are), else
  // nullptr.
  static std::shared_ptr<KvPool> attach_existing(const std::string& name, uint32_t n_pages,
                                                 uint64_t page_bytes);
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
  shm::Segment segment;
  std::optional<shm::KvPages> pages;
  // Engine calls are serialized by the serving loop, though from two threads (a preemptible step
  // runs on a worker): the mutex orders them.
  std::mutex mu;
  std::map<uint64_t, Sequence> seqs;
  std::set<uint64_t> held;        // sequences of a parked step
  uint64_t reserve_refusals = 0;  // reserve() answered busy (an admission waited for KV)
};

// What the engines of one stack that share their KV hold: the pool once the first of them made
// it. Copies of a StackEngineConfig share one KvShare.
struct KvShare {
  std::mutex mu;
  std::weak_ptr<KvPool> pool;
};

// The share's pool if one lives (its geometry must be n_pages of page_bytes: invalid_argument
// otherwise), else a new one in segment `name` (a stale segment of that name, left by a frontend
// that crashed, is removed first; with `adopt`, one of this geometry is attached instead).
std::shared_ptr<KvPool> join_kv_pool(KvShare& share, const std::string& name, uint32_t n_pages,
                                     uint64_t page_bytes, bool adopt = false);

}  // namespace duet::frontend
