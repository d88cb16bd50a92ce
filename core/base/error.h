#pragma once
// Errors in duet are exceptions that carry a code and a message, or values (Result) where a
// caller is expected to handle the failure. Never silent: every failure names its problem.
#include <stdexcept>
#include <string>
#include <string_view>

namespace duet {

enum class Errc : int {
  ok = 0,
  invalid_argument = 1,  // the caller sent something malformed or out of range
  not_found = 2,         // a file, tensor, key, graph, program or service that does not exist
  io = 3,                // the OS refused (open, mmap, read, shm_open, ...)
  bad_format = 4,        // a file or message that fails validation
  unsupported = 5,       // valid but not implemented (a tensor type, a GGUF version)
  out_of_range = 6,      // a size, count or offset past a limit
  timeout = 7,           // a deadline passed
  unavailable = 8,       // a peer is down, restarting or degraded
  busy = 9,              // a limit (queue, concurrency, context) is exhausted
  cancelled = 10,        // the request was cancelled
  internal = 11,         // a bug: an invariant that should hold did not
};

std::string_view errc_name(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

}  // namespace duet
