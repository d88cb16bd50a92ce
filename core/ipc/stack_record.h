#pragma once
// What a supervisor leaves for its successor: the services it runs (name, pid, the process's start
// time, the argv and DUET_* environment it started them with), in <run dir>/services.json,
// rewritten (write + rename) at every start and exit. A supervisor killed with -9 leaves its
// services running; the next `duet stack up` on the same stack id reads this record, checks each
// pid against the process it names (start time from /proc, then held by a pidfd so a reused pid
// can never be mistaken for it) and adopts the live ones (issue 22). `duet stack status` and
// `down` read it too while no supervisor runs.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace duet {

struct ServiceRecord {
  std::string name;          // the executable name, "gpu_svc"
  int pid = 0;               // 0: not running when the record was written
  uint64_t start_ticks = 0;  // /proc/<pid>/stat field 22 (clock ticks since boot)
  std::vector<std::string> argv;
  std::vector<std::string> env;  // DUET_* variables it was started with ("NAME=value")
};

struct StackRecord {
  int supervisor_pid = 0;
  std::vector<ServiceRecord> services;
};

std::string stack_record_path(const std::string& run_dir);  // <run dir>/services.json

// Atomic for readers (a temp file renamed over the old one), mode 0600. Throws io.
void write_stack_record(const std::string& run_dir, const StackRecord& record);

// The record, or nullopt when there is none or it does not parse as one (a torn or foreign file
// is never trusted: the caller falls back to reclaiming).
std::optional<StackRecord> read_stack_record(const std::string& run_dir);

// /proc/<pid>/stat's start time; 0 when the process does not exist or is a zombie.
uint64_t process_start_ticks(int pid);

// A pidfd (O_CLOEXEC) for the recorded process if it is still the one recorded (same pid and start
// time, not a zombie); -1 otherwise. The check is made after the pidfd is open, so the fd refers
// to the recorded process even if the pid is reused a moment later.
int open_recorded_process(const ServiceRecord& service);

// Sends a signal through a pidfd (pidfd_send_signal). False if the process is gone.
bool pidfd_signal(int pidfd, int sig);

// How many of the record's services still run (checked as open_recorded_process does).
int count_live_services(const StackRecord& record);

// Stops the record's services that still run, clients first (http_svc, frontend, then the
// devices): SIGTERM, then SIGKILL after stop_timeout_ms. Returns how many it stopped.
int stop_recorded_services(const StackRecord& record, int stop_timeout_ms);

}  // namespace duet
