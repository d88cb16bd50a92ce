#include "core/ipc/log_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <spdlog/sinks/rotating_file_sink.h>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/run_dir.h"

namespace duet {
namespace {

// fd 2 writes to `path` (the supervisor redirected our stdio into our log).
bool stderr_is(const std::string& path) {
  struct stat err {
  }, file{};
  return fstat(2, &err) == 0 && stat(path.c_str(), &file) == 0 && err.st_dev == file.st_dev &&
         err.st_ino == file.st_ino;
}

}  // namespace

LogLimits LogLimits::from_env() {
  LogLimits l;
  // The registry's defaults are LogLimits' own (core/base/settings.cpp).
  l.max_bytes = static_cast<uint64_t>(setting_int("DUET_LOG_MAX_BYTES"));
  l.files = static_cast<uint32_t>(setting_int("DUET_LOG_FILES"));
  return l;
}

spdlog::sink_ptr make_log_file_sink(const std::string& run_dir, std::string_view name,
                                    const LogLimits& limits) {
  const std::string path = log_path(run_dir, name);
  spdlog::file_event_handlers events;
  if (stderr_is(path)) {
    events.after_open = [](const spdlog::filename_t&, std::FILE* f) {
      std::fflush(stdout);
      std::fflush(stderr);
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    };
  }
  try {
    return std::make_shared<spdlog::sinks::rotating_file_sink_mt>(
        path, static_cast<size_t>(limits.max_bytes), limits.files, false, events);
  } catch (const spdlog::spdlog_ex& e) {
    throw Error(Errc::io, "cannot open log file " + path + ": " + e.what());
  }
}

}  // namespace duet
