#pragma once
// Where a stack lives on disk: one private run directory per stack id holding the control sockets,
// the logs and the supervisor's pid/lock file. Every process of a stack (supervisor, services,
// the `duet stack` verbs) derives the same paths from the stack id, so nothing is passed around
// but the id and, optionally, an explicit run dir.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet {

// The supervised services. The first four always run, in start order (kAllServices); http_svc
// (the OpenAI-compatible HTTP door, a client of the frontend) runs only when `stack up --http`
// asks for it.
enum class ServiceId : uint8_t { frontend = 0, gpu = 1, npu = 2, solver = 3, http = 4 };
inline constexpr std::array<ServiceId, 4> kAllServices = {ServiceId::frontend, ServiceId::gpu,
                                                          ServiceId::npu, ServiceId::solver};

std::string_view service_name(ServiceId id);  // the executable name: "frontend", "gpu_svc", ...
// Accepts the executable name or its short form ("gpu_svc" or "gpu"); throws not_found naming
// the valid names.
ServiceId parse_service(std::string_view name);

inline constexpr std::string_view kDefaultStackId = "default";

// Stack ids go into file and shm names ("/duet-<stack>-arena"): 1-32 characters from
// [A-Za-z0-9_-], the rule of shm::validate_stack_id (shm/segment.h).
void validate_stack_id(std::string_view stack_id);  // throws invalid_argument

// $DUET_RUN_ROOT, else $XDG_RUNTIME_DIR/duet, else /tmp/duet-<uid>.
std::string run_root();
std::string default_run_dir(std::string_view stack_id);  // run_root()/<stack>

std::string control_socket_path(const std::string& run_dir, ServiceId id);  // gpu.sock, ...
std::string supervisor_socket_path(const std::string& run_dir);             // supervisor.sock
std::string client_socket_path(const std::string& run_dir);                 // frontend.sock
std::string pid_file_path(const std::string& run_dir);                      // supervisor.pid
std::string log_path(const std::string& run_dir, std::string_view name);    // <name>.log

// "ipc://<path>"; throws invalid_argument when the path does not fit a unix socket address.
std::string ipc_endpoint(const std::string& socket_path);

// Creates the directory (and missing parents) and makes it mode 0700; throws io if it exists but
// is not a directory owned by us.
void make_private_dir(const std::string& path);

// The directory holding the running executable (/proc/self/exe), where sibling binaries live.
std::string executable_dir();

// Path made absolute against the current directory (no symlink resolution).
std::string absolute_path(const std::string& path);

// True while the process exists and is not a zombie (a zombie's pid still answers kill(pid, 0)).
bool process_alive(int pid);

// Milliseconds on the monotonic clock, for ages and deadlines.
uint64_t monotonic_ms();

}  // namespace duet
