#pragma once
// An HTTP client of http_svc for the chaos run, retrying the way the OpenAI SDKs do by default:
// a streaming /v1/completions request (greedy), and on a connection error or a 408, 409, 429 or
// 5xx answer it is sent again, at most twice (the SDKs' max_retries = 2), after 0.5 s then 1 s
// (each x 0.75-1, their jitter). A kill -9 of http_svc closes every TCP connection it holds: the
// SDKs retry by themselves a request whose connection dies before the response headers; one cut
// mid-stream reaches the application as an error, and the application sends it again (as this
// client does, from the beginning: greedy decoding gives the same text again). Both kinds draw on
// the same budget of two retries, and are counted apart.
#include <httplib.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>

#include "tests/http_svc/http_test_support.h"

namespace duet::chaos {

struct HttpOutcome {
  bool done = false;               // an SSE stream that ended with [DONE]
  std::string text;                // its text
  std::string error;               // why not, after the last attempt
  int retries_before_headers = 0;  // connection refused / reset before the response began
  int resends_after_cut = 0;       // the stream broke off after it began
  int retries_on_status = 0;       // 408, 409, 429, 5xx
  bool refused = false;  // not done: no attempt reached http_svc (it was not listening yet)
};

inline bool retryable_status(int status) {
  return status == 408 || status == 409 || status == 429 || status >= 500;
}

// One greedy streaming completion of `prompt` against http_svc on 127.0.0.1:`port`.
inline HttpOutcome http_stream_completion(int port, const std::string& prompt, int max_tokens,
                                          std::mt19937& rng) {
  constexpr int kMaxRetries = 2;
  HttpOutcome out;
  const std::string body = nlohmann::json{
      {"prompt", prompt},
      {"max_tokens", max_tokens},
      {"temperature", 0},
      {"stream", true}}.dump();
  for (int attempt = 0;; ++attempt) {
    httplib::Client cli("127.0.0.1", port);
    cli.set_connection_timeout(std::chrono::seconds(5));
    cli.set_read_timeout(std::chrono::seconds(30));  // the chaos run's per-request deadline
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    bool headers = false;
    std::string received;
    req.response_handler = [&](const httplib::Response&) {
      headers = true;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      received.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    int* kind = nullptr;
    if (!sent || err != httplib::Error::Success) {
      kind = headers ? &out.resends_after_cut : &out.retries_before_headers;
      out.error = "connection: " + httplib::to_string(err);
      out.refused = attempt == kMaxRetries && err == httplib::Error::Connection;
    } else if (res.status != 200) {
      out.error = "HTTP " + std::to_string(res.status) + ": " + received;
      if (!retryable_status(res.status)) return out;
      kind = &out.retries_on_status;
    } else {
      // An error event (then [DONE]) is the stack's answer, not a cut: the SDKs raise it, no retry.
      if (const size_t at = received.find("data: {\"error\""); at != std::string::npos) {
        out.error = received.substr(at + 6, received.find("\n", at) - at - 6);
        return out;
      }
      test_support::Sse sse;
      try {
        sse = test_support::parse_sse(received);
      } catch (const nlohmann::json::exception&) {  // an event cut in half
      }
      if (sse.done) {
        out.done = true;
        out.text = sse.text;
        return out;
      }
      // A 200 whose stream ended without [DONE]: the connection closed mid-stream.
      kind = &out.resends_after_cut;
      out.error = "stream ended without [DONE] after " + std::to_string(sse.chunks) + " chunks";
    }
    if (attempt == kMaxRetries) return out;
    ++*kind;
    const double jitter = 1.0 - 0.25 * std::uniform_real_distribution<double>(0, 1)(rng);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(std::min(0.5 * (1 << attempt), 8.0) * jitter));
  }
}

}  // namespace duet::chaos
