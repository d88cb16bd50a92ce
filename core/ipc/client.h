#pragma once
// The C++ client of a stack's frontend (schemas/client.fbs over a ZeroMQ DEALER on
// ipc://<run-dir>/frontend.sock), and the `duet generate/eval --stack` runners the CLI calls.
// Every call has a deadline; an Error reply from the frontend is thrown as duet::Error with the
// frontend's code and message.
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>
#include <zmq.hpp>

#include "core/base/error.h"
#include "core/model/chat_template.h"
#include "core/model/sampling.h"

namespace duet::client {

enum class Priority : uint8_t { reactive = 0, proactive = 1 };
Priority parse_priority(
    std::string_view name);  // "reactive" | "proactive"; throws invalid_argument
std::string_view priority_name(Priority p);

struct GenerateRequest {
  std::string prompt;               // text (the frontend adds BOS as the vocab says) ...
  std::vector<int32_t> prompt_ids;  // ... or ids as given (used when non-empty)
  SamplingParams sampling;
  int max_tokens = 128;
  std::vector<std::string> stop;
  Priority priority = Priority::reactive;
  bool stream = true;
  std::string plan;      // "" = the stack's plan
  uint64_t session = 0;  // chat: keep the KV between turns of one session
  // The client promises a KeepAlive this often while it waits (generate() sends them); the
  // frontend cancels the request when they stop. 0 = none.
  uint32_t heartbeat_ms = 1000;
  // EOS does not end the request (it is returned like any token): exactly max_tokens come back
  // unless a stop string or a cancel ends it first.
  bool ignore_eos = false;
  // Chat: messages (non-empty) replace prompt and prompt_ids; the frontend formats them with
  // chat_template ("" = the model's own) and reads special tokens in the template's markers only.
  // In a session, each turn sends only its new messages (the frontend keeps the conversation).
  std::vector<ChatMessage> messages;
  std::string chat_template;
  bool parse_special = false;  // prompt text: "<|eot_id|>" etc. become their ids
  // Which of the stack's models serves it (issue 25); "" = the client's model (set_model), else
  // the stack's default (its first).
  std::string model;
  // Log-probabilities of the generated tokens (schemas/client.fbs Generate.logprobs): -1 none,
  // 0 the sampled token's, N in 1..20 also the N likeliest tokens'.
  int logprobs = -1;
  // Every prompt token's log-probability given those before it (OpenAI's echo); max_tokens may
  // then be 0. Not journaled: a frontend restart makes the client send it again.
  bool prompt_logprobs = false;
};

// A token's log-probability under the model's distribution; bytes: what it adds to the text.
struct TokenProb {
  int32_t id = 0;
  float logprob = 0;
  std::string bytes;
};
// A generated token's (chosen) and the likeliest tokens' at its position, most likely first.
struct TokenLogprob {
  TokenProb chosen;
  std::vector<TokenProb> top;
};

struct Stats {
  uint32_t prompt_tokens = 0, generated_tokens = 0;
  double ttft_ms = 0, tpot_ms = 0, queue_ms = 0;
  double modeled_ttft_ms = 0, modeled_tpot_ms = 0, flag_wait_ms = 0;
  uint64_t kv_bytes_copied = 0;
  uint32_t restarts_seen = 0;
  std::string plan, finish_reason;
  // The plan executed here and the plan the modelled times are of (on the stack's SoC).
  std::string executed_plan, modeled_plan;
};
nlohmann::json to_json(const Stats& s);

struct GenerateResult {
  uint64_t request_id = 0;
  std::string text;
  std::vector<int32_t> ids;
  Stats stats;
  // With GenerateRequest::logprobs >= 0: those of the last logprobs.size() ids (a token
  // generated before a frontend restart has none).
  std::vector<TokenLogprob> logprobs;
  // With GenerateRequest::prompt_logprobs: one per prompt token (the first's logprob NaN).
  std::vector<TokenLogprob> prompt_logprobs;
};

struct Chunk {
  uint64_t request_id = 0;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<TokenLogprob> logprobs;  // of its last logprobs.size() ids
};

struct EvalResult {
  uint32_t n_tokens = 0, n_vocab = 0;
  std::vector<float> logits;  // [n_tokens][n_vocab]
};

struct TokenizeResult {
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;  // the text each id adds when decoded in order
};

// One message from the frontend, decoded.
struct Event {
  enum class Kind { chunk, done, error, eval, status, tokenize, detokenize } kind = Kind::error;
  uint64_t request_id = 0;
  Chunk chunk;           // chunk
  GenerateResult done;   // done
  Errc code = Errc::ok;  // error
  std::string message;   // error
  EvalResult eval;       // eval
  std::string json;      // status; detokenize: the text
  TokenizeResult tokenize;
};

// ipc://<run dir>/frontend.sock of a stack (run_dir "" = default_run_dir(stack_id)). Throws
// unavailable, naming the stack, when the socket does not exist.
std::string stack_endpoint(std::string_view stack_id, const std::string& run_dir = "");

// Resuming (issue 22): the client's DEALER has a random, stable routing id, so a restarted
// frontend that adopted its requests from the request journal addresses the same connection. A
// socket monitor sees the frontend go (disconnected) and come back (connected); the client then
// sends Resume{request id, ids and text bytes received} for every generate in flight and the
// stream continues where it stopped: no token twice, none missing. The frontend acks with an
// empty TokenChunk (never shown to callers). KeepAlives pause until then, and an `unavailable`
// error meanwhile answers one sent before the Resume, so it is skipped. A request the restarted
// frontend does not know (it never saw its Generate) is sent again when nothing of it had
// arrived, else fails with the frontend's not_found naming it. A frontend that stays away longer
// than resume_timeout fails the requests in flight with `unavailable`.
class Client {
 public:
  explicit Client(std::string endpoint);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Asynchronous use: submit() returns the request id; replies come from next_event().
  uint64_t submit(const GenerateRequest& request);
  std::optional<Event> next_event(std::chrono::milliseconds timeout);  // nullopt: timeout
  void cancel(uint64_t request_id);
  void keep_alive(uint64_t request_id);

