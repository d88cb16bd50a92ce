#include "services/frontend/kv_share.h"

#include <string>

#include "core/error.h"

namespace duet::frontend {

std::shared_ptr<KvPool> KvPool::create(const std::string& name, uint32_t n_pages,
                                       uint64_t page_bytes) {
  auto pool = std::make_shared<KvPool>();
  pool->name = name;
  pool->n_pages = n_pages;
  pool->page_bytes = page_bytes;
  // From here on a failure removes the segment again (~KvPool).
  pool->segment = shm::Segment::create(name, shm::KvPages::bytes_for(n_pages, page_bytes));
  pool->pages.emplace(shm::KvPages::format(pool->segment, n_pages, page_bytes));
  return pool;
}

void KvPool::check_not_held(uint64_t seq_id, const char* what) const {
  if (held.count(seq_id))
    throw Error(Errc::busy, std::string(what) + ": sequence " + std::to_string(seq_id) +
                                " is part of a preempted step parked on an engine (resume it "
                                "first)");
}

std::shared_ptr<KvPool> join_kv_pool(KvShare& share, const std::string& name, uint32_t n_pages,
                                     uint64_t page_bytes) {
  std::lock_guard lock(share.mu);
  if (std::shared_ptr<KvPool> pool = share.pool.lock()) {
    if (pool->n_pages != n_pages || pool->page_bytes != page_bytes)
      throw Error(Errc::invalid_argument,
                  "program engine: the shared KV pool has " + std::to_string(pool->n_pages) +
                      " pages of " + std::to_string(pool->page_bytes) +
                      " bytes, this engine needs " + std::to_string(n_pages) + " of " +
                      std::to_string(page_bytes));
    return pool;
  }
  try {
    shm::Segment::open(name).unlink();
  } catch (const Error&) {
  }
  std::shared_ptr<KvPool> pool = KvPool::create(name, n_pages, page_bytes);
  share.pool = pool;
  return pool;
}

}  // namespace duet::frontend
