#include "core/base/error.h"

#include "core/base/enum_names.h"

namespace duet {

namespace {

constexpr std::string_view kErrcNames[] = {
    "ok",           "invalid_argument", "not_found",   "io",   "bad_format", "unsupported",
    "out_of_range", "timeout",          "unavailable", "busy", "cancelled",  "internal"};
static_assert(std::size(kErrcNames) == static_cast<size_t>(Errc::internal) + 1,
              "a name for every Errc, in order");

}  // namespace

std::string_view errc_name(Errc code) {
  return enum_name(kErrcNames, code, "unknown");
}

}  // namespace duet
