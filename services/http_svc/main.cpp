// http_svc: the OpenAI-compatible HTTP service of a stack (services/http_svc/http_server.h),
// supervised like the other services; the runtime (core/ipc/service.h) answers its heartbeats.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <memory>

#include "core/ipc/service.h"
#include "services/http_svc/http_server.h"

int main(int argc, char** argv) {
  using namespace duet;
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a death
  std::string listen = "127.0.0.1:8080", key_file;
  int listen_fd = -1;
  std::unique_ptr<http::HttpServer> server;
  return service_main(
      argc, argv, ServiceId::http,
      [&](ServiceLoop& loop) {
        http::HttpOptions o;
        http::parse_listen(listen, o);
        o.listen_fd = listen_fd;
        if (!key_file.empty()) o.api_key = http::read_api_key_file(key_file);
        o.stack_id = loop.options().stack_id;
        o.run_dir = loop.run_dir();
        o.model_path = loop.options().model_path;
        server = std::make_unique<http::HttpServer>(o, loop.logger());
        const int port = server->start();
        // Where a client finds a stack started with port 0 (tests, benchmarks).
        std::ofstream(loop.run_dir() + "/http.port") << port << "\n";
        loop.set_status([port, host = o.host] {
          return nlohmann::json{{"listen", host + ":" + std::to_string(port)}};
        });
      },
      [&](CLI::App& app) {
        app.add_option("--listen", listen, "[ADDR:]PORT to serve HTTP on (ADDR 127.0.0.1)")
            ->capture_default_str();
        app.add_option("--listen-fd", listen_fd,
                       "serve this inherited listening socket (the supervisor's, bound to "
                       "--listen) instead of binding one")
            ->check(CLI::NonNegativeNumber);
        app.add_option("--api-key-file", key_file,
                       "require 'Authorization: Bearer <key>', the key being this file's first "
                       "line");
      });
}
