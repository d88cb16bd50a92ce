#pragma once
// The code of the duet::Error a call throws, for tests that check which error bad input gets.
// Header-only.
#include <gtest/gtest.h>

#include <string>

#include "core/base/error.h"

namespace duet::test_support {

// Errc::ok when fn returns; otherwise the code of the Error it threw (its message into
// *message when given). Any other exception passes through.
template <class Fn>
Errc error_code_of(Fn&& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return Errc::ok;
}

// Expects fn to throw a duet::Error with `code` whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, Errc code, const std::string& needle) {
  std::string message;
  EXPECT_EQ(error_code_of(fn, &message), code)
      << "expected an error containing '" << needle << "'; got: " << message;
  EXPECT_NE(message.find(needle), std::string::npos) << message;
}

}  // namespace duet::test_support
