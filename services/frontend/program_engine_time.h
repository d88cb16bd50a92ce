#pragma once
// The clock ProgramEngine times registration and steps with (internal to program_engine*.cpp).
#include <chrono>
#include <cstdint>

namespace duet::frontend::engine_time {

using Clock = std::chrono::steady_clock;

inline double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

inline int64_t ns_of(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace duet::frontend::engine_time
