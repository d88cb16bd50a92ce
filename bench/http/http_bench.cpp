// http_bench: what the HTTP door costs, on a running stack started with `--http` (bench/http/run.sh
// starts one). Prints one JSON object:
//   stream: the same greedy generation (prompt, N tokens, EOS ignored) streamed by the native C++
//     client and by an HTTP client reading server-sent events, alternated round by round; tokens/s
//     end to end (N / submit-to-last-token), steady (chunks/s between the arrivals of the 10th and
//     the 90th percentile chunk: the flow through the door, blind to bursts at either end), time
//     to the first token, medians, HTTP / native;
//   requests: short completions per second with 1, 8, 32 concurrent clients (each its own
//     keep-alive connection, one request at a time), through HTTP and through the native client.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using duet::Errc;
using duet::Error;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

struct Args {
  std::string stack = "default", prompt = "Once upon a time", api_key;
  int port = 0, gen = 256, rounds = 5, short_gen = 4;
  std::vector<int> clients = {1, 8, 32};
  double seconds_per_point = 5;
};

// One streamed generation's client-side times.
struct StreamRun {
  int tokens = 0;
  double end_to_end_tok_s = 0, steady_chunks_s = 0, ttft_ms = 0;
};

// arrivals: when each chunk with text arrived.
StreamRun rates(int tokens, Clock::time_point start,
                const std::vector<Clock::time_point>& arrivals) {
  if (arrivals.size() < 10)
    throw Error(Errc::internal,
                "stream of " + std::to_string(arrivals.size()) + " chunks: use --gen 10 or more");
  StreamRun r;
  r.tokens = tokens;
  r.end_to_end_tok_s = tokens / std::max(1e-9, seconds(arrivals.back() - start));
  const size_t lo = arrivals.size() / 10, hi = arrivals.size() * 9 / 10;
  r.steady_chunks_s = double(hi - lo) / std::max(1e-9, seconds(arrivals[hi] - arrivals[lo]));
  r.ttft_ms = 1000 * seconds(arrivals.front() - start);
  return r;
}

duet::client::GenerateRequest long_request(const Args& a) {
  duet::client::GenerateRequest g;
  g.prompt = a.prompt;
  g.max_tokens = a.gen;
  g.ignore_eos = true;
  return g;
}

StreamRun native_stream(const Args& a, const std::string& endpoint) {
  duet::client::Client c(endpoint);
  int tokens = 0;
  std::vector<Clock::time_point> arrivals;
  const auto start = Clock::now();
  const auto result = c.generate(long_request(a), [&](const duet::client::Chunk& ch) {
    if (!ch.text.empty()) arrivals.push_back(Clock::now());  // HTTP sends no empty chunk
    tokens += static_cast<int>(ch.ids.size());
    return true;
  });
  if (static_cast<int>(result.ids.size()) != a.gen)
    throw Error(Errc::internal, "native stream: " + std::to_string(result.ids.size()) + " of " +
                                    std::to_string(a.gen) + " tokens");
  return rates(tokens, start, arrivals);
}

httplib::Client http_client(const Args& a) {
  httplib::Client c("127.0.0.1", a.port);
  c.set_keep_alive(true);
  c.set_tcp_nodelay(true);  // as curl: headers and body in two writes must not wait for an ACK
  c.set_connection_timeout(5);
  c.set_read_timeout(120);
  if (!a.api_key.empty()) c.set_bearer_token_auth(a.api_key);
  return c;
}

