#pragma once
// http_svc's server: OpenAI's HTTP API (and llama-server's /health, /tokenize, /detokenize,
// Prometheus /metrics) in front of a stack, as a client of the frontend's client API
// (core/ipc/client.h) and of the supervisor's status: no second path into the engine.
//
// Threading: cpp-httplib runs each connection on a worker of its thread pool (`workers`,
// default 96). A request opens its own DEALER to the frontend, so a streaming response is one
// worker blocked on its own socket: no shared dispatcher, no lock between streams. A stream's
// worker sends the frontend a KeepAlive every third of heartbeat_ms; a client that goes away
// fails the next write and its request is cancelled at once; a killed http_svc stops the
// KeepAlives and the frontend reaps its requests within heartbeat_ms.
#include <spdlog/logger.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "services/http_svc/http_metrics.h"

namespace httplib {
class Server;
}

namespace duet::http {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 0;         // 0: any free port (written to <run dir>/http.port)
  int listen_fd = -1;   // >= 0: serve this inherited listening socket instead of binding
  std::string api_key;  // "" = no authentication
  std::string stack_id = "default";
  std::string run_dir;     // the stack's run dir
  std::string model_path;  // its model; the model id is the file name without .gguf
  size_t max_body_bytes = size_t{4} << 20;
  int read_timeout_s = 10;   // a client must send its headers and body within this
  int write_timeout_s = 30;  // ... and take our bytes within this
  int workers = 96;
  std::chrono::milliseconds request_timeout = std::chrono::minutes(10);
};

// "[ADDR:]PORT" (ADDR "127.0.0.1" when absent; "[::1]:8080" for IPv6). Throws
// invalid_argument naming the spec.
void parse_listen(const std::string& spec, HttpOptions& o);
// The key: the file's first line without surrounding whitespace. Throws when missing or empty.
std::string read_api_key_file(const std::string& path);
// OpenAI's model id of a GGUF path: "models/fortune-q8_0.gguf" -> "fortune-q8_0".
std::string model_id(const std::string& model_path);

class HttpServer {
 public:
  HttpServer(HttpOptions options, std::shared_ptr<spdlog::logger> log);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (throws unavailable naming the address when it cannot) and serves on a thread of its
  // own; returns the bound port.
  int start();
  void stop();

  const HttpMetrics& metrics() const { return metrics_; }
  struct Impl;

 private:
  HttpOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<httplib::Server> server_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  HttpMetrics metrics_;
};

}  // namespace duet::http
