#pragma once
// The log files of a stack's processes: <run dir>/<name>.log, capped by size and rotated
// (<name>.1.log is the previous one, up to <name>.<files>.log; the oldest is deleted), so a stack
// that runs for weeks keeps at most (files + 1) x max_bytes of log per process.
//
// A service's stdout/stderr (an abort message, a sanitizer report) are its log file too: the
// supervisor opens <name>.log for them before exec. When the sink finds fd 2 already writing to
// that file it re-points fds 1 and 2 at every new file it opens, so those messages follow the
// rotation instead of landing in a renamed or deleted file.
#include <cstdint>
#include <string>
#include <string_view>

#include <spdlog/sinks/sink.h>

namespace duet {

struct LogLimits {
  uint64_t max_bytes = 16ull << 20;  // one file
  uint32_t files = 3;                // rotated files kept besides the current one
  // DUET_LOG_MAX_BYTES / DUET_LOG_FILES override the defaults (Error naming a bad value).
  static LogLimits from_env();
};

// A thread-safe rotating sink for <run_dir>/<name>.log (run_dir must exist).
spdlog::sink_ptr make_log_file_sink(const std::string& run_dir, std::string_view name,
                                    const LogLimits& limits = LogLimits::from_env());

}  // namespace duet
