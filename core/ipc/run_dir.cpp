#include "core/ipc/run_dir.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/base/error.h"
#include "core/base/settings.h"

namespace duet {

namespace {

struct ServiceNames {
  ServiceId id;
  std::string_view exe;
  std::string_view short_name;
  std::string_view socket_file;
};

// The frontend's plain name is taken by its client socket (frontend.sock), so its control
// socket gets a distinct one.
constexpr std::array<ServiceNames, 5> kNames = {{
    {ServiceId::frontend, "frontend", "frontend", "frontend-control.sock"},
    {ServiceId::gpu, "gpu_svc", "gpu", "gpu.sock"},
    {ServiceId::npu, "npu_svc", "npu", "npu.sock"},
    {ServiceId::solver, "solver_svc", "solver", "solver.sock"},
    {ServiceId::http, "http_svc", "http", "http.sock"},
}};

const ServiceNames& names_of(ServiceId id) {
  for (const auto& n : kNames)
    if (n.id == id) return n;
  throw Error(Errc::internal, "unknown service id " + std::to_string(static_cast<int>(id)));
}

std::string join(const std::string& dir, std::string_view file) {
  std::string p = dir;
  if (p.empty() || p.back() != '/') p += '/';
  p += file;
  return p;
}

}  // namespace

std::string_view service_name(ServiceId id) {
  return names_of(id).exe;
}

ServiceId parse_service(std::string_view name) {
  for (const auto& n : kNames)
    if (name == n.exe || name == n.short_name) return n.id;
  throw Error(Errc::not_found,
              "unknown service '" + std::string(name) +
                  "' (expected one of: frontend, gpu_svc, npu_svc, solver_svc, http_svc)");
}

void validate_stack_id(std::string_view stack_id) {
  bool ok = !stack_id.empty() && stack_id.size() <= 32;
  for (char c : stack_id) {
    bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    ok = ok && (alnum || c == '_' || c == '-');
  }
  if (!ok)
    throw Error(Errc::invalid_argument, "invalid stack id '" + std::string(stack_id) +
                                            "': use 1-32 characters from [A-Za-z0-9_-]");
}

std::string run_root() {
  if (const auto root = setting_override("DUET_RUN_ROOT")) return *root;
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg && *xdg) return join(xdg, "duet");
  return "/tmp/duet-" + std::to_string(getuid());
}

std::string default_run_dir(std::string_view stack_id) {
  validate_stack_id(stack_id);
  return join(run_root(), stack_id);
}

std::string control_socket_path(const std::string& run_dir, ServiceId id) {
  return join(run_dir, names_of(id).socket_file);
}
std::string supervisor_socket_path(const std::string& run_dir) {
  return join(run_dir, "supervisor.sock");
}
std::string client_socket_path(const std::string& run_dir) {
  return join(run_dir, "frontend.sock");
}
std::string pid_file_path(const std::string& run_dir) {
  return join(run_dir, "supervisor.pid");
}
std::string log_path(const std::string& run_dir, std::string_view name) {
  return join(run_dir, std::string(name) + ".log");
}

std::string ipc_endpoint(const std::string& socket_path) {
  if (socket_path.empty() || socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    throw Error(Errc::invalid_argument, "socket path '" + socket_path +
                                            "' is empty or longer than " +
                                            std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) +
                                            " bytes (a unix socket limit): use a shorter run dir");
  return "ipc://" + socket_path;
}

void make_private_dir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) throw Error(Errc::io, "cannot create directory '" + path + "': " + ec.message());
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0)
    throw Error(Errc::io, "cannot stat '" + path + "': " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) throw Error(Errc::io, "'" + path + "' is not a directory");
  if (st.st_uid != geteuid())
    throw Error(Errc::io, "directory '" + path + "' belongs to uid " + std::to_string(st.st_uid) +
                              ", not to us: refusing to use it");
  if (chmod(path.c_str(), 0700) != 0)
    throw Error(Errc::io, "cannot chmod 0700 '" + path + "': " + std::strerror(errno));
}

std::string executable_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw Error(Errc::io, std::string("cannot read /proc/self/exe: ") + strerror(errno));
  buf[n] = '\0';
  return std::filesystem::path(buf).parent_path().string();
}

std::string absolute_path(const std::string& path) {
  if (path.empty()) return path;
  return std::filesystem::absolute(path).lexically_normal().string();
}

bool process_alive(int pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  size_t close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

uint64_t monotonic_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace duet