StreamRun http_stream(const Args& a) {
  httplib::Client c = http_client(a);
  const json body = {{"prompt", a.prompt},
                     {"max_tokens", a.gen},
                     {"ignore_eos", true},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  int usage_tokens = -1;
  std::vector<Clock::time_point> arrivals;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (!event.starts_with("data: ") || event == "data: [DONE]") continue;
      const json j = json::parse(event.substr(6));
      if (j.contains("usage") && j["usage"].is_object())
        usage_tokens = j["usage"]["completion_tokens"];
      if (j["choices"].empty() || j["choices"][0]["text"].get<std::string>().empty()) continue;
      arrivals.push_back(Clock::now());
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const auto start = Clock::now();
  if (!c.send(req, res, err) || res.status != 200)
    throw Error(Errc::unavailable, "HTTP stream: " + httplib::to_string(err) + " status " +
                                       std::to_string(res.status) + " " + res.body);
  if (usage_tokens != a.gen)
    throw Error(Errc::internal, "HTTP stream: usage says " + std::to_string(usage_tokens) + " of " +
                                    std::to_string(a.gen) + " tokens");
  return rates(usage_tokens, start, arrivals);
}

// Short completions per second with `clients` threads for a.seconds_per_point.
json request_rate(const Args& a, const std::string& endpoint, int clients, bool http) {
  std::atomic<long> ok{0}, failed{0};
  std::string first_error;
  std::mutex error_mutex;
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(a.seconds_per_point));
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t)
    threads.emplace_back([&] {
      auto fail = [&](const std::string& what) {
        ++failed;
        std::lock_guard lock(error_mutex);
        if (first_error.empty()) first_error = what;
      };
      if (http) {
        httplib::Client c = http_client(a);
        const std::string body =
            json{{"prompt", a.prompt}, {"max_tokens", a.short_gen}, {"ignore_eos", true}}.dump();
        while (Clock::now() < until) {
          auto res = c.Post("/v1/completions", body, "application/json");
          if (res && res->status == 200)
            ++ok;
          else
            fail(res ? std::to_string(res->status) + " " + res->body
                     : httplib::to_string(res.error()));
        }
      } else {
        duet::client::Client c(endpoint);
        duet::client::GenerateRequest g;
        g.prompt = a.prompt;
        g.max_tokens = a.short_gen;
        g.ignore_eos = true;
        g.stream = false;
        while (Clock::now() < until) {
          try {
            c.generate(g, {}, std::chrono::seconds(60));
            ++ok;
          } catch (const std::exception& e) {
            fail(e.what());
          }
        }
      }
    });
  for (auto& t : threads) t.join();
  const double elapsed = seconds(Clock::now() - start);
  json r = {{"clients", clients},    {"door", http ? "http" : "native"},
            {"requests", ok.load()}, {"errors", failed.load()},
            {"seconds", elapsed},    {"requests_per_s", ok.load() / elapsed}};
  if (!first_error.empty()) r["first_error"] = first_error;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"http_bench: HTTP streaming vs the native client, and short-completion requests/s"};
  app.add_option("--stack", a.stack, "a stack started with `duet stack up --http`")
      ->capture_default_str();
  app.add_option("--port", a.port, "http_svc's port (0: <run dir>/http.port)");
  app.add_option("--api-key", a.api_key, "bearer key when the stack has --api-key-file");
  app.add_option("--prompt", a.prompt)->capture_default_str();
  app.add_option("--gen", a.gen, "tokens per streamed generation")->capture_default_str();
  app.add_option("--rounds", a.rounds, "streamed generations per door")->capture_default_str();
  app.add_option("--short-gen", a.short_gen, "tokens per short completion")->capture_default_str();
  app.add_option("--clients", a.clients, "concurrent clients per point")->delimiter(',');
  app.add_option("--seconds", a.seconds_per_point, "seconds per requests/s point")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    const std::string endpoint = duet::client::stack_endpoint(a.stack);
    if (a.port == 0) {
      std::ifstream f(duet::default_run_dir(a.stack) + "/http.port");
      if (!(f >> a.port))
        throw Error(Errc::unavailable, "stack '" + a.stack +
                                           "' has no http.port: start it with `--http`, or pass "
                                           "--port");
    }
    // Warm-up: the engine's programs for these lengths are registered on first use.
    native_stream(a, endpoint);
    http_stream(a);
    std::vector<double> native_e2e, native_ttft, http_e2e, http_ttft, native_steady, http_steady;
    for (int r = 0; r < a.rounds; ++r) {
      const StreamRun n = native_stream(a, endpoint);
      const StreamRun h = http_stream(a);
      native_e2e.push_back(n.end_to_end_tok_s);
      native_ttft.push_back(n.ttft_ms);
      native_steady.push_back(n.steady_chunks_s);
      http_e2e.push_back(h.end_to_end_tok_s);
      http_ttft.push_back(h.ttft_ms);
      http_steady.push_back(h.steady_chunks_s);
    }
    json stream = {{"gen", a.gen},
                   {"rounds", a.rounds},
                   {"native_tok_s", native_e2e},
                   {"http_tok_s", http_e2e},
                   {"native_ttft_ms", native_ttft},
                   {"http_ttft_ms", http_ttft},
                   {"native_median_tok_s", median(native_e2e)},
                   {"http_median_tok_s", median(http_e2e)},
                   {"ratio_http_over_native", median(http_e2e) / median(native_e2e)},
                   {"native_steady_chunks_s", native_steady},
                   {"http_steady_chunks_s", http_steady},
                   {"steady_ratio_http_over_native", median(http_steady) / median(native_steady)},
                   {"native_median_ttft_ms", median(native_ttft)},
                   {"http_median_ttft_ms", median(http_ttft)}};
    json requests = json::array();
    for (int c : a.clients) {
      requests.push_back(request_rate(a, endpoint, c, true));
      requests.push_back(request_rate(a, endpoint, c, false));
    }
    std::cout << json{{"stack", a.stack},
                      {"prompt", a.prompt},
                      {"short_gen", a.short_gen},
                      {"stream", stream},
                      {"requests", requests}}
                     .dump()
              << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "http_bench: " << e.what() << "\n";
    return 1;
  }
}
