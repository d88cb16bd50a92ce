#pragma once
// The arena: activation tensors in one shared segment, addressed by byte offsets from the
// segment's start (what a program's TensorRef.offset holds), never by pointers.
//
// ArenaLayout plans it: named slots, each 64-byte aligned, laid out in the order added. Reusing
// a slot layer after layer (HeteroInfer's buffer pool) is the caller's plan: a slot is named
// once ("attn_out") and every layer's ops point at it. Arena is the bounds-checked view of the
// mapped memory: every access names an offset and a byte count that must lie inside.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace duet::shm {

class Segment;

struct ArenaSlot {
  std::string name;
  uint64_t offset = 0;  // from the arena's start, a multiple of the layout's alignment
  uint64_t bytes = 0;
};

class ArenaLayout {
 public:
  static constexpr uint64_t kDefaultAlignment = 64;
  explicit ArenaLayout(uint64_t alignment = kDefaultAlignment);  // a power of two

  // Appends a slot; returns its offset. Errors: invalid_argument (empty or duplicate name,
  // bytes == 0), out_of_range (the layout would pass 2^62 bytes).
  uint64_t add(std::string name, uint64_t bytes);

  const ArenaSlot* find(std::string_view name) const;  // nullptr if absent
  const ArenaSlot& slot(std::string_view name) const;  // not_found if absent
  const std::vector<ArenaSlot>& slots() const { return slots_; }
  uint64_t alignment() const { return alignment_; }
  // Bytes an arena needs to hold every slot (the end of the last one, rounded up).
  uint64_t total_bytes() const { return end_; }

 private:
  uint64_t alignment_;
  uint64_t end_ = 0;
  std::vector<ArenaSlot> slots_;
};

class Arena {
 public:
  Arena(uint8_t* base, uint64_t bytes);
  explicit Arena(Segment& segment);

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }

  // out_of_range unless [offset, offset + bytes) lies inside the arena (overflow-safe).
  void check(uint64_t offset, uint64_t bytes) const;
  // out_of_range if the layout does not fit in this arena.
  void check(const ArenaLayout& layout) const;

  uint8_t* at(uint64_t offset, uint64_t bytes) const {
    check(offset, bytes);
    return base_ + offset;
  }
  uint8_t* at(const ArenaSlot& slot) const { return at(slot.offset, slot.bytes); }

  // A typed view of count elements at offset: bounds- and alignment-checked.
  template <typename T>
  T* as(uint64_t offset, uint64_t count) const {
    check_typed(offset, count, sizeof(T), alignof(T));
    return reinterpret_cast<T*>(base_ + offset);
  }

 private:
  void check_typed(uint64_t offset, uint64_t count, size_t elem_size, size_t elem_align) const;
  uint8_t* base_;
  uint64_t size_;
};

}  // namespace duet::shm
