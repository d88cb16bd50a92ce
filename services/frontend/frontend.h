#pragma once
// The serving core: the client socket (<run-dir>/frontend.sock, schemas/client.fbs), the request
// table, the scheduler and one Engine. pump() never blocks: it reads what clients sent, runs at
// most ONE engine step over the current batch (continuous batching), and sends what that step
// produced, so a service loop can call it between its other duties.
//
// Client API (every message a verified ClientMessage; replies carry the request's id):
//   Generate  -> TokenChunk* (stream) then Done with Stats, or Error
//   Cancel    -> the cancelled request ends with Done (finish_reason "cancelled"); KV freed at once
//   Status    -> StatusReply (JSON: queue, running, limits, sessions, engine, metrics)
//   Eval      -> EvalReply (logits of every position), or Error
//   KeepAlive -> nothing; a request with heartbeat_ms is reaped when they stop (its client,
//                if still listening, gets Error(timeout) saying so)
//   CloseSession -> Done (finish_reason "closed"); the session's KV is freed
//   Trace     -> TraceReply: one request's steps as Chrome trace-event JSON (frontend_trace.cpp)
//   Warmup    -> WarmupReply (JSON): one step of each token bucket on a scratch sequence, outside
//                the metrics, one unit per pump; skipped while requests run, ended by one that
//                arrives (frontend_warmup.cpp); `duet stack up` sends it; Error when the engine
//                cannot start
//   Resume    -> (issue 22, frontend_resume.cpp) for a request this frontend adopted from the
//                request journal after a restart: the stream from the client's position on
//                (TokenChunk*, then Done), or an empty TokenChunk as the ack; Error(not_found)
//                naming the request when it is not known here
// A client that vanishes is noticed when a send to it fails (ZMQ_ROUTER_MANDATORY: EHOSTUNREACH)
// or its KeepAlives stop; its requests are cancelled and their KV freed.
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include <functional>
#include "core/ipc/messaging.h"
#include "core/model/tokenizer.h"
#include "services/frontend/async_step.h"
#include "services/frontend/chat_turn.h"
#include "services/frontend/engine.h"
#include "services/frontend/proactive_time.h"
#include "services/frontend/request.h"
#include "services/frontend/request_journal.h"
#include "services/frontend/scheduler.h"
#include "services/frontend/step_ring.h"
#include "services/frontend/step_watch.h"

namespace duet::frontend {

struct FrontendOptions {
  int max_running = 16;                       // requests in the batch at once
  int max_queue = 64;                         // requests waiting beyond those
  int max_context = 0;                        // positions per sequence; 0 = the model's n_ctx
  int max_sessions = 64;                      // chat sessions holding KV between turns
  double session_idle_ms = 30 * 60 * 1000.0;  // a session unused this long is closed
  size_t max_stop_strings = 16;
  size_t max_stop_bytes = 256;
  size_t max_prompt_bytes = size_t{1} << 20;
  size_t max_outbox = 4096;  // unsent messages per request before its client counts as gone
  // Engines for plans other than the stack's own, made on first use (eval --plan P checks every
  // plan against the same stack). Null: only the stack's plan is served.
  std::function<std::unique_ptr<Engine>(const std::string& plan)> make_engine;
  // Agent.xpu (issue 9): the engine for proactive generate requests, apart from the main one
  // (own arena, KV and flags). When it is preemptible, a reactive request arriving during a
  // proactive step stops that step at the next op boundary; the step is parked and resumed once
  // no reactive work is left. Null: every request runs on the main engine.
  std::function<std::unique_ptr<Engine>()> make_proactive_engine;
  // Agent.xpu's knobs (agent_policy.h): the decode cap B_cap and the aging threshold.
  agent::AgentConfig agent;
  // Issue 22: the stack's request journal (null: requests are not journaled, a restart ends
  // them), the records a killed frontend left in it (recover()), adopted by the constructor, and
  // the flag that made the engines attach the KV pool as it was (cleared once adoption is over).
  std::shared_ptr<RequestJournal> journal;
  std::vector<JournalRecord> recovered;
  std::shared_ptr<std::atomic<bool>> adopt_kv;
  // An adopted request whose client sends no Resume within this long is dropped.
  double resume_wait_ms = 10000;
  // Finished records older than this (wall clock) are not adopted: their clients have their Done.
  double adopt_finished_max_age_ms = 60000;
  // Steps kept for `duet trace` (step_ring.h; env DUET_TRACE_STEPS); 0: none recorded.
  size_t trace_steps = 1024;
  // Issue 25: the model's name (a request naming another is refused; "" = the file's stem), and
  // for one of several models behind one client socket (model_router.h) that socket, not bound
  // here, and where a message this frontend reads from it goes (the router picks the model).
  std::string model_name;
  std::shared_ptr<zmq::socket_t> shared_socket;
  std::function<void(msg::Envelope&)> dispatch;
};

// Aggregates over every finished request (per stack).
struct StackMetrics {
  uint64_t received = 0, completed = 0, cancelled = 0, failed = 0, reaped = 0, rejected = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, steps = 0, step_tokens = 0;
  double ttft_ms_sum = 0, tpot_ms_sum = 0, queue_ms_sum = 0;
  uint64_t ttft_n = 0, tpot_n = 0, queue_n = 0;
  double modeled_ttft_ms_sum = 0, modeled_tpot_ms_sum = 0;
  uint64_t modeled_ttft_n = 0, modeled_tpot_n = 0;
  double step_ms_sum = 0, modeled_step_ms_sum = 0, flag_wait_ms_sum = 0;
  uint64_t kv_bytes_copied = 0, restarts_seen = 0;
  nlohmann::json to_json() const;
};

class Frontend {
 public:
  // Binds the ROUTER at client_socket_path(run_dir) (0600). The tokenizer comes from the
  // engine's model file.
  Frontend(std::unique_ptr<Engine> engine, const std::string& run_dir,
           FrontendOptions options = {});
  ~Frontend();
  Frontend(const Frontend&) = delete;
  Frontend& operator=(const Frontend&) = delete;

