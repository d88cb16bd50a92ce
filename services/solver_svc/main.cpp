// solver_svc: the profiler and the partition solver. The service runtime (core/ipc/service.h)
// answers hello/heartbeat/status/shutdown; the solver's handlers register below.
#include <memory>

#include "core/ipc/service.h"
#include "services/solver_svc/solver_service.h"

int main(int argc, char** argv) {
  std::unique_ptr<duet::solver::SolverService> service;
  return duet::service_main(argc, argv, duet::ServiceId::solver,
                            [&service](duet::ServiceLoop& loop) {
                              service = std::make_unique<duet::solver::SolverService>(
                                  loop.options().soc, loop.options().model_path, loop.run_dir());
                              duet::solver::install_solver_handlers(loop, *service);
                            });
}
