#include "services/http_svc/http_metrics.h"

#include <cstdio>

namespace duet::http {

using nlohmann::json;

void Histogram::observe(double seconds) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (seconds <= kBounds[i]) ++counts_[i];
  ++count_;
  sum_ += seconds;
}

namespace {

std::string number(double v) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string join_labels(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + "," + b;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(v) + "\n";
}

// Label values: backslash, quote and newline escaped, as the format requires.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

double num(const json& j, std::initializer_list<const char*> path) {
  const json* p = &j;
  for (const char* k : path) {
    if (!p->is_object() || !p->contains(k)) return 0;
    p = &(*p)[k];
  }
  return p->is_number() ? p->get<double>() : 0;
}

}  // namespace

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  for (size_t i = 0; i < kBounds.size(); ++i)
    sample(out, name + "_bucket", join_labels(labels, "le=\"" + number(kBounds[i]) + "\""),
           double(counts_[i]));
  sample(out, name + "_bucket", join_labels(labels, "le=\"+Inf\""), double(count_));
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, double(count_));
}

void HttpMetrics::count(const std::string& endpoint, const std::string& outcome) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, outcome}];
}

void HttpMetrics::observe(const client::Stats& s) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += s.prompt_tokens;
  completion_tokens_ += s.generated_tokens;
  if (s.generated_tokens == 0) return;
  ttft_measured_.observe(s.ttft_ms / 1000.0);
  ttft_modeled_.observe(s.modeled_ttft_ms / 1000.0);
  if (s.generated_tokens > 1) {
    tpot_measured_.observe(s.tpot_ms / 1000.0);
    tpot_modeled_.observe(s.modeled_tpot_ms / 1000.0);
  }
}

void HttpMetrics::client_disconnected() {
  std::lock_guard lock(mu_);
  ++disconnects_;
}

std::string HttpMetrics::render(const json& frontend, const json& supervisor) const {
  std::string out;
  {
    std::lock_guard lock(mu_);
    header(out, "duet_http_requests_total", "counter",
           "HTTP requests served by http_svc, by endpoint and outcome");
    for (const auto& [key, n] : requests_)
      sample(
          out, "duet_http_requests_total",
          "endpoint=\"" + label_value(key.first) + "\",outcome=\"" + label_value(key.second) + "\"",
          double(n));
    header(out, "duet_http_tokens_total", "counter", "tokens of requests served over HTTP");
    sample(out, "duet_http_tokens_total", "kind=\"prompt\"", double(prompt_tokens_));
    sample(out, "duet_http_tokens_total", "kind=\"completion\"", double(completion_tokens_));
    header(out, "duet_http_client_disconnects_total", "counter",
           "streams whose client went away before the end (their requests were cancelled)");
    sample(out, "duet_http_client_disconnects_total", "", double(disconnects_));
    header(out, "duet_ttft_seconds", "histogram",
           "time to first token per request: measured here, and modelled on the SoC profile");
    ttft_measured_.render(out, "duet_ttft_seconds", "kind=\"measured\"");
    ttft_modeled_.render(out, "duet_ttft_seconds", "kind=\"modeled\"");
    header(out, "duet_tpot_seconds", "histogram",
           "mean time per output token per request: measured here, and modelled");
    tpot_measured_.render(out, "duet_tpot_seconds", "kind=\"measured\"");
    tpot_modeled_.render(out, "duet_tpot_seconds", "kind=\"modeled\"");
  }

  header(out, "duet_frontend_up", "gauge", "1 when the frontend answered the status request");
  sample(out, "duet_frontend_up", "", frontend.is_object() ? 1 : 0);
  if (frontend.is_object()) {
    const json& m = frontend.value("metrics", json::object());
    header(out, "duet_frontend_requests_total", "counter",
           "requests the frontend saw (all clients), by outcome");
    for (const char* k : {"received", "completed", "cancelled", "failed", "reaped", "rejected"})
      sample(out, "duet_frontend_requests_total", std::string("outcome=\"") + k + "\"",
             num(m, {"requests", k}));
    header(out, "duet_frontend_tokens_total", "counter", "tokens the frontend processed");
    sample(out, "duet_frontend_tokens_total", "kind=\"prompt\"", num(m, {"tokens", "prompt"}));
    sample(out, "duet_frontend_tokens_total", "kind=\"generated\"",
           num(m, {"tokens", "generated"}));
    header(out, "duet_queue_depth", "gauge", "requests waiting in the frontend, by priority");
    for (const char* p : {"reactive", "proactive"})
      sample(out, "duet_queue_depth", std::string("priority=\"") + p + "\"",
             num(frontend, {"queue", p}));
    header(out, "duet_running_requests", "gauge", "requests the frontend is running");
    sample(out, "duet_running_requests", "",
           frontend.contains("running") && frontend["running"].is_array()
               ? double(frontend["running"].size())
               : 0);
    header(out, "duet_restarts_seen_total", "counter",
           "device-service restarts the frontend's executor lived through");
    sample(out, "duet_restarts_seen_total", "", num(m, {"restarts_seen"}));
    header(out, "duet_kv_pages", "gauge", "KV cache pages of the main engine, by state");
    const double total = num(frontend, {"engine", "kv_pages_total"});
    const double free = num(frontend, {"engine", "kv_pages_free"});
    sample(out, "duet_kv_pages", "state=\"total\"", total);
    sample(out, "duet_kv_pages", "state=\"free\"", free);
    sample(out, "duet_kv_pages", "state=\"used\"", total - free);
    // Prefix sharing (issue 20 item 4): cached pages are among the free, shared among the used.
    sample(out, "duet_kv_pages", "state=\"cached\"", num(frontend, {"engine", "kv_pages_cached"}));
    sample(out, "duet_kv_pages", "state=\"shared\"", num(frontend, {"engine", "kv_pages_shared"}));
    header(out, "duet_kv_prefix_hit_tokens_total", "counter",
           "prompt tokens whose KV was borrowed from earlier requests instead of computed");
    sample(out, "duet_kv_prefix_hit_tokens_total", "",
           num(frontend, {"engine", "kv_prefix", "hit_tokens"}));
    header(out, "duet_frontend_mean_ms", "gauge",
           "the frontend's running means over all requests, measured and modelled");
    for (const char* kind : {"measured", "modeled"})
      for (const char* what : {"ttft_ms", "tpot_ms"})
        sample(out, "duet_frontend_mean_ms",
               std::string("kind=\"") + kind + "\",what=\"" + what + "\"", num(m, {kind, what}));
  }
  if (supervisor.is_object() && supervisor.contains("services")) {
    header(out, "duet_service_restarts_total", "counter",
           "restarts of each supervised service (the supervisor's count)");
    for (const json& s : supervisor["services"])
      sample(out, "duet_service_restarts_total",
             "service=\"" + label_value(s.value("name", "?")) + "\"", s.value("restarts", 0));
    header(out, "duet_service_healthy", "gauge", "1 while the supervisor sees the service healthy");
    for (const json& s : supervisor["services"])
      sample(out, "duet_service_healthy", "service=\"" + label_value(s.value("name", "?")) + "\"",
             s.value("state", "") == "healthy" ? 1 : 0);
  }
  return out;
}

}  // namespace duet::http
