#pragma once
// The names of an enum numbered 0..N-1 as one array in that order, instead of a switch per
// enum: enum_name() looks a value up, enum_value() a name (for parsers). Each table sits beside
// a static_assert that it has as many names as the enum has values (what -Wswitch checked for
// the switches), and the enum's tests check the names themselves.
#include <cstddef>
#include <optional>
#include <string_view>

namespace duet {

// `unknown` for a number outside the table (a value cast from a number off the wire).
template <typename E, size_t N>
constexpr std::string_view enum_name(const std::string_view (&names)[N], E value,
                                     std::string_view unknown) {
  const auto i = static_cast<size_t>(value);  // a negative value wraps past N
  return i < N ? names[i] : unknown;
}

template <typename E, size_t N>
constexpr std::optional<E> enum_value(const std::string_view (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == name) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace duet
