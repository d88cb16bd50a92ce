#include "shm/arena.h"

#include <limits>

#include "core/base/error.h"
#include "shm/segment.h"

namespace duet::shm {
namespace {

constexpr uint64_t kMaxLayoutBytes = uint64_t{1} << 62;

std::string range_text(uint64_t offset, uint64_t bytes) {
  return "[" + std::to_string(offset) + ", +" + std::to_string(bytes) + ")";
}

}  // namespace

ArenaLayout::ArenaLayout(uint64_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    throw Error(Errc::invalid_argument,
                "arena alignment " + std::to_string(alignment) + " is not a power of two");
  }
}

uint64_t ArenaLayout::add(std::string name, uint64_t bytes) {
  if (name.empty()) throw Error(Errc::invalid_argument, "arena slot needs a name");
  if (find(name) != nullptr) {
    throw Error(Errc::invalid_argument, "arena slot '" + name + "' added twice");
  }
  if (bytes == 0) throw Error(Errc::invalid_argument, "arena slot '" + name + "' has 0 bytes");
  const uint64_t offset = end_;
  if (bytes > kMaxLayoutBytes - offset) {
    throw Error(Errc::out_of_range, "arena slot '" + name + "' of " + std::to_string(bytes) +
                                        " bytes makes the layout too large");
  }
  end_ = (offset + bytes + alignment_ - 1) & ~(alignment_ - 1);
  slots_.push_back(ArenaSlot{std::move(name), offset, bytes});
  return offset;
}

const ArenaSlot* ArenaLayout::find(std::string_view name) const {
  for (const ArenaSlot& s : slots_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const ArenaSlot& ArenaLayout::slot(std::string_view name) const {
  if (const ArenaSlot* s = find(name)) return *s;
  throw Error(Errc::not_found, "arena slot '" + std::string(name) + "' is not in the layout");
}

Arena::Arena(uint8_t* base, uint64_t bytes) : base_(base), size_(bytes) {
  if (base == nullptr && bytes != 0) {
    throw Error(Errc::invalid_argument, "arena: null base with a non-zero size");
  }
}

Arena::Arena(Segment& segment) : Arena(segment.data(), segment.size()) {}

void Arena::check(uint64_t offset, uint64_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) {
    throw Error(Errc::out_of_range, "arena access " + range_text(offset, bytes) +
                                        " is outside the arena of " + std::to_string(size_) +
                                        " bytes");
  }
}

void Arena::check(const ArenaLayout& layout) const {
  if (layout.total_bytes() > size_) {
    throw Error(Errc::out_of_range, "arena layout needs " + std::to_string(layout.total_bytes()) +
                                        " bytes, the arena has " + std::to_string(size_));
  }
}

void Arena::check_typed(uint64_t offset, uint64_t count, size_t elem_size,
                        size_t elem_align) const {
  if (count > std::numeric_limits<uint64_t>::max() / elem_size) {
    throw Error(Errc::out_of_range,
                "arena access of " + std::to_string(count) + " elements overflows");
  }
  check(offset, count * elem_size);
  if (reinterpret_cast<uintptr_t>(base_ + offset) % elem_align != 0) {
    throw Error(Errc::invalid_argument, "arena offset " + std::to_string(offset) +
                                            " is not aligned to " + std::to_string(elem_align) +
                                            " bytes");
  }
}

}  // namespace duet::shm
