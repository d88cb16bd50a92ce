// core/base/enum_names: an enum's names from one table, looked up both ways, with a fallback for
// a number outside the table; and Errc's names, which error replies and logs carry.
#include "core/base/enum_names.h"

#include <gtest/gtest.h>

#include "core/base/error.h"

namespace duet {
namespace {

enum class Colour : uint8_t { red, green, blue };
constexpr std::string_view kColourNames[] = {"red", "green", "blue"};

TEST(EnumNames, NamesAndValuesBothWaysAndAFallbackOutsideTheTable) {
  EXPECT_EQ(enum_name(kColourNames, Colour::red, "?"), "red");
  EXPECT_EQ(enum_name(kColourNames, Colour::blue, "?"), "blue");
  EXPECT_EQ(enum_name(kColourNames, static_cast<Colour>(3), "?"), "?");
  EXPECT_EQ(enum_value<Colour>(kColourNames, "green"), Colour::green);
  EXPECT_EQ(enum_value<Colour>(kColourNames, "Green"), std::nullopt);
  EXPECT_EQ(enum_value<Colour>(kColourNames, ""), std::nullopt);
}

TEST(EnumNames, EveryErrcHasItsNameAndOthersAreUnknown) {
  // The codes by error.h's numbers; logs and error messages carry these names.
  const char* names[] = {
      "ok",           "invalid_argument", "not_found",   "io",   "bad_format", "unsupported",
      "out_of_range", "timeout",          "unavailable", "busy", "cancelled",  "internal"};
  for (int code = 0; code < 12; ++code)
    EXPECT_EQ(errc_name(static_cast<Errc>(code)), names[code]) << code;
  EXPECT_EQ(errc_name(Errc::internal), "internal");
  EXPECT_EQ(errc_name(static_cast<Errc>(12)), "unknown");
  EXPECT_EQ(errc_name(static_cast<Errc>(-1)), "unknown");
}

}  // namespace
}  // namespace duet
