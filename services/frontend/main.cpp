// frontend: the client API, scheduler and step executor. Two sockets: the control socket every
// service has (answered by core/service.h), and the client socket frontend.sock that `duet
// generate/chat/eval/status` talk to (schemas/client.fbs), served by frontend::Frontend.
//
// The engine: DUET_PLAN=reference (the default until the device executor is wired here) runs
// core ReferenceForward in this process.
#include <cstdlib>
#include <memory>
#include <string>

#include "core/error.h"
#include "core/model.h"
#include "core/service.h"
#include "services/frontend/frontend.h"
#include "services/frontend/reference_engine.h"

namespace {

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<duet::LlamaModel> model;
  std::unique_ptr<duet::frontend::Frontend> frontend;
  const int rc =
      duet::service_main(argc, argv, duet::ServiceId::frontend, [&](duet::ServiceLoop& loop) {
        using namespace duet;
        const std::string plan = env_or("DUET_PLAN", "reference");
        if (loop.options().model_path.empty())
          throw Error(Errc::invalid_argument, "frontend: --model is required");
        if (plan != "reference")
          throw Error(Errc::unsupported, "frontend: plan '" + plan +
                                             "' needs the device executor, which is not wired into "
                                             "the frontend yet (DUET_PLAN=reference works)");
        model = LlamaModel::load(loop.options().model_path);
        frontend = std::make_unique<frontend::Frontend>(
            std::make_unique<frontend::ReferenceEngine>(*model), loop.run_dir());
        loop.log().info("serving {} with plan {} on {}", loop.options().model_path, plan,
                        frontend->socket_path());
        // Steps run from the loop's hooks with a time budget, so the control socket (heartbeats)
        // is answered between them; a short idle tick keeps the gap between budgets small.
        auto pump = [&loop, &frontend] {
          try {
            frontend->pump_for(std::chrono::milliseconds(50));
          } catch (const std::exception& e) {
            loop.log().error("frontend: {}", e.what());  // a bug: log it, keep serving the rest
          }
        };
        loop.add_socket(frontend->socket(), pump);
        loop.set_idle(pump, 2);
        loop.set_status([&] { return frontend->status(); });
      });
  frontend.reset();  // before the model it reads
  return rc;
}
