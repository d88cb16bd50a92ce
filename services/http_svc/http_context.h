#pragma once
// What the routes of http_svc share (http_server.cpp registers them; http_generate.cpp serves
// the completions).
#include <httplib.h>
#include <spdlog/logger.h>

#include <string>
#include <vector>

#include "core/ipc/stack_models.h"

#include "services/http_svc/http_metrics.h"
#include "services/http_svc/http_server.h"
#include "services/http_svc/openai_api.h"

namespace duet::http {

struct ServerContext {
  const HttpOptions& options;
  spdlog::logger& log;
  HttpMetrics& metrics;
  std::string model;  // the default model's id: model_id(options.model_path), or its name
  // Every model the stack serves (issue 25: DUET_MODELS), the default first; its names are the
  // ids /v1/models lists and a request's "model" picks.
  std::vector<ServedModel> models;

  // The served model a request names ("" = the default); ApiError 404 model_not_found (OpenAI's)
  // naming it and the served ones otherwise. The name the frontend is sent: "" for the default.
  const ServedModel& pick_model(const std::string& name, std::string& frontend_name) const;

  // ipc://.../frontend.sock; throws unavailable while the frontend has no socket.
  std::string frontend_endpoint() const;
};

// The error as OpenAI's JSON body with its status.
void send_error(httplib::Response& res, const ApiError& e);

// POST /v1/completions and /v1/chat/completions. Returns the outcome label for the metrics.
std::string serve_completion(ServerContext& ctx, Endpoint endpoint, const httplib::Request& req,
                             httplib::Response& res);

}  // namespace duet::http
