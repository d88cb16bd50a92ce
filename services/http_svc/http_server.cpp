#include "services/http_svc/http_server.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/base/settings.h"
#include "core/ipc/listen_socket.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "services/http_svc/http_context.h"

namespace duet::http {

using nlohmann::json;
using namespace std::chrono_literals;

void parse_listen(const std::string& spec, HttpOptions& o) {
  const ListenAddress a = parse_listen_address(spec);
  o.host = a.host;
  o.port = a.port;
}

std::string read_api_key_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(Errc::not_found, "API key file '" + path + "' cannot be read");
  std::string line;
  std::getline(f, line);
  const auto b = line.find_first_not_of(" \t\r\n");
  const auto e = line.find_last_not_of(" \t\r\n");
  if (b == std::string::npos)
    throw Error(Errc::invalid_argument, "API key file '" + path + "' has no key on its first line");
  return line.substr(b, e - b + 1);
}

std::string model_id(const std::string& model_path) {
  std::string name = std::filesystem::path(model_path).filename().string();
  if (name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? "duet" : name;
}

const ServedModel& ServerContext::pick_model(const std::string& name,
                                             std::string& frontend_name) const {
  frontend_name.clear();
  if (name.empty()) return models.front();
  for (size_t i = 0; i < models.size(); ++i)
    if (models[i].name == name) {
      // The default goes by no name: a one-model stack's frontend knows its model by the file's
      // stem, which need not be its HTTP id (model_id keeps a non-.gguf extension).
      if (i > 0) frontend_name = name;
      return models[i];
    }
  throw ApiError(404, "invalid_request_error",
                 "the model '" + name + "' does not exist; this stack serves " +
                     (models.size() == 1 ? "'" + models.front().name + "'" : model_names(models)) +
                     " (GET /v1/models)",
                 "model", "model_not_found");
}

// The models http_svc names: DUET_MODELS's, else the one --model by its id.
std::vector<ServedModel> http_models(const std::string& model_path) {
  if (setting_override("DUET_MODELS")) return stack_models(model_path);
  return {ServedModel{model_id(model_path), model_path}};
}

std::string ServerContext::frontend_endpoint() const {
  return client::stack_endpoint(options.stack_id, options.run_dir);
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(e.to_json().dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
}

namespace {

// Equal keys in time independent of where they differ and of their lengths (SHA-256 first).
bool same_key(const std::string& given, const std::string& key) {
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(key.data()), key.size(), b);
  return CRYPTO_memcmp(a, b, sizeof(a)) == 0;
}

std::string outcome_of(int status) {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 404:
      return "not_found";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 503:
      return "service_unavailable";
    default:
      return status < 400 ? "ok" : "error_" + std::to_string(status);
  }
}

}  // namespace

struct HttpServer::Impl {
  ServerContext ctx;
  int listen_fd = -1;  // the listening socket, to widen its backlog after httplib's listen()