  // Reads waiting client messages, runs at most one engine step, sends its results, reaps
  // vanished clients. Never blocks. Returns true while there is work to step.
  bool pump();
  // pump() in its two halves, for the router of several models (model_router.h), which steps
  // one model per turn but keeps every model's deadlines on every turn: pump_io reads the
  // client socket, reaps (heartbeats, resume waits, idle sessions) and sends what is waiting;
  // step_once runs at most one engine step and sends what it produced.
  void pump_io();
  void step_once();
  // Calls pump() until there is no work or `budget` has passed (for a service loop's idle hook).
  void pump_for(std::chrono::milliseconds budget);
  // Serves until `stop` is set: waits on the socket (at most `idle_tick`) only when idle.
  void serve(const std::atomic<bool>& stop,
             std::chrono::milliseconds idle_tick = std::chrono::milliseconds(20));

  bool has_work() const;
  zmq::socket_t& socket() { return *socket_; }
  const std::string& socket_path() const { return socket_path_; }
  Engine& engine() { return *engine_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  nlohmann::json status() const;
  const StackMetrics& metrics() const { return metrics_; }
  const std::string& model_name() const { return options_.model_name; }

  // One client message (verified here; errors answered to its sender). The router of several
  // models (model_router.h) hands each message to its model's frontend through this.
  void handle(msg::Envelope& env);
  // Whether a request (client routing, client's id) or a chat session is this frontend's: the
  // router sends a Cancel, KeepAlive, Resume or CloseSession to the model that holds it.
  bool holds_request(const std::vector<std::string>& routing, uint64_t id) const;
  bool holds_session(uint64_t session) const { return sessions_.count(session) > 0; }

 private:
  using Key = std::pair<std::string, uint64_t>;  // (client identity, client's request id)
  struct Session {
    uint64_t seq_id = 0;
    bool open = false;  // the engine holds its sequence
    bool busy = false;  // a turn is in flight
    int32_t n_past = 0;
    std::optional<int32_t> pending;  // last sampled token, appended at the next turn
    double last_used_ms = 0;
    // A session is either a chat (turns of messages: the conversation is kept so a turn's
    // prompt is the template's text after the last reply) or raw (turns of prompt text / ids).
    enum class Kind { unset, chat, raw } kind = Kind::unset;
    ChatHistory chat;
    bool chat_cut = false;  // a turn ended inside its prompt: the KV and the history disagree
  };
  enum class SendResult { sent, full, vanished };

  // frontend.cpp (socket, replies) and frontend_requests.cpp (requests): messages in and out
  void read_socket();
  // A message read from the socket: handled here, or by the router's choice of model.
  void dispatch(msg::Envelope& env) { options_.dispatch ? options_.dispatch(env) : handle(env); }
  void on_generate(const std::vector<std::string>& routing, uint64_t id,
                   const fb::client::Generate& g);
  void on_eval(const std::vector<std::string>& routing, uint64_t id, const fb::client::Eval& e);
  void on_cancel(const std::vector<std::string>& routing, uint64_t id, uint64_t target);
  void on_close_session(const std::vector<std::string>& routing, uint64_t id, uint64_t session);
  // frontend_resume.cpp: the request journal (issue 22)
  void on_resume(const std::vector<std::string>& routing, uint64_t id,
                 const fb::client::Resume& resume);
  void adopt_journal(std::vector<JournalRecord> records);
  void adopt_record(JournalRecord& rec);
  void journal_begin(Request& r);
  void journal_progress(Request& r);  // after a step or at the end (finish, fail)
  nlohmann::json journal_status() const;
  void check_plan(const flatbuffers::String* plan) const;
  void check_model(const flatbuffers::String* model) const;
  // frontend_trace.cpp: `duet trace` (issue 23)
  void on_trace(const std::vector<std::string>& routing, uint64_t id, const fb::client::Trace& t);
  nlohmann::json build_trace(uint64_t number) const;
  void record_step(std::vector<uint64_t> request_numbers, const StepStats& stats);
  nlohmann::json trace_status() const;
  // frontend_warmup.cpp: Warmup (engines built, one step per token bucket, then a decode), a job
  // step_once() advances one unit at a time while no request is open.
  struct WarmupJob {
    std::vector<std::string> routing;  // the asking client's
    uint64_t id = 0;
    struct Lane {
      Engine* engine;
      const char* name;                // "main", "proactive"
      std::vector<int> prefill_steps;  // tokens of each prefill step, before the decode
    };
    std::vector<Lane> lanes;
    size_t lane = 0;    // the engine being warmed
    bool open = false;  // its scratch sequence is open
    uint64_t seq = 0;
    int32_t pos = 0;
    std::vector<int> sizes;     // this engine's steps (the last one the decode)
    std::vector<int32_t> text;  // the steps' tokens, cycled
    nlohmann::json steps, engines = nlohmann::json::array();
    double started_ms = 0, lane_started_ms = 0, open_ms = 0;  // now_ms()'s clock
  };
  void on_warmup(const std::vector<std::string>& routing, uint64_t id, const fb::client::Warmup& w);
  void warm_up_next();
  WarmupJob take_warmup();  // ends the job (its scratch sequence closed)
  void fail_warmup(Errc code, const std::string& message);
  void end_warmup(nlohmann::json reply);
  void reply_warmup(const std::vector<std::string>& routing, uint64_t id, const nlohmann::json& j);
  // frontend_tokenize.cpp: the model's tokenizer for clients (http_svc's /tokenize, /detokenize)
  void on_tokenize(const std::vector<std::string>& routing, uint64_t id,
                   const fb::client::Tokenize& t);
  void on_detokenize(const std::vector<std::string>& routing, uint64_t id,
                     const fb::client::Detokenize& d);
  SendResult send_to(const std::vector<std::string>& routing, std::span<const uint8_t> bytes);
  // An eval on another plan's engine, run to completion at once (eval is one request).
  void eval_on_plan(const std::vector<std::string>& routing, uint64_t id, const std::string& plan,
                    const std::vector<int32_t>& ids);
  void reply_error(const std::vector<std::string>& routing, uint64_t id, Errc code,
                   const std::string& message);
  // Queues `bytes` for the request's client; a vanished client marks the request "disconnected".
  void deliver(Request& r, msg::Bytes bytes);
  void flush_outboxes();

  // frontend_step.cpp and frontend_stream.cpp: the step and what follows from it
  void open_request(Request* r);
  // frontend_step.cpp: the two lanes (Agent.xpu). A step's results go to its batch's requests.
  Engine& engine_of(const Request& r) { return r.proactive_lane ? *proactive_engine_ : *engine_; }
  void run_main_step(const StepBatch& batch);
  void run_proactive_step(std::optional<StepBatch> fresh);  // nullopt: resume the parked one
  void apply_batch(const StepBatch& batch, const std::vector<float>& logits,
                   const StepStats& stats);
  void close_seq_of(Request& r);  // deferred while r's step is parked
  nlohmann::json agent_status() const;
  // step() books its wall time by what ran while proactive work waited (proactive_time.h).
  void step();
  StepKind step_lanes();
  ProactiveState proactive_state() const;
  // A request of the parked proactive step has waited past the aging threshold since its
  // arrival or its last token: the step resumes even with reactive work present.
  bool parked_step_aged(double now) const;
  // Overlap (AgentConfig::overlap, frontend_overlap.cpp): the proactive step on a worker beside
  // the main engine's steps. Its batch is parked_batch_ from its start (its requests are
  // in_parked_step: no main step touches them) until it ends.
  StepKind step_overlapped(const StepBatch& main, StepKind main_kind, double now);
  void start_overlapped_step(std::optional<StepBatch> fresh);  // nullopt: resume the parked one
  void collect_overlapped_step();                              // blocks until it is over
  void apply_part(const StepPart& part, std::span<const float> logits, const StepStats& stats,
                  double now);
  // lp: the token's log-probabilities when the request asked for them (kept if it is appended).
  void accept_token(Request& r, int32_t token, double now, const TokenLogprobs* lp = nullptr);
  void stream_out(Request& r);
  void finish(Request& r, const std::string& reason);
  void fail(Request& r, Errc code, const std::string& message);
  void release(Request& r);  // frees KV (or hands it back to its session) and forgets r
  void reap(double now);
  msg::Bytes make_done(const Request& r) const;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::client::TokenLogprob>>>
  logprobs_of(flatbuffers::FlatBufferBuilder& fbb, const Request& r, size_t from) const;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::client::TokenLogprob>>>
  prompt_logprobs_of(flatbuffers::FlatBufferBuilder& fbb, const Request& r) const;

  std::unique_ptr<Engine> engine_;
  std::map<std::string, std::unique_ptr<Engine>> plan_engines_;  // options_.make_engine's
  FrontendOptions options_;
  Tokenizer tokenizer_;
  std::string model_chat_template_;  // tokenizer.chat_template ("" = none)
  std::string run_dir_;
  std::string socket_path_;
  std::shared_ptr<zmq::socket_t> socket_;  // bound here, or the router's (options_.shared_socket)
  Scheduler scheduler_;
  std::map<Key, std::unique_ptr<Request>> requests_;
  std::map<uint64_t, Session> sessions_;
  uint64_t next_seq_id_ = 1;
  std::optional<WarmupJob> warmup_;  // a Warmup in progress
  nlohmann::json last_warmup_;       // the last Warmup's reply (status "warmup"); null: none yet
  double started_ms_ = 0;
  double last_reap_ms_ = 0;
  StackMetrics metrics_;
  // `duet trace`: requests are numbered as they arrive; the ring of recent steps.
  uint64_t requests_numbered_ = 0;
  int64_t pass_begin_ns_ = 0;  // when the current pump's step() began
  StepRing step_ring_{0};
  // Agent.xpu lane state (frontend_step.cpp).
  std::unique_ptr<Engine> proactive_engine_;  // options_.make_proactive_engine's
  AsyncStep async_;  // after proactive_engine_: it waits for a running step before the engine goes
  bool async_resuming_ = false;
  double async_asked_us_ = 0;              // when a preemption of the overlapped step was asked
  std::optional<StepBatch> parked_batch_;  // the proactive step stopped at an op boundary
  std::vector<uint64_t> deferred_close_;   // sequences released while their step was parked
  Lane last_lane_ = Lane::main;
  StepWatch watch_;
  struct AgentMetrics {
    uint64_t preemptions = 0, resumes = 0, proactive_steps = 0, held_messages = 0;
    // Algorithm 2 riding: main-engine steps carrying proactive-lane decoders, those of them
    // that also carry reactive work (shared), and the proactive decode tokens in each kind.
    uint64_t ride_steps = 0, ride_tokens = 0, shared_steps = 0, shared_tokens = 0;
    uint64_t max_proactive_in_reactive_step = 0;  // proactive decoders in one step with reactive
    uint64_t carried_tokens = 0;  // proactive decode tokens done in proactive prefill steps
    double preempt_latency_us_sum = 0, preempt_latency_us_max = 0;
  } agent_metrics_;
  ProactiveTimeBook proactive_time_;
  struct JournalMetrics {
    uint64_t journaled = 0, unjournaled = 0, adopted_live = 0, adopted_finished = 0, dropped = 0,
             resumed = 0, resume_unknown = 0, kv_pages_reclaimed = 0;
    double adoption_ms = 0;
    std::vector<std::string> drop_reasons;  // the first few
  } journal_metrics_;
};

double now_ms();  // steady clock, milliseconds
// Device restarts an engine has seen ("restarts" in its status; 0 when it does not say).
uint64_t engine_restarts(const Engine& e);
// A client connection's identity as a map key (its ROUTER routing frames).
std::string peer_key(const std::vector<std::string>& routing);
// Byte offset of the first invalid UTF-8 sequence, or npos when the text is valid.
size_t invalid_utf8_at(std::string_view text);

}  // namespace duet::frontend
