#include "core/ipc/listen_socket.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core/base/error.h"

namespace duet {

ListenAddress parse_listen_address(const std::string& spec) {
  ListenAddress a;
  std::string port = spec;
  if (!spec.empty() && spec.front() == '[') {
    const size_t close = spec.find("]:");
    if (close == std::string::npos)
      throw Error(Errc::invalid_argument, "listen address '" + spec + "': use [ADDR]:PORT");
    a.host = spec.substr(1, close - 1);
    port = spec.substr(close + 2);
  } else if (const size_t colon = spec.rfind(':'); colon != std::string::npos) {
    a.host = spec.substr(0, colon);
    port = spec.substr(colon + 1);
  }
  size_t used = 0;
  int p = -1;
  try {
    p = std::stoi(port, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (a.host.empty() || port.empty() || used != port.size() || p < 0 || p > 65535)
    throw Error(Errc::invalid_argument,
                "listen address '" + spec + "': use [ADDR:]PORT with PORT in 0..65535");
  a.port = p;
  return a;
}

int open_listening_socket(const ListenAddress& a) {
  const std::string where = a.host + ":" + std::to_string(a.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(a.host.c_str(), std::to_string(a.port).c_str(), &hints, &found))
    throw Error(Errc::unavailable, "cannot listen on " + where + ": " + gai_strerror(rc));
  std::string why = "no address";
  int fd = -1;
  for (addrinfo* ai = found; ai && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // past TIME_WAIT of a last run
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      why = std::strerror(errno);
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0)
    throw Error(Errc::unavailable, "cannot listen on " + where + " (" + why +
                                       "; in use, or not an address of this machine)");
  return fd;
}

bool is_listening_socket(int fd) {
  int listening = 0, type = 0;
  socklen_t n = sizeof listening, m = sizeof type;
  return getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) == 0 && listening == 1 &&
         getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &m) == 0 && type == SOCK_STREAM;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t n = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &n) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

}  // namespace duet