  // The supervisor's status (null when it does not answer within the deadline).
  json supervisor_status() const {
    try {
      msg::RequestClient c(ipc_endpoint(supervisor_socket_path(ctx.options.run_dir)));
      auto reply = c.call([](uint64_t id) { return msg::make_status_request(id); }, 1000ms);
      const auto* r = reply.message().body_as_StatusReply();
      return r && r->json() ? json::parse(r->json()->str()) : json(nullptr);
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  json frontend_status() const {
    try {
      client::Client c(ctx.frontend_endpoint());
      return c.status(1000ms);
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  // GET /health: 200 while every supervised service is healthy, else 503 naming why.
  void health(httplib::Response& res) const {
    const json sup = supervisor_status();
    if (!sup.is_object())
      return send_error(res, ApiError(503, "service_unavailable",
                                      "the stack's supervisor does not answer", "", "degraded"));
    if (sup.value("state", "") == "healthy") {
      res.set_content(json{{"status", "ok"}, {"stack", ctx.options.stack_id}}.dump(),
                      "application/json");
      return;
    }
    std::string why;
    for (const json& s : sup.value("services", json::array()))
      if (s.value("state", "") != "healthy")
        why += (why.empty() ? "" : "; ") + s.value("name", "?") + " " + s.value("state", "?") +
               (s.value("last_exit", "").empty() ? "" : " (" + s.value("last_exit", "") + ")");
    send_error(res, ApiError(503, "service_unavailable",
                             "stack " + ctx.options.stack_id + " is " + sup.value("state", "?") +
                                 (why.empty() ? "" : ": " + why),
                             "", "degraded"));
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) const {
    json body = parse_object(req.body);
    if (!body.contains("content") || !body["content"].is_string())
      throw bad_request("content", "'content' (the text to tokenize) must be a string");
    const bool add_special = optional_bool(body, "add_special");
    const bool with_pieces = optional_bool(body, "with_pieces");
    const bool parse_special = optional_bool(body, "parse_special");
    client::Client c(ctx.frontend_endpoint());
    c.set_model(model_of(body));
    const client::TokenizeResult t =
        c.tokenize(body["content"].get<std::string>(), add_special, parse_special);
    json tokens = json::array();
    for (size_t i = 0; i < t.ids.size(); ++i) {
      if (with_pieces)
        tokens.push_back({{"id", t.ids[i]}, {"piece", i < t.pieces.size() ? t.pieces[i] : ""}});
      else
        tokens.push_back(t.ids[i]);
    }
    res.set_content(json{{"tokens", tokens}}.dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) const {
    json body = parse_object(req.body);
    if (!body.contains("tokens") || !body["tokens"].is_array())
      throw bad_request("tokens", "'tokens' must be an array of token ids");
    std::vector<int32_t> ids;
    for (const json& t : body["tokens"]) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        throw bad_request("tokens", "'tokens' must hold non-negative integers only");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    client::Client c(ctx.frontend_endpoint());
    c.set_model(model_of(body));
    res.set_content(
        json{{"content", c.detokenize(ids)}}.dump(-1, ' ', false, json::error_handler_t::replace),
        "application/json");
  }

  // /tokenize and /detokenize take an optional "model" (an extension of llama-server's shapes).
  std::string model_of(const json& body) const {
    std::string name;
    if (body.contains("model")) {
      if (!body["model"].is_string()) throw bad_request("model", "'model' must be a string");
      (void)ctx.pick_model(body["model"].get<std::string>(), name);
    }
    return name;
  }

  static json parse_object(const std::string& text) {
    json body;
    try {
      body = json::parse(text);
    } catch (const json::parse_error& e) {
      throw ApiError(400, "invalid_request_error",
                     std::string("the request body is not valid JSON: ") + e.what());
    }
    if (!body.is_object())
      throw ApiError(400, "invalid_request_error", "the request body must be a JSON object");
    return body;
  }

  static bool optional_bool(const json& body, const char* name) {
    if (!body.contains(name) || body[name].is_null()) return false;
    if (!body[name].is_boolean())
      throw bad_request(name, std::string("'") + name + "' must be true or false");
    return body[name].get<bool>();
  }

  // Runs a route: ApiError and duet::Error become OpenAI's error shape, nothing escapes as 500
  // for bad input; the outcome is counted.
  template <class F>
  void guarded(const char* endpoint, httplib::Response& res, F&& f) {
    std::string outcome;
    try {
      outcome = f();
    } catch (const ApiError& e) {
      send_error(res, e);
      outcome = e.type();
    } catch (const Error& e) {
      const ApiError a = from_duet_error(e);
      send_error(res, a);
      outcome = a.type();
    } catch (const std::exception& e) {
      ctx.log.error("{}: {}", endpoint, e.what());
      send_error(res, ApiError(500, "server_error", std::string("http_svc: ") + e.what()));
      outcome = "server_error";
    }
    if (!outcome.empty()) ctx.metrics.count(endpoint, outcome);
  }

  void install(httplib::Server& s) {
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (ctx.options.api_key.empty() || req.path == "/health")
        return httplib::Server::HandlerResponse::Unhandled;
      const std::string auth = req.get_header_value("Authorization");
      if (auth.starts_with("Bearer ") && same_key(auth.substr(7), ctx.options.api_key))
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, ApiError(401, "authentication_error",
                               auth.empty() ? "missing 'Authorization: Bearer <key>' header"
                                            : "invalid API key",
                               "", "invalid_api_key"));
      ctx.metrics.count("auth", "authentication_error");
      return httplib::Server::HandlerResponse::Handled;
    });
    // httplib's own refusals (unknown path, body too large, bad request line) get OpenAI's
    // shape too; responses that already carry a body are ours and stay as they are.
    s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == 404)
        send_error(res, ApiError(404, "invalid_request_error",
                                 "unknown path " + req.method + " " + req.path +
                                     " (GET /v1/models, POST /v1/completions, POST "
                                     "/v1/chat/completions, GET /health, GET /metrics, POST "
                                     "/tokenize, POST /detokenize)",
                                 "", "unknown_url"));
      else if (res.status == 413)
        send_error(res, too_large());
      else
        send_error(res,
                   ApiError(res.status, "invalid_request_error",
                            "the request was refused (HTTP " + std::to_string(res.status) + ")"));
      ctx.metrics.count("other", outcome_of(res.status));
    });
    s.set_exception_handler(
        [this](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          send_error(res, ApiError(500, "server_error", "http_svc: unexpected exception"));
        });

    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      health(res);
      ctx.metrics.count("health", outcome_of(res.status));
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(ctx.metrics.render(frontend_status(), supervisor_status()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      guarded("models", res, [&] {
        json data = json::array();
        for (const ServedModel& m : ctx.models)
          data.push_back({{"id", m.name},
                          {"object", "model"},
                          {"created", 0},
                          {"owned_by", "duet"},
                          {"duet",
                           {{"path", m.path},
                            {"stack", ctx.options.stack_id},
                            {"default", m.name == ctx.model}}}});
        res.set_content(json{{"object", "list"}, {"data", data}}.dump(), "application/json");
        return std::string("ok");
      });
    });
    post_json(s, "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      guarded("completions", res,
              [&] { return serve_completion(ctx, Endpoint::completions, req, res); });
    });
    post_json(
        s, "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
          guarded("chat", res, [&] { return serve_completion(ctx, Endpoint::chat, req, res); });
        });
    post_json(s, "/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded("tokenize", res, [&] {
        tokenize(req, res);
        return std::string("ok");
      });
    });
    post_json(s, "/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      guarded("detokenize", res, [&] {
        detokenize(req, res);
        return std::string("ok");
      });
    });
  }

  // A POST route whose body is JSON whatever its Content-Type says. The body is read here, not
  // by httplib: its own reader caps an application/x-www-form-urlencoded body (curl -d's default
  // type) at 8 KiB (a constant compiled into Debian's libcpp-httplib) and refused longer prompts
  // sent that way with 413. The request's size limit (set_payload_max_length) still applies.
  template <class Handler>
  void post_json(httplib::Server& s, const char* path, Handler handler) {
    s.Post(path, [this, handler](const httplib::Request& req, httplib::Response& res,
                                 const httplib::ContentReader& read) {
      if (req.is_multipart_form_data()) {
        send_error(res, ApiError(415, "invalid_request_error",
                                 "multipart/form-data bodies are not accepted: send JSON"));
        ctx.metrics.count("other", outcome_of(res.status));
        return;
      }
      httplib::Request with_body = req;
      const bool read_all = read([&](const char* data, size_t n) {
        with_body.body.append(data, n);
        return true;
      });
      if (!read_all) {
        const int status = res.status == 413 ? 413 : 400;
        send_error(res, status == 413 ? too_large()
                                      : ApiError(400, "invalid_request_error",
                                                 "the request body could not be read"));
        ctx.metrics.count("other", outcome_of(status));
        return;
      }
      handler(with_body, res);
    });
  }

  ApiError too_large() const {
    return ApiError(413, "invalid_request_error",
                    "the request body exceeds the limit of " +
                        std::to_string(ctx.options.max_body_bytes) + " bytes",
                    "", "request_too_large");
  }
};

