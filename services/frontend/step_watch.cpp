#include "services/frontend/step_watch.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <string>

#include "core/error.h"

namespace duet::frontend {

StepWatch::StepWatch() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0)
    throw Error(Errc::internal, std::string("step watch: eventfd: ") + std::strerror(errno));
}

StepWatch::~StepWatch() {
  if (fd_ >= 0) close(fd_);
}

std::optional<std::vector<float>> StepWatch::run(
    const Work& work, zmq::socket_t& socket, std::deque<msg::Envelope>& held, size_t max_held,
    const std::function<void(const msg::Envelope&)>& on_message) {
  const int fd = fd_;
  auto result = std::async(std::launch::async, [&work, fd] {
    // Signalled however work ends, so the serving thread wakes at once.
    struct Signal {
      int fd;
      ~Signal() {
        const uint64_t one = 1;
        (void)!write(fd, &one, sizeof one);
      }
    } signal{fd};
    return work();
  });
  for (;;) {
    const short socket_events = held.size() < max_held ? short{ZMQ_POLLIN} : short{0};
    zmq::pollitem_t items[2] = {{nullptr, fd_, ZMQ_POLLIN, 0},
                                {static_cast<void*>(socket), 0, socket_events, 0}};
    try {
      // The eventfd ends the wait; the timeout only re-checks the future should a wake be lost.
      zmq::poll(items, 2, std::chrono::milliseconds(50));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      msg::Envelope env;
      while (held.size() < max_held && msg::try_recv_envelope(socket, env)) {
        on_message(env);
        held.push_back(std::move(env));
        env = msg::Envelope{};
      }
    }
    if ((items[0].revents & ZMQ_POLLIN) ||
        result.wait_for(std::chrono::seconds(0)) == std::future_status::ready)
      break;
  }
  uint64_t drained = 0;
  (void)!read(fd_, &drained, sizeof drained);
  return result.get();
}

}  // namespace duet::frontend
