#include "services/frontend/wake_fd.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/base/error.h"

namespace duet::frontend {

WakeFd::WakeFd(const char* owner) : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0)
    throw Error(Errc::internal, std::string(owner) + ": eventfd: " + std::strerror(errno));
}

WakeFd::~WakeFd() {
  if (fd_ >= 0) close(fd_);
}

void WakeFd::drain() const {
  uint64_t count = 0;
  (void)!read(fd_, &count, sizeof count);  // EAGAIN when nothing was signalled: fine
}

WakeFd::SignalOnExit::~SignalOnExit() {
  const uint64_t one = 1;
  (void)!write(fd, &one, sizeof one);
}

}  // namespace duet::frontend