HttpServer::HttpServer(HttpOptions options, std::shared_ptr<spdlog::logger> log)
    : options_(std::move(options)), log_(std::move(log)) {
  server_ = std::make_unique<httplib::Server>();
  impl_ = std::make_unique<Impl>(
      Impl{ServerContext{options_, *log_, metrics_, "", http_models(options_.model_path)}});
  impl_->ctx.model = impl_->ctx.models.front().name;
  const int workers = options_.workers;
  server_->new_task_queue = [workers] { return new httplib::ThreadPool(size_t(workers)); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_read_timeout(options_.read_timeout_s, 0);
  server_->set_write_timeout(options_.write_timeout_s, 0);
  server_->set_keep_alive_timeout(5);
  // Measured (bench/http/RESULTS.md): with Nagle on, each response waited for the client's
  // delayed ACK (~40 ms a request, 16 req/s for one client); SSE chunks must leave at once too.
  server_->set_tcp_nodelay(true);
  // httplib's default closes a keep-alive connection after 5 requests.
  server_->set_keep_alive_max_count(1000);
  server_->set_socket_options([impl = impl_.get()](socket_t sock) {
    httplib::default_socket_options(sock);
    impl->listen_fd = sock;
  });
  impl_->install(*server_);
}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::start() {
  int port = options_.port;
  if (options_.listen_fd >= 0) {
    // Socket activation: httplib cannot adopt a bound socket, so let it make a throwaway one and
    // put the inherited socket in its place (dup2 keeps the fd number its accept loop uses). Its
    // accept loop polls with a timeout, so stop() can end it without shutting the shared socket.
    if (!is_listening_socket(options_.listen_fd))
      throw Error(Errc::invalid_argument, "--listen-fd " + std::to_string(options_.listen_fd) +
                                              " is not a listening TCP socket");
    server_->set_idle_interval(0, 200'000);
    if (server_->bind_to_any_port("127.0.0.1") < 0 || impl_->listen_fd < 0 ||
        dup2(options_.listen_fd, impl_->listen_fd) < 0)
      throw Error(Errc::unavailable,
                  std::string("cannot serve the inherited socket: ") + std::strerror(errno));
    port = bound_port(options_.listen_fd);
  } else if (port == 0) {
    port = server_->bind_to_any_port(options_.host);
  } else if (!server_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port < 0)
    throw Error(Errc::unavailable, "cannot listen on " + options_.host + ":" +
                                       std::to_string(options_.port) +
                                       " (in use, or not an address of this machine)");
  // Debian's shared cpp-httplib listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed
  // when the library was built): more clients connecting at once than that wait on SYN retries
  // or fail. listen() again on the bound socket only widens the queue.
  if (impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, SOMAXCONN) != 0)
    log_->warn("http_svc: cannot widen the listen backlog: {}", std::strerror(errno));
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  log_->info("http_svc listening on http://{}:{} for stack {} (model '{}', {} workers{}{})",
             options_.host, port, options_.stack_id, impl_->ctx.model, options_.workers,
             options_.api_key.empty() ? "" : ", bearer key required",
             options_.listen_fd >= 0 ? ", on the supervisor's socket" : "");
  return port;
}

void HttpServer::stop() {
  // httplib's stop() shuts its socket down, which would stop the shared one listening for the
  // supervisor and the next http_svc too: put a private listening socket in its place to shut
  // instead (listening, so the accept loop waits on it rather than failing on it).
  if (server_ && options_.listen_fd >= 0 && impl_->listen_fd >= 0) {
    try {
      const int spare = open_listening_socket({"127.0.0.1", 0});
      dup2(spare, impl_->listen_fd);
      close(spare);
    } catch (const Error& e) {
      log_->warn("http_svc: stopping on the shared socket: {}", e.what());
    }
  }
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace duet::http