  // Blocking generate: on_chunk gets each streamed chunk and may return false to cancel (the
  // result then has finish_reason "cancelled"). Throws the frontend's Error, or Error(timeout)
  // (after cancelling) when the whole request takes longer than `timeout`.
  GenerateResult generate(const GenerateRequest& request,
                          const std::function<bool(const Chunk&)>& on_chunk = {},
                          std::chrono::milliseconds timeout = std::chrono::minutes(10));
  nlohmann::json status(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // `duet trace`: request `number` (the frontend's request number, status "trace"; 0: the last
  // one with steps in the frontend's ring) as Chrome trace-event JSON; of the client's model
  // (set_model; "" = the stack's default).
  nlohmann::json trace(uint64_t number,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Warms the model's engines up (schemas/client.fbs Warmup): what ran, as JSON. Throws the
  // frontend's Error when an engine cannot start.
  nlohmann::json warmup(std::chrono::milliseconds timeout = std::chrono::minutes(5));
  EvalResult eval(const std::vector<int32_t>& ids, const std::string& plan = "",
                  const std::string& model_path = "",
                  std::chrono::milliseconds timeout = std::chrono::minutes(5));
  void close_session(uint64_t session, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // The stack's tokenizer (add_special: BOS/EOS as the vocab says).
  TokenizeResult tokenize(const std::string& text, bool add_special, bool parse_special = false,
                          std::chrono::milliseconds timeout = std::chrono::seconds(5));
  std::string detokenize(const std::vector<int32_t>& ids,
                         std::chrono::milliseconds timeout = std::chrono::seconds(5));

  // Sends bytes as they are (tests of hostile input) and returns the next reply's last frame,
  // or nullopt at the deadline.
  std::optional<std::vector<uint8_t>> call_raw(std::span<const uint8_t> bytes,
                                               std::chrono::milliseconds timeout);

  const std::string& endpoint() const { return endpoint_; }
  // The model every call of this client names unless a GenerateRequest names its own (issue 25:
  // a stack serving several models); "" = the stack's default.
  void set_model(std::string name) { model_ = std::move(name); }
  const std::string& model() const { return model_; }
  // How long a lost frontend may stay away before the requests in flight fail.
  void set_resume_timeout(std::chrono::milliseconds t) { resume_timeout_ = t; }
  uint64_t reconnects() const { return reconnects_; }  // times the frontend came back
  uint64_t resumes_sent() const { return resumes_sent_; }

 private:
  struct InFlight {
    std::vector<uint8_t> generate;  // as sent: sent again if the restarted frontend never saw it
    uint32_t ids_received = 0;
    uint64_t text_bytes = 0;
    bool resuming = false;  // Resume sent, its answer not here yet
    std::string model;      // the Generate's: its Resume names it too
  };
  void send(const std::vector<uint8_t>& bytes);
  std::optional<std::vector<uint8_t>> recv_frame(std::chrono::milliseconds timeout);
  // The next event for the caller: tracks in-flight generates, takes Resume acks and errors
  // that a resume makes moot; nullopt at the timeout.
  std::optional<Event> receive(std::chrono::milliseconds timeout);
  std::optional<Event> track(Event e);
  void read_monitor();
  void resume_all();
  // An error event for a request in flight when the frontend has been gone too long.
  std::optional<Event> expire_lost();
  // Waits for the event that answers `request_id` (kept aside: events of other requests).
  // The JSON a status-kind reply to request `id` carries (status, trace), or the error it names.
  nlohmann::json json_reply(uint64_t id, std::chrono::milliseconds timeout, const char* what);
  Event wait_for(uint64_t request_id, std::chrono::steady_clock::time_point deadline,
                 const char* what);

  std::string endpoint_;
  std::string model_;
  std::unique_ptr<zmq::socket_t> monitor_;  // PAIR: the DEALER's connect/disconnect events
  std::unique_ptr<zmq::socket_t> socket_;
  uint64_t next_request_id_ = 1;
  std::deque<Event> pending_;
  std::map<uint64_t, InFlight> inflight_;
  std::optional<std::chrono::steady_clock::time_point> lost_since_;
  std::chrono::milliseconds resume_timeout_ = std::chrono::seconds(30);
  uint64_t reconnects_ = 0, resumes_sent_ = 0;
};

// `duet generate --stack`: streams the text to stdout (or prints one JSON object with --json)
// and the stats to stderr. Returns the process exit code.
struct StackGenerateArgs {
  std::string stack_id = "default";
  std::string run_dir;  // "" = the stack's default
  GenerateRequest request;
  bool json = false;
  int timeout_s = 600;
};
int run_generate_on_stack(const StackGenerateArgs& args);

// `duet eval --stack`: the logits of every position into logits_out (little-endian float32, one
// row of n_vocab per position: the local eval's format). model_path "" = don't check.
struct StackEvalArgs {
  std::string stack_id = "default";
  std::string run_dir;
  std::vector<int32_t> ids;
  std::string plan;
  std::string model_path;
  std::string model_name;  // which of the stack's models ("" = its default)
  std::string logits_out;
  int timeout_s = 300;
};
int run_eval_on_stack(const StackEvalArgs& args);

}  // namespace duet::client
