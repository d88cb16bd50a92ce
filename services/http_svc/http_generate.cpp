// POST /v1/completions and /v1/chat/completions: one frontend request per HTTP request, on the
// HTTP worker's own DEALER (see http_server.h for the threading model).
#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "services/http_svc/http_context.h"

namespace duet::http {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

std::string completion_id(Endpoint e) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(e == Endpoint::chat ? "chatcmpl-" : "cmpl-") + buf;
}

milliseconds left_until(Clock::time_point t) {
  return std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(t - Clock::now()));
}

// The frontend connection of this HTTP worker thread, reused by its requests one after another
// (a fresh DEALER per request costs a socket and a handshake: ~0.4 ms a request, measured with
// 1-token generations in bench/http/RESULTS.md).
// Events of an earlier request (a late answer to its last KeepAlive) are skipped by request id.
client::Client& worker_client(const std::string& endpoint) {
  thread_local std::unique_ptr<client::Client> c;
  if (!c || c->endpoint() != endpoint) c = std::make_unique<client::Client>(endpoint);
  return *c;
}

// One generation on its worker's frontend connection; KeepAlives go out while anything waits on
// it. The streaming body runs on the same worker thread (httplib calls the content provider
// there), so no two generations use one connection at once.
struct Generation {
  client::Client& client;
  uint64_t id = 0;
  CompletionRequest req;
  std::string cmpl_id, model;
  int64_t created = 0;
  Clock::time_point deadline, next_beat;
  milliseconds beat{333};
  std::deque<client::Event> early;  // read before the response headers went out

  explicit Generation(const std::string& endpoint) : client(worker_client(endpoint)) {}

  void submit(milliseconds timeout) {
    id = client.submit(req.generate);
    deadline = Clock::now() + timeout;
    beat = milliseconds(std::max<uint32_t>(req.generate.heartbeat_ms / 3, 1));
    next_beat = Clock::now() + beat;
  }

  // The next event of the request, or nullopt when `slice` passed without one.
  std::optional<client::Event> next(milliseconds slice) {
    if (!early.empty()) {
      client::Event e = std::move(early.front());
      early.pop_front();
      return e;
    }
    if (Clock::now() >= next_beat) {
      client.keep_alive(id);
      next_beat = Clock::now() + beat;
    }
    for (;;) {
      auto e = client.next_event(std::max(milliseconds(1), std::min(slice, left_until(next_beat))));
      if (!e) return std::nullopt;
      if (e->request_id == id) return e;  // else a late answer to an earlier request's KeepAlive
    }
  }

  // Cancels and waits (bounded) for the frontend's word, so the Cancel is delivered before the
  // socket closes and the request's KV pages are free when this returns.
  void cancel() {
    try {
      client.cancel(id);
      const auto until = Clock::now() + std::chrono::seconds(2);
      while (Clock::now() < until) {
        auto e = client.next_event(left_until(until));
        if (!e) break;
        if (e->request_id == id &&
            (e->kind == client::Event::Kind::done || e->kind == client::Event::Kind::error))
          break;
      }
    } catch (const std::exception&) {
      // the frontend is gone: its restart drops the request anyway
    }
  }
};

ApiError timeout_error(const Generation& g) {
  return ApiError(503, "service_unavailable",
                  "request " + g.cmpl_id + " did not finish before http_svc's deadline", "",
                  "timeout");
}

// Waits for the request's first event: an Error becomes the HTTP status (400, 429, 503) before
// any header is sent; a chunk or Done is kept for the body.
void await_first_event(Generation& g) {
  for (;;) {
    if (Clock::now() >= g.deadline) {
      g.cancel();
      throw timeout_error(g);
    }
    auto e = g.next(milliseconds(100));
    if (!e) continue;
    if (e->kind == client::Event::Kind::error) throw from_duet_error(Error(e->code, e->message));
    g.early.push_back(std::move(*e));
    return;
  }
}

bool write_event(httplib::DataSink& sink, const std::string& data) {
  const std::string line = "data: " + data + "\n\n";
  return sink.write(line.data(), line.size());
}

