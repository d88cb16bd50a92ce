#pragma once
// A TCP listening socket that outlives the process serving it (systemd's socket activation,
// done by the supervisor): the supervisor binds http_svc's address once and hands the socket to
// every http_svc it starts as fd kInheritedListenFd. While http_svc restarts, clients connecting
// wait in the kernel's accept queue instead of being refused; the next http_svc accepts them.
#include <string>

namespace duet {

// The fd number a service finds its inherited listening socket at (systemd's SD_LISTEN_FDS_START).
// Fixed, so that an adopting supervisor can take a copy back from a running http_svc.
inline constexpr int kInheritedListenFd = 3;

struct ListenAddress {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
};

// "[ADDR:]PORT" (ADDR "127.0.0.1" when absent; "[::1]:8080" for IPv6). Throws invalid_argument
// naming the spec.
ListenAddress parse_listen_address(const std::string& spec);

// A socket bound to `a` and listening with the largest backlog, close-on-exec. Throws
// unavailable naming the address when it cannot bind.
int open_listening_socket(const ListenAddress& a);

// True when fd is a TCP socket in the listening state.
bool is_listening_socket(int fd);

// The port fd is bound to, or -1.
int bound_port(int fd);

}  // namespace duet
