#pragma once
// The dot-product kernels (core/model/ops_dot.cpp, services/npu_svc/npu_dot.cpp) are templates on
// how many independent streams they interleave, so each stream's accumulators stay in
// registers; a call picks the instance for its count at run time, here. Header-only: the
// switch inlines into each caller as if written there.
#include <type_traits>

namespace duet {

constexpr int kMaxDotStreams = 4;

// fn(std::integral_constant<int, count>{}) for count in 1..kMaxDotStreams; nothing otherwise.
template <class Fn>
inline void with_stream_count(int count, Fn&& fn) {
  static_assert(kMaxDotStreams == 4, "one case per count");
  switch (count) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 3:
      return fn(std::integral_constant<int, 3>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
  }
}

}  // namespace duet