// The SSE body: one chunk per TokenChunk, a last chunk with finish_reason, the usage chunk when
// asked for, then [DONE]. Returns false (the connection is dropped) when the client went away.
bool stream_body(ServerContext& ctx, Generation& g, httplib::DataSink& sink) {
  bool first = true;
  // Log-probabilities of tokens whose text is still held back (a partial UTF-8 character, a
  // possible stop string) go out with the next chunk that has text, or with the last.
  std::vector<client::TokenLogprob> pending;
  size_t text_offset = 0;
  auto disconnect = [&] {
    g.cancel();
    ctx.metrics.client_disconnected();
    ctx.metrics.count(g.req.endpoint == Endpoint::chat ? "chat" : "completions", "cancelled");
    ctx.log.info("{}: the client went away mid-stream; request cancelled", g.cmpl_id);
    return false;
  };
  const std::string endpoint = g.req.endpoint == Endpoint::chat ? "chat" : "completions";
  for (;;) {
    if (Clock::now() >= g.deadline) {
      g.cancel();
      (void)write_event(sink, timeout_error(g).to_json().dump());
      (void)write_event(sink, "[DONE]");
      sink.done();
      ctx.metrics.count(endpoint, "timeout");
      return true;
    }
    std::optional<client::Event> e;
    try {
      e = g.next(milliseconds(100));
    } catch (const Error& x) {
      e = client::Event{};
      e->kind = client::Event::Kind::error;
      e->code = x.code();
      e->message = x.what();
    }
    if (!e) {
      if (!sink.is_writable()) return disconnect();
      continue;
    }
    switch (e->kind) {
      case client::Event::Kind::chunk:
        pending.insert(pending.end(), e->chunk.logprobs.begin(), e->chunk.logprobs.end());
        if (e->chunk.text.empty()) continue;
        if (!write_event(sink, stream_chunk(g.req, g.cmpl_id, g.created, g.model, e->chunk.text, "",
                                            first, pending, text_offset)
                                   .dump(-1, ' ', false, json::error_handler_t::replace)))
          return disconnect();
        pending.clear();
        first = false;
        continue;
      case client::Event::Kind::done: {
        const client::Stats& st = e->done.stats;
        // With stream true every byte came in chunks; Done's text is the whole text again.
        bool ok = write_event(
            sink, stream_chunk(g.req, g.cmpl_id, g.created, g.model, "",
                               finish_reason(st.finish_reason), first, pending, text_offset)
                      .dump(-1, ' ', false, json::error_handler_t::replace));
        if (ok && g.req.include_usage)
          ok = write_event(sink, usage_chunk(g.req, g.cmpl_id, g.created, g.model, st).dump());
        ok = ok && write_event(sink, "[DONE]");
        ctx.metrics.observe(st);
        ctx.metrics.count(endpoint, ok ? "ok" : "cancelled");
        if (!ok) return false;
        sink.done();
        return true;
      }
      case client::Event::Kind::error: {
        const ApiError err = from_duet_error(Error(e->code, e->message));
        (void)write_event(sink, err.to_json().dump(-1, ' ', false, json::error_handler_t::replace));
        (void)write_event(sink, "[DONE]");
        sink.done();
        ctx.metrics.count(endpoint, err.type());
        return true;
      }
      default:
        continue;
    }
  }
}

