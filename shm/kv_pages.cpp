#include "shm/kv_pages.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <tuple>
#include <utility>

#include "core/base/error.h"
#include "shm/segment.h"

namespace duet::shm {

struct KvPages::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t n_pages;
  uint64_t page_bytes;
  uint64_t pages_offset;  // where page 0 starts, from the segment's start
  uint64_t total_bytes;   // bytes_for(n_pages, page_bytes, page_tokens)
  uint32_t page_tokens;
  std::atomic<uint32_t> tick;       // LRU clock
  std::atomic<uint64_t> evictions;  // cached pages reclaimed by alloc()
  uint8_t reserved[8];
};

struct KvPages::Entry {
  std::atomic<uint64_t> owner;
  std::atomic<uint64_t> hash;
  std::atomic<uint32_t> ordinal;
  std::atomic<uint32_t> refs;
  std::atomic<uint32_t> parent;
  std::atomic<uint32_t> tick;
};

struct KvPages::Borrow {
  std::atomic<uint64_t> owner;  // 0 = empty slot
  std::atomic<uint32_t> tail;
  std::atomic<uint32_t> blocks;
};

namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

void check_geometry(uint32_t n_pages, uint64_t page_bytes, uint32_t page_tokens) {
  if (n_pages == 0) throw Error(Errc::invalid_argument, "KV pages: n_pages must be > 0");
  if (page_bytes == 0 || page_bytes % 64 != 0) {
    throw Error(Errc::invalid_argument, "KV pages: page_bytes " + std::to_string(page_bytes) +
                                            " must be a positive multiple of 64");
  }
  if (page_tokens == 0 || page_tokens > 4096) {
    throw Error(Errc::invalid_argument,
                "KV pages: page_tokens " + std::to_string(page_tokens) + " outside [1, 4096]");
  }
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t KvPages::pages_offset_for(uint32_t n_pages, uint32_t page_tokens) {
  static_assert(sizeof(Header) == 64 && sizeof(Entry) == 32 && sizeof(Borrow) == 16);
  const uint64_t table_end = sizeof(Header) + uint64_t{n_pages} * sizeof(Entry) +
                             uint64_t{n_pages} * sizeof(Borrow) +
                             uint64_t{n_pages} * page_tokens * sizeof(int32_t);
  return (table_end + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
}

uint64_t KvPages::bytes_for(uint32_t n_pages, uint64_t page_bytes, uint32_t page_tokens) {
  check_geometry(n_pages, page_bytes, page_tokens);
  const uint64_t offset = pages_offset_for(n_pages, page_tokens);
  if (page_bytes > (std::numeric_limits<uint64_t>::max() - offset) / n_pages) {
    throw Error(Errc::out_of_range, "KV pages: " + std::to_string(n_pages) + " pages of " +
                                        std::to_string(page_bytes) + " bytes overflow");
  }
  return offset + uint64_t{n_pages} * page_bytes;
}

KvPages KvPages::format(uint8_t* base, uint64_t bytes, uint32_t n_pages, uint64_t page_bytes,
                        uint32_t page_tokens) {
  const uint64_t need = bytes_for(n_pages, page_bytes, page_tokens);
  check_format_region(
      base, bytes, kPageAlignment, need, "KV pages",
      std::to_string(n_pages) + " pages of " + std::to_string(page_bytes) + " bytes");
  auto* header = new (base) Header{};
  header->magic = kMagic;
  header->version = kVersion;
  header->n_pages = n_pages;
  header->page_bytes = page_bytes;
  header->pages_offset = pages_offset_for(n_pages, page_tokens);
  header->total_bytes = need;
  header->page_tokens = page_tokens;
  auto* table = reinterpret_cast<Entry*>(base + sizeof(Header));
  for (uint32_t i = 0; i < n_pages; ++i) new (&table[i]) Entry{};
  auto* borrow = reinterpret_cast<Borrow*>(table + n_pages);
  for (uint32_t i = 0; i < n_pages; ++i) new (&borrow[i]) Borrow{};
  std::atomic_thread_fence(std::memory_order_release);
  return KvPages(base, n_pages, page_bytes, page_tokens, header->pages_offset);
}

KvPages KvPages::format(Segment& segment, uint32_t n_pages, uint64_t page_bytes,
                        uint32_t page_tokens) {
  return format(segment.data(), segment.size(), n_pages, page_bytes, page_tokens);
}

KvPages KvPages::attach(uint8_t* base, uint64_t bytes) {
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % kPageAlignment != 0 ||
      bytes < sizeof(Header)) {
    throw Error(Errc::bad_format, "KV pages: region is unaligned or smaller than its header");
  }
  const auto* header = reinterpret_cast<const Header*>(base);
  if (header->magic != kMagic) {
    throw Error(Errc::bad_format, "KV pages: bad magic (not a KV segment, or not formatted yet)");
  }
  if (header->version != kVersion) {
    throw Error(Errc::bad_format, "KV pages: version " + std::to_string(header->version) +
                                      ", this build reads " + std::to_string(kVersion));
  }
  const bool geometry_ok =
      header->n_pages > 0 && header->page_bytes > 0 && header->page_bytes % 64 == 0 &&
      header->page_tokens > 0 && header->page_tokens <= 4096 &&
      header->pages_offset == pages_offset_for(header->n_pages, header->page_tokens);
  if (!geometry_ok ||
      bytes_for(header->n_pages, header->page_bytes, header->page_tokens) != header->total_bytes ||
      header->total_bytes > bytes) {
    throw Error(Errc::bad_format, "KV pages: header geometry (" + std::to_string(header->n_pages) +
                                      " pages of " + std::to_string(header->page_bytes) +
                                      " bytes) is inconsistent or does not fit the " +
                                      std::to_string(bytes) + "-byte region");
  }
  return KvPages(base, header->n_pages, header->page_bytes, header->page_tokens,
                 header->pages_offset);
}

KvPages KvPages::attach(Segment& segment) {
  KvPages kv = attach(segment.data(), segment.size());
  kv.writable_ = segment.writable();
  return kv;
}

uint64_t KvPages::block_hash(uint64_t prev_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix(prev_hash ^ 0x9e3779b97f4a7c15ull) ^ tokens.size();
  for (int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull;
  return h == 0 ? 1 : h;  // 0 means unpublished
}

void KvPages::check_writer(const char* op) const {
  if (!writable_) {
    throw Error(Errc::invalid_argument, std::string("KV pages: ") + op +
                                            " on a read-only mapping (readers cannot allocate)");
  }
}

void KvPages::check_page(uint32_t page) const {
  if (page >= n_pages_) {
    throw Error(Errc::out_of_range, "KV page " + std::to_string(page) + " past the segment's " +
                                        std::to_string(n_pages_) + " pages");
  }
}

KvPages::Header* KvPages::header() const {
  return reinterpret_cast<Header*>(base_);
}
KvPages::Entry* KvPages::entries() const {
  return reinterpret_cast<Entry*>(base_ + sizeof(Header));
}
KvPages::Borrow* KvPages::borrows() const {
  return reinterpret_cast<Borrow*>(entries() + n_pages_);
}
int32_t* KvPages::block_tokens(uint32_t page) const {
  return reinterpret_cast<int32_t*>(borrows() + n_pages_) + uint64_t{page} * page_tokens_;
}

KvPages::Borrow* KvPages::borrow_of(uint64_t owner) const {
  if (owner == kFree || owner == kCached) return nullptr;
  Borrow* b = borrows();
  for (uint32_t i = 0; i < n_pages_; ++i)
    if (b[i].owner.load(std::memory_order_acquire) == owner) return &b[i];
  return nullptr;
}

uint32_t KvPages::touch() {
  return header()->tick.fetch_add(1, kRelaxed) + 1;
}

std::vector<uint32_t> KvPages::alloc(uint32_t n, uint64_t owner) {
  check_writer("alloc");
  if (owner == kFree || owner == kCached)
    throw Error(Errc::invalid_argument, "KV pages: owner 0 and ~0 are reserved");
  Entry* table = entries();
  const Borrow* b = borrow_of(owner);
  uint32_t next_ordinal = b ? b->blocks.load(kRelaxed) : 0;
  uint32_t n_free = 0;
  // Evictable pages, least recently used first; on a tie the deeper block first (a chain's
  // leaves go before the blocks they extend).
  std::vector<std::tuple<uint32_t, int64_t, uint32_t>> evictable;  // (tick, -ordinal, page)
  for (uint32_t i = 0; i < n_pages_; ++i) {
    const uint64_t o = table[i].owner.load(kRelaxed);  // we are the only writer
    if (o == owner) {
      next_ordinal = std::max(next_ordinal, table[i].ordinal.load(kRelaxed) + 1);
    } else if (o == kFree) {
      ++n_free;
    } else if (o == kCached && table[i].refs.load(kRelaxed) == 0) {
      evictable.emplace_back(table[i].tick.load(kRelaxed),
                             -int64_t{table[i].ordinal.load(kRelaxed)}, i);
    }
  }
  if (n_free + evictable.size() < n) {
    throw Error(Errc::busy, "KV cache full: owner " + std::to_string(owner) + " needs " +
                                std::to_string(n) + " pages, " + std::to_string(n_free) + " of " +
                                std::to_string(n_pages_) + " are free and " +
                                std::to_string(evictable.size()) + " cached");
  }
  if (n_free < n) {
    std::sort(evictable.begin(), evictable.end());
    for (const auto& [tick, neg_ordinal, victim] : evictable) {
      if (n_free >= n) break;
      if (table[victim].owner.load(kRelaxed) != kCached) continue;  // freed with its parent
      // Blocks that extend a reclaimed one can never be matched again: free them with it.
      std::vector<uint32_t> gone{victim};
      while (!gone.empty()) {
        const uint32_t p = gone.back();
        gone.pop_back();
        table[p].hash.store(0, kRelaxed);
        table[p].owner.store(kFree, std::memory_order_release);
        header()->evictions.fetch_add(1, kRelaxed);
        ++n_free;
        for (uint32_t i = 0; i < n_pages_; ++i)
          if (table[i].parent.load(kRelaxed) == p && table[i].owner.load(kRelaxed) == kCached &&
              table[i].refs.load(kRelaxed) == 0 && table[i].hash.load(kRelaxed) != 0)
            gone.push_back(i);
      }
    }
  }
  std::vector<uint32_t> picked;
  for (uint32_t i = 0; i < n_pages_ && picked.size() < n; ++i)
    if (table[i].owner.load(kRelaxed) == kFree) picked.push_back(i);
  for (uint32_t page : picked) {
    table[page].hash.store(0, kRelaxed);
    table[page].refs.store(0, kRelaxed);
    table[page].parent.store(kNoPage, kRelaxed);
    table[page].ordinal.store(next_ordinal++, kRelaxed);
    table[page].owner.store(owner, std::memory_order_release);
  }
  return picked;
}

void KvPages::release(uint32_t page, uint32_t now) {
  Entry& e = entries()[page];
  if (e.hash.load(kRelaxed) != 0) {
    e.tick.store(now, kRelaxed);
    e.owner.store(kCached, std::memory_order_release);
  } else {
    e.owner.store(kFree, std::memory_order_release);
  }
}

void KvPages::unref(uint32_t page, uint32_t now) {
  Entry& e = entries()[page];
  const uint32_t refs = e.refs.load(kRelaxed);
  if (refs > 0) e.refs.store(refs - 1, kRelaxed);
  e.tick.store(now, kRelaxed);
}

void KvPages::drop_borrow(Borrow& b) {
  uint32_t page = b.tail.load(kRelaxed);
  const uint32_t now = touch();  // one tick for the chain: its deeper blocks go first
  for (uint32_t k = b.blocks.load(kRelaxed); k > 0 && page != kNoPage; --k) {
    unref(page, now);
    page = entries()[page].parent.load(kRelaxed);
  }
  b.owner.store(kFree, std::memory_order_release);
}

uint32_t KvPages::free_owner(uint64_t owner) {
  check_writer("free_owner");
  if (owner == kFree || owner == kCached)
    throw Error(Errc::invalid_argument, "KV pages: owner 0 and ~0 are reserved");
  uint32_t freed = 0;
  if (Borrow* b = borrow_of(owner)) {
    freed += b->blocks.load(kRelaxed);
    drop_borrow(*b);
  }
  Entry* table = entries();
  const uint32_t now = touch();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    if (table[i].owner.load(kRelaxed) == owner) {
      release(i, now);
      ++freed;
    }
  }
  return freed;
}

uint32_t KvPages::reclaim_except(std::span<const uint64_t> live) {
  check_writer("reclaim_except");
  uint32_t freed = 0;
  for (uint64_t o : owners())
    if (std::find(live.begin(), live.end(), o) == live.end()) freed += free_owner(o);
  return freed;
}

uint64_t KvPages::publish(uint64_t owner, uint32_t page, uint32_t parent,
                          std::span<const int32_t> tokens) {
  check_writer("publish");
  check_page(page);
  Entry& e = entries()[page];
  if (owner == kFree || owner == kCached || e.owner.load(kRelaxed) != owner)
    throw Error(Errc::invalid_argument, "KV pages: publish of page " + std::to_string(page) +
                                            " by " + std::to_string(owner) + ", not its owner");
  if (e.hash.load(kRelaxed) != 0)
    throw Error(Errc::invalid_argument,
                "KV pages: page " + std::to_string(page) + " is published already");
  if (tokens.size() != page_tokens_)
    throw Error(Errc::invalid_argument, "KV pages: a block is " + std::to_string(page_tokens_) +
                                            " tokens, publish got " +
                                            std::to_string(tokens.size()));
  uint64_t prev = 0;
  if (parent != kNoPage) {
    check_page(parent);
    prev = entries()[parent].hash.load(kRelaxed);
    if (prev == 0)
      throw Error(Errc::invalid_argument, "KV pages: publish of page " + std::to_string(page) +
                                              " after unpublished page " + std::to_string(parent));
  }
  const uint64_t hash = block_hash(prev, tokens);
  std::memcpy(block_tokens(page), tokens.data(), tokens.size() * sizeof(int32_t));
  e.parent.store(parent, kRelaxed);
  e.tick.store(touch(), kRelaxed);
  e.hash.store(hash, std::memory_order_release);
  return hash;
}

uint32_t KvPages::find_block(uint64_t hash, uint32_t parent, std::span<const int32_t> tokens,
                             uint32_t hint) const {
  const Entry* table = entries();
  auto holds = [&](uint32_t p) {
    const uint64_t o = table[p].owner.load(std::memory_order_acquire);
    return o != kFree && table[p].hash.load(kRelaxed) == hash &&
           table[p].parent.load(kRelaxed) == parent && tokens.size() == page_tokens_ &&
           std::memcmp(block_tokens(p), tokens.data(), tokens.size() * sizeof(int32_t)) == 0;
  };
  if (hint != kNoPage) return hint < n_pages_ && holds(hint) ? hint : kNoPage;
  for (uint32_t i = 0; i < n_pages_; ++i)
    if (holds(i)) return i;
  return kNoPage;
}

void KvPages::borrow(uint64_t owner, std::span<const uint32_t> chain) {
  check_writer("borrow");
  if (owner == kFree || owner == kCached)
    throw Error(Errc::invalid_argument, "KV pages: owner 0 and ~0 are reserved");
  if (chain.empty()) return;
  if (borrow_of(owner) != nullptr || !pages_of(owner).empty())
    throw Error(Errc::invalid_argument, "KV pages: sequence " + std::to_string(owner) +
                                            " holds pages already; only a new one borrows");
  Entry* table = entries();
  for (size_t k = 0; k < chain.size(); ++k) {
    check_page(chain[k]);
    const Entry& e = table[chain[k]];
    const uint32_t want_parent = k == 0 ? kNoPage : chain[k - 1];
    if (e.owner.load(kRelaxed) == kFree || e.hash.load(kRelaxed) == 0 ||
        e.parent.load(kRelaxed) != want_parent || e.ordinal.load(kRelaxed) != k)
      throw Error(Errc::invalid_argument, "KV pages: page " + std::to_string(chain[k]) +
                                              " is not block " + std::to_string(k) +
                                              " of a published chain");
  }
  Borrow* slot = nullptr;
  for (uint32_t i = 0; i < n_pages_ && !slot; ++i)
    if (borrows()[i].owner.load(kRelaxed) == kFree) slot = &borrows()[i];
  if (!slot) throw Error(Errc::busy, "KV pages: the borrow table is full");
  const uint32_t now = touch();
  for (uint32_t page : chain) {
    table[page].refs.fetch_add(1, kRelaxed);
    table[page].tick.store(now, kRelaxed);
  }
  slot->tail.store(chain.back(), kRelaxed);
  slot->blocks.store(static_cast<uint32_t>(chain.size()), kRelaxed);
  slot->owner.store(owner, std::memory_order_release);
}

void KvPages::truncate(uint64_t owner, uint32_t n_past) {
  check_writer("truncate");
  const std::vector<uint32_t> table_of = pages_of(owner);
  const uint32_t keep = (n_past + page_tokens_ - 1) / page_tokens_;  // pages still holding KV
  const uint32_t write_block = n_past / page_tokens_;                // where the next row goes
  if (n_past % page_tokens_ != 0 && write_block < table_of.size() &&
      (owner_of(table_of[write_block]) != owner || refs_of(table_of[write_block]) > 0))
    throw Error(Errc::invalid_argument,
                "KV pages: truncating sequence " + std::to_string(owner) + " to " +
                    std::to_string(n_past) + " positions would write into shared page " +
                    std::to_string(table_of[write_block]) + "; truncate to a block boundary (" +
                    std::to_string(write_block * page_tokens_) + ") and recompute");
  Entry* table = entries();
  const uint32_t now = touch();
  if (Borrow* b = borrow_of(owner)) {
    const uint32_t blocks = b->blocks.load(kRelaxed);
    if (keep < blocks) {
      for (uint32_t k = keep; k < blocks; ++k) unref(table_of[k], now);
      if (keep == 0) {
        b->owner.store(kFree, std::memory_order_release);
      } else {
        b->tail.store(table_of[keep - 1], kRelaxed);
        b->blocks.store(keep, kRelaxed);
      }
    }
  }
  for (uint32_t k = 0; k < table_of.size(); ++k) {
    const uint32_t page = table_of[k];
    if (table[page].owner.load(kRelaxed) != owner) continue;
    if (k >= keep) {
      release(page, now);  // a published page past the cut stays cached for whoever matches it
    } else if (k == write_block && table[page].hash.load(kRelaxed) != 0) {
      table[page].hash.store(0, kRelaxed);  // nobody borrows it (checked): writable again
    }
  }
}

bool KvPages::writable_by(uint32_t page, uint64_t owner) const {
  check_page(page);
  const Entry& e = entries()[page];
  return owner != kFree && owner != kCached && e.owner.load(std::memory_order_acquire) == owner &&
         e.hash.load(kRelaxed) == 0 && e.refs.load(kRelaxed) == 0;
}

std::vector<uint32_t> KvPages::pages_of(uint64_t owner) const {
  std::vector<uint32_t> pages;
  if (owner == kFree || owner == kCached) return pages;
  const Entry* table = entries();
  if (const Borrow* b = borrow_of(owner)) {
    pages.resize(b->blocks.load(kRelaxed));
    uint32_t page = b->tail.load(kRelaxed);
    for (size_t k = pages.size(); k > 0; --k) {
      pages[k - 1] = page;
      if (page < n_pages_) page = table[page].parent.load(kRelaxed);
    }
  }
  std::vector<std::pair<uint32_t, uint32_t>> by_ordinal;  // (ordinal, page)
  for (uint32_t i = 0; i < n_pages_; ++i) {
    if (table[i].owner.load(std::memory_order_acquire) == owner)
      by_ordinal.emplace_back(table[i].ordinal.load(kRelaxed), i);
  }
  std::sort(by_ordinal.begin(), by_ordinal.end());
  for (auto [ordinal, page] : by_ordinal) pages.push_back(page);
  return pages;
}

std::vector<uint64_t> KvPages::owners() const {
  std::vector<uint64_t> out;
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    const uint64_t o = table[i].owner.load(std::memory_order_acquire);
    if (o != kFree && o != kCached) out.push_back(o);
    const uint64_t b = borrows()[i].owner.load(std::memory_order_acquire);
    if (b != kFree) out.push_back(b);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t KvPages::owner_of(uint32_t page) const {
  check_page(page);
  return entries()[page].owner.load(std::memory_order_acquire);
}

uint32_t KvPages::refs_of(uint32_t page) const {
  check_page(page);
  return entries()[page].refs.load(kRelaxed);
}

uint64_t KvPages::hash_of(uint32_t page) const {
  check_page(page);
  return entries()[page].hash.load(std::memory_order_acquire);
}

uint32_t KvPages::parent_of(uint32_t page) const {
  check_page(page);
  return entries()[page].parent.load(kRelaxed);
}

uint32_t KvPages::borrowed_blocks(uint64_t owner) const {
  const Borrow* b = borrow_of(owner);
  return b ? b->blocks.load(kRelaxed) : 0;
}

std::vector<std::pair<uint64_t, uint32_t>> KvPages::published() const {
  std::vector<std::pair<uint64_t, uint32_t>> out;
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    const uint64_t h = table[i].hash.load(std::memory_order_acquire);
    if (h != 0 && table[i].owner.load(kRelaxed) != kFree) out.emplace_back(h, i);
  }
  return out;
}

KvPages::Counts KvPages::counts() const {
  Counts c;
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    const uint64_t o = table[i].owner.load(std::memory_order_acquire);
    const uint32_t refs = table[i].refs.load(kRelaxed);
    if (o == kFree) {
      ++c.free;
    } else if (o == kCached && refs == 0) {
      ++c.cached;
    } else {
      ++c.used;
    }
    if (o != kFree && refs > 0) ++c.shared;
  }
  return c;
}

uint32_t KvPages::free_count() const {
  return counts().free;
}

uint32_t KvPages::available() const {
  const Counts c = counts();
  return c.free + c.cached;
}

uint64_t KvPages::evictions() const {
  return header()->evictions.load(kRelaxed);
}

uint64_t KvPages::page_offset(uint32_t page) const {
  check_page(page);
  return pages_offset_ + uint64_t{page} * page_bytes_;
}

}  // namespace duet::shm
