#include "shm/kv_pages.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "core/error.h"
#include "shm/segment.h"

namespace duet::shm {

struct KvPages::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t n_pages;
  uint64_t page_bytes;
  uint64_t pages_offset;  // where page 0 starts, from the segment's start
  uint64_t total_bytes;   // bytes_for(n_pages, page_bytes)
  uint8_t reserved[24];
};

struct KvPages::Entry {
  std::atomic<uint64_t> owner;
  std::atomic<uint32_t> ordinal;
  uint32_t reserved;
};

namespace {

void check_geometry(uint32_t n_pages, uint64_t page_bytes) {
  if (n_pages == 0) throw Error(Errc::invalid_argument, "KV pages: n_pages must be > 0");
  if (page_bytes == 0 || page_bytes % 64 != 0) {
    throw Error(Errc::invalid_argument, "KV pages: page_bytes " + std::to_string(page_bytes) +
                                            " must be a positive multiple of 64");
  }
}

}  // namespace

uint64_t KvPages::pages_offset_for(uint32_t n_pages) {
  static_assert(sizeof(Header) == 64 && sizeof(Entry) == 16);
  uint64_t table_end = sizeof(Header) + uint64_t{n_pages} * sizeof(Entry);
  return (table_end + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
}

uint64_t KvPages::bytes_for(uint32_t n_pages, uint64_t page_bytes) {
  check_geometry(n_pages, page_bytes);
  const uint64_t offset = pages_offset_for(n_pages);
  if (page_bytes > (std::numeric_limits<uint64_t>::max() - offset) / n_pages) {
    throw Error(Errc::out_of_range, "KV pages: " + std::to_string(n_pages) + " pages of " +
                                        std::to_string(page_bytes) + " bytes overflow");
  }
  return offset + uint64_t{n_pages} * page_bytes;
}

KvPages KvPages::format(uint8_t* base, uint64_t bytes, uint32_t n_pages, uint64_t page_bytes) {
  const uint64_t need = bytes_for(n_pages, page_bytes);
  if (base == nullptr || reinterpret_cast<uintptr_t>(base) % kPageAlignment != 0) {
    throw Error(Errc::invalid_argument, "KV pages: memory must be 4096-byte aligned");
  }
  if (bytes < need) {
    throw Error(Errc::out_of_range, "KV pages: " + std::to_string(n_pages) + " pages of " +
                                        std::to_string(page_bytes) + " bytes need " +
                                        std::to_string(need) + " bytes, region has " +
                                        std::to_string(bytes));
  }
  auto* header = new (base) Header{};
  header->magic = kMagic;
  header->version = kVersion;
  header->n_pages = n_pages;
  header->page_bytes = page_bytes;
  header->pages_offset = pages_offset_for(n_pages);
  header->total_bytes = need;
  auto* table = reinterpret_cast<Entry*>(base + sizeof(Header));
  for (uint32_t i = 0; i < n_pages; ++i) new (&table[i]) Entry{};
  std::atomic_thread_fence(std::memory_order_release);
  return KvPages(base, n_pages, page_bytes, header->pages_offset);
}

KvPages KvPages::format(Segment& segment, uint32_t n_pages, uint64_t page_bytes) {
  return format(segment.data(), segment.size(), n_pages, page_bytes);
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
  const bool geometry_ok = header->n_pages > 0 && header->page_bytes > 0 &&
                           header->page_bytes % 64 == 0 &&
                           header->pages_offset == pages_offset_for(header->n_pages);
  if (!geometry_ok || bytes_for(header->n_pages, header->page_bytes) != header->total_bytes ||
      header->total_bytes > bytes) {
    throw Error(Errc::bad_format, "KV pages: header geometry (" + std::to_string(header->n_pages) +
                                      " pages of " + std::to_string(header->page_bytes) +
                                      " bytes) is inconsistent or does not fit the " +
                                      std::to_string(bytes) + "-byte region");
  }
  return KvPages(base, header->n_pages, header->page_bytes, header->pages_offset);
}

KvPages KvPages::attach(Segment& segment) {
  KvPages kv = attach(segment.data(), segment.size());
  kv.writable_ = segment.writable();
  return kv;
}

void KvPages::check_writer(const char* op) const {
  if (!writable_) {
    throw Error(Errc::invalid_argument, std::string("KV pages: ") + op +
                                            " on a read-only mapping (readers cannot allocate)");
  }
}

KvPages::Entry* KvPages::entries() const {
  return reinterpret_cast<Entry*>(base_ + sizeof(Header));
}

std::vector<uint32_t> KvPages::alloc(uint32_t n, uint64_t owner) {
  check_writer("alloc");
  if (owner == kFree) throw Error(Errc::invalid_argument, "KV pages: owner 0 means free");
  Entry* table = entries();
  std::vector<uint32_t> picked;
  uint32_t next_ordinal = 0;
  for (uint32_t i = 0; i < n_pages_; ++i) {
    uint64_t o = table[i].owner.load(std::memory_order_relaxed);  // we are the only writer
    if (o == owner) {
      next_ordinal = std::max(next_ordinal, table[i].ordinal.load(std::memory_order_relaxed) + 1);
    } else if (o == kFree && picked.size() < n) {
      picked.push_back(i);
    }
  }
  if (picked.size() < n) {
    throw Error(Errc::busy, "KV cache full: owner " + std::to_string(owner) + " needs " +
                                std::to_string(n) + " pages, " + std::to_string(free_count()) +
                                " of " + std::to_string(n_pages_) + " are free");
  }
  for (uint32_t page : picked) {
    table[page].ordinal.store(next_ordinal++, std::memory_order_relaxed);
    table[page].owner.store(owner, std::memory_order_release);
  }
  return picked;
}

void KvPages::release(uint32_t page) {
  entries()[page].owner.store(kFree, std::memory_order_release);
}

uint32_t KvPages::free_owner(uint64_t owner) {
  check_writer("free_owner");
  if (owner == kFree) throw Error(Errc::invalid_argument, "KV pages: owner 0 means free");
  uint32_t freed = 0;
  Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    if (table[i].owner.load(std::memory_order_relaxed) == owner) {
      release(i);
      ++freed;
    }
  }
  return freed;
}