// A batch of prompts: each a frontend request of its own on this worker's connection, all
// submitted before any answer is read, so the stack runs them side by side; the response waits
// for every one. An error of one fails the whole (the others are cancelled: their late answers
// are skipped by request id, as any earlier request's).
std::string serve_batch(ServerContext& ctx, Generation& g, httplib::Response& res) {
  client::Client& c = g.client;
  std::vector<client::GenerateRequest> prompts{g.req.generate};
  prompts.insert(prompts.end(), g.req.more.begin(), g.req.more.end());
  std::vector<uint64_t> ids;
  std::vector<std::optional<client::GenerateResult>> results(prompts.size());
  auto cancel_rest = [&] {
    for (size_t i = 0; i < ids.size(); ++i) try {
        if (!results[i]) c.cancel(ids[i]);
      } catch (const std::exception&) {
        // the frontend is gone: its restart drops them anyway
      }
  };
  const auto deadline = Clock::now() + ctx.options.request_timeout;
  const milliseconds beat(std::max<uint32_t>(g.req.generate.heartbeat_ms / 3, 1));
  auto next_beat = Clock::now() + beat;
  size_t left = prompts.size();
  try {
    for (const client::GenerateRequest& p : prompts) ids.push_back(c.submit(p));
    while (left > 0) {
      if (Clock::now() >= deadline) throw timeout_error(g);
      if (Clock::now() >= next_beat) {
        for (size_t i = 0; i < ids.size(); ++i)
          if (!results[i]) c.keep_alive(ids[i]);
        next_beat = Clock::now() + beat;
      }
      auto e = c.next_event(
          std::max(milliseconds(1), std::min(milliseconds(100), left_until(next_beat))));
      if (!e) continue;
      const auto at = std::find(ids.begin(), ids.end(), e->request_id);
      if (at == ids.end()) continue;  // a late answer to an earlier request
      const size_t i = static_cast<size_t>(at - ids.begin());
      if (e->kind == client::Event::Kind::error) throw from_duet_error(Error(e->code, e->message));
      if (e->kind != client::Event::Kind::done || results[i]) continue;
      results[i] = std::move(e->done);
      --left;
    }
  } catch (const Error& e) {
    cancel_rest();
    throw from_duet_error(e);
  } catch (...) {
    cancel_rest();
    throw;
  }
  std::vector<client::GenerateResult> done;
  for (auto& r : results) {
    ctx.metrics.observe(r->stats);
    done.push_back(std::move(*r));
  }
  res.set_content(completion_response(g.req, g.cmpl_id, g.created, g.model, done)
                      .dump(-1, ' ', false, json::error_handler_t::replace),
                  "application/json");
  return "ok";
}

}  // namespace

std::string serve_completion(ServerContext& ctx, Endpoint endpoint, const httplib::Request& req,
                             httplib::Response& res) {
  auto g = std::make_shared<Generation>(ctx.frontend_endpoint());
  g->req = parse_completion_request(endpoint, req.body, req.get_header_value("X-Duet-Priority"));
  g->model = ctx.pick_model(g->req.model, g->req.generate.model).name;
  if (endpoint == Endpoint::chat) apply_chat_messages(g->req);
  g->cmpl_id = completion_id(endpoint);
  g->created = static_cast<int64_t>(std::time(nullptr));
  if (!g->req.more.empty()) {
    for (client::GenerateRequest& p : g->req.more) p.model = g->req.generate.model;
    return serve_batch(ctx, *g, res);
  }
  try {
    g->submit(ctx.options.request_timeout);
    await_first_event(*g);
  } catch (const Error& e) {
    throw from_duet_error(e);
  }

  if (g->req.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream", [g, &ctx](size_t, httplib::DataSink& sink) {
          try {
            return stream_body(ctx, *g, sink);
          } catch (const std::exception& e) {
            ctx.log.error("{}: stream failed: {}", g->cmpl_id, e.what());
            g->cancel();
            return false;
          }
        });
    return "";  // the stream counts its own outcome
  }

  for (;;) {
    if (Clock::now() >= g->deadline) {
      g->cancel();
      throw timeout_error(*g);
    }
    std::optional<client::Event> e;
    try {
      e = g->next(milliseconds(100));
    } catch (const Error& x) {
      throw from_duet_error(x);
    }
    if (!e) continue;
    if (e->kind == client::Event::Kind::error) throw from_duet_error(Error(e->code, e->message));
    if (e->kind != client::Event::Kind::done) continue;
    ctx.metrics.observe(e->done.stats);
    res.set_content(completion_response(g->req, g->cmpl_id, g->created, g->model, {e->done})
                        .dump(-1, ' ', false, json::error_handler_t::replace),
                    "application/json");
    return "ok";
  }
}

}  // namespace duet::http
