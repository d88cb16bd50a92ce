#pragma once
// GET /metrics: Prometheus' text exposition format (version 0.0.4). http_svc counts what it
// served (requests by endpoint and outcome, tokens, TTFT/TPOT histograms measured and modelled
// from each request's Done stats); the stack's gauges (queue depth per priority, running
// requests, KV pages, restarts) come from the frontend's Status JSON and the supervisor's status
// at scrape time.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "core/ipc/client.h"

namespace duet::http {

class Histogram {
 public:
  // Upper bounds in seconds, from 1 ms to 60 s.
  static constexpr std::array<double, 16> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1.0,  2.5,   5.0,
                                                     10.0,  20.0,   30.0,  60.0};
  void observe(double seconds);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` ("kind=\"measured\"").
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::array<uint64_t, kBounds.size()> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

class HttpMetrics {
 public:
  // One finished HTTP request: outcome is "ok", "cancelled" or an error type
  // ("invalid_request_error", "rate_limit_error", ...).
  void count(const std::string& endpoint, const std::string& outcome);
  // A generation's Done stats (TTFT/TPOT histograms, tokens).
  void observe(const client::Stats& s);
  void client_disconnected();

  // The whole exposition; frontend / supervisor are their status JSON (null when unreachable).
  std::string render(const nlohmann::json& frontend, const nlohmann::json& supervisor) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> requests_;
  Histogram ttft_measured_, ttft_modeled_, tpot_measured_, tpot_modeled_;
  uint64_t prompt_tokens_ = 0, completion_tokens_ = 0, disconnects_ = 0;
};

}  // namespace duet::http
