#include "core/ipc/stack_record.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/base/error.h"

namespace duet {

std::string stack_record_path(const std::string& run_dir) {
  return run_dir + "/services.json";
}

void write_stack_record(const std::string& run_dir, const StackRecord& record) {
  nlohmann::json services = nlohmann::json::array();
  for (const ServiceRecord& s : record.services)
    services.push_back({{"name", s.name},
                        {"pid", s.pid},
                        {"start_ticks", s.start_ticks},
                        {"argv", s.argv},
                        {"env", s.env}});
  const std::string text =
      nlohmann::json{{"supervisor_pid", record.supervisor_pid}, {"services", services}}.dump(1) +
      "\n";
  const std::string path = stack_record_path(run_dir);
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw Error(Errc::io, "cannot write '" + tmp + "': " + std::strerror(errno));
  const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int err = errno;
  close(fd);
  if (!written || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    throw Error(Errc::io, "cannot write '" + path + "': " + std::strerror(written ? errno : err));
  }
}

std::optional<StackRecord> read_stack_record(const std::string& run_dir) {
  std::ifstream f(stack_record_path(run_dir));
  if (!f) return std::nullopt;
  std::stringstream text;
  text << f.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(text.str());
    StackRecord r;
    r.supervisor_pid = j.at("supervisor_pid").get<int>();
    for (const auto& s : j.at("services")) {
      ServiceRecord sr;
      sr.name = s.at("name").get<std::string>();
      sr.pid = s.at("pid").get<int>();
      sr.start_ticks = s.at("start_ticks").get<uint64_t>();
      sr.argv = s.at("argv").get<std::vector<std::string>>();
      sr.env = s.at("env").get<std::vector<std::string>>();
      if (sr.pid < 0 || sr.argv.empty()) return std::nullopt;
      r.services.push_back(std::move(sr));
    }
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

uint64_t process_start_ticks(int pid) {
  if (pid <= 0) return 0;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return 0;
  // "pid (comm) S ppid ...": fields after the last ')' start at field 3 (the state).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3 && field == "Z") return 0;
    if (i == 22) {
      try {
        return std::stoull(field);
      } catch (const std::exception&) {
        return 0;
      }
    }
  }
  return 0;
}

int open_recorded_process(const ServiceRecord& service) {
  if (service.pid <= 0 || service.start_ticks == 0) return -1;
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, service.pid, 0));
  if (fd < 0) return -1;
  if (process_start_ticks(service.pid) != service.start_ticks) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

bool pidfd_signal(int pidfd, int sig) {
  return pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0) == 0;
}

int count_live_services(const StackRecord& record) {
  int live = 0;
  for (const ServiceRecord& s : record.services)
    if (const int fd = open_recorded_process(s); fd >= 0) {
      ++live;
      close(fd);
    }
  return live;
}

int stop_recorded_services(const StackRecord& record, int stop_timeout_ms) {
  int stopped = 0;
  for (const char* name : {"http_svc", "frontend", "solver_svc", "npu_svc", "gpu_svc"}) {
    for (const ServiceRecord& s : record.services) {
      if (s.name != name) continue;
      const int fd = open_recorded_process(s);
      if (fd < 0) continue;
      pidfd_signal(fd, SIGTERM);
      pollfd p{fd, POLLIN, 0};  // a pidfd turns readable when its process exits
      if (poll(&p, 1, stop_timeout_ms) <= 0) {
        pidfd_signal(fd, SIGKILL);
        p.revents = 0;
        (void)poll(&p, 1, stop_timeout_ms);
      }
      close(fd);
      ++stopped;
    }
  }
  return stopped;
}

}  // namespace duet