uint32_t KvPages::reclaim_except(std::span<const uint64_t> live) {
  check_writer("reclaim_except");
  uint32_t freed = 0;
  Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    uint64_t o = table[i].owner.load(std::memory_order_relaxed);
    if (o != kFree && std::find(live.begin(), live.end(), o) == live.end()) {
      release(i);
      ++freed;
    }
  }
  return freed;
}

std::vector<uint32_t> KvPages::pages_of(uint64_t owner) const {
  std::vector<std::pair<uint32_t, uint32_t>> by_ordinal;  // (ordinal, page)
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    if (owner != kFree && table[i].owner.load(std::memory_order_acquire) == owner) {
      by_ordinal.emplace_back(table[i].ordinal.load(std::memory_order_relaxed), i);
    }
  }
  std::sort(by_ordinal.begin(), by_ordinal.end());
  std::vector<uint32_t> pages;
  pages.reserve(by_ordinal.size());
  for (auto [ordinal, page] : by_ordinal) pages.push_back(page);
  return pages;
}

std::vector<uint64_t> KvPages::owners() const {
  std::vector<uint64_t> out;
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    uint64_t o = table[i].owner.load(std::memory_order_acquire);
    if (o != kFree) out.push_back(o);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

uint64_t KvPages::owner_of(uint32_t page) const {
  page_offset(page);  // range check
  return entries()[page].owner.load(std::memory_order_acquire);
}

uint32_t KvPages::free_count() const {
  uint32_t n = 0;
  const Entry* table = entries();
  for (uint32_t i = 0; i < n_pages_; ++i) {
    if (table[i].owner.load(std::memory_order_acquire) == kFree) ++n;
  }
  return n;
}

uint64_t KvPages::page_offset(uint32_t page) const {
  if (page >= n_pages_) {
    throw Error(Errc::out_of_range, "KV page " + std::to_string(page) + " past the segment's " +
                                        std::to_string(n_pages_) + " pages");
  }
  return pages_offset_ + uint64_t{page} * page_bytes_;
}

}  // namespace duet::shm
