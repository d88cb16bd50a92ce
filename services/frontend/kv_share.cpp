#include "services/frontend/kv_share.h"

#include <string>

#include "core/base/error.h"

namespace duet::frontend {

std::shared_ptr<KvPool> KvPool::create(const std::string& name, uint32_t n_pages,
                                       uint64_t page_bytes, uint32_t page_tokens) {
  auto pool = std::make_shared<KvPool>();
  pool->name = name;
  pool->n_pages = n_pages;
  pool->page_bytes = page_bytes;
  pool->page_tokens = page_tokens;
  // From here on a failure removes the segment again (~KvPool).
  pool->segment =
      shm::Segment::create(name, shm::KvPages::bytes_for(n_pages, page_bytes, page_tokens));
  pool->pages.emplace(shm::KvPages::format(pool->segment, n_pages, page_bytes, page_tokens));
  return pool;
}

std::shared_ptr<KvPool> KvPool::attach_existing(const std::string& name, uint32_t n_pages,
                                                uint64_t page_bytes, uint32_t page_tokens) {
  try {
    std::shared_ptr<KvPool> pool = attach(name);
    if (pool->n_pages != n_pages || pool->page_bytes != page_bytes ||
        pool->page_tokens != page_tokens) {
      pool->pages.reset();
      pool->segment = shm::Segment();  // not ours to remove: the caller makes a fresh one
      return nullptr;
    }
    return pool;
  } catch (const Error&) {
    return nullptr;
  }
}

void KvPool::check_not_held(uint64_t seq_id, const char* what) const {
  if (held.count(seq_id))
    throw Error(Errc::busy, std::string(what) + ": sequence " + std::to_string(seq_id) +
                                " is part of a preempted step parked on an engine (resume it "
                                "first)");
}

uint32_t KvPool::promised_not_taken() const {
  uint32_t n = 0;
  for (const auto& [id, s] : seqs) n += s.reserved > s.pages ? s.reserved - s.pages : 0;
  return n;
}

void KvPool::reserve(uint64_t seq_id, uint32_t want) {
  auto it = seqs.find(seq_id);
  if (it == seqs.end())
    throw Error(Errc::not_found, "reserve: sequence " + std::to_string(seq_id) + " is not open");
  Sequence& s = it->second;
  if (want <= s.reserved) return;
  if (want > n_pages)
    throw Error(Errc::out_of_range, "KV cache too small: sequence " + std::to_string(seq_id) +
                                        " needs " + std::to_string(want) +
                                        " pages, the whole pool has " + std::to_string(n_pages) +
                                        " (a larger --kv-memory)");
  const uint32_t others = promised_not_taken() - (s.reserved > s.pages ? s.reserved - s.pages : 0);
  const uint32_t free_now = pages->available();  // cached prefix blocks are reclaimed on demand
  // Free pages not promised to others (its own promise is among them) must cover its growth.
  const uint32_t extra = want - s.pages;
  if (want > s.pages && (free_now < others || free_now - others < extra)) {
    ++reserve_refusals;
    throw Error(Errc::busy, "KV cache full: sequence " + std::to_string(seq_id) + " needs " +
                                std::to_string(extra) + " more pages; " + std::to_string(free_now) +
                                " are free and " + std::to_string(others) +
                                " of them promised to running requests");
  }
  s.reserved = want;
}

std::shared_ptr<KvPool> join_kv_pool(KvShare& share, const std::string& name, uint32_t n_pages,
                                     uint64_t page_bytes, uint32_t page_tokens, bool adopt) {
  std::lock_guard lock(share.mu);
  if (std::shared_ptr<KvPool> pool = share.pool.lock()) {
    if (pool->n_pages != n_pages || pool->page_bytes != page_bytes ||
        pool->page_tokens != page_tokens)
      throw Error(Errc::invalid_argument,
                  "program engine: the shared KV pool has " + std::to_string(pool->n_pages) +
                      " pages of " + std::to_string(pool->page_bytes) +
                      " bytes, this engine needs " + std::to_string(n_pages) + " of " +
                      std::to_string(page_bytes));
    return pool;
  }
  std::shared_ptr<KvPool> pool =
      adopt ? KvPool::attach_existing(name, n_pages, page_bytes, page_tokens) : nullptr;
  if (pool) {
    share.pool = pool;
    return pool;
  }
  try {
    shm::Segment::open(name).unlink();
  } catch (const Error&) {
  }
  pool = KvPool::create(name, n_pages, page_bytes, page_tokens);
  share.pool = pool;
  return pool;
}

}  // namespace duet::frontend
