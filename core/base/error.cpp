#include "core/base/error.h"

namespace duet {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::ok:
      return "ok";
    case Errc::invalid_argument:
      return "invalid_argument";
    case Errc::not_found:
      return "not_found";
    case Errc::io:
      return "io";
    case Errc::bad_format:
      return "bad_format";
    case Errc::unsupported:
      return "unsupported";
    case Errc::out_of_range:
      return "out_of_range";
    case Errc::timeout:
      return "timeout";
    case Errc::unavailable:
      return "unavailable";
    case Errc::busy:
      return "busy";
    case Errc::cancelled:
      return "cancelled";
    case Errc::internal:
      return "internal";
  }
  return "unknown";
}

}  // namespace duet
