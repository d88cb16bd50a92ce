#include "services/frontend/step_watch.h"

#include <future>

namespace duet::frontend {

StepWatch::StepWatch() : wake_("step watch") {}

std::optional<std::vector<float>> StepWatch::run(
    const Work& work, zmq::socket_t& socket, std::deque<msg::Envelope>& held, size_t max_held,
    const std::function<void(const msg::Envelope&)>& on_message) {
  auto result = std::async(std::launch::async, [&work, this] {
    const WakeFd::SignalOnExit signal = wake_.signal_on_exit();
    return work();
  });
  for (;;) {
    const short socket_events = held.size() < max_held ? short{ZMQ_POLLIN} : short{0};
    zmq::pollitem_t items[2] = {{nullptr, wake_.fd(), ZMQ_POLLIN, 0},
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
  wake_.drain();
  return result.get();
}

}  // namespace duet::frontend
