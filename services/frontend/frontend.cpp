// Frontend: the client socket, its pump and serve loop, replies and status. Parsing and checking
// the requests is in frontend_requests.cpp.
#include "services/frontend/frontend.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>
#include <utility>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "services/frontend/stack_engines.h"

namespace duet::frontend {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string peer_key(const std::vector<std::string>& routing) {
  std::string k;
  for (const auto& r : routing) k += std::to_string(r.size()) + ":" + r;
  return k;
}

nlohmann::json StackMetrics::to_json() const {
  auto mean = [](double sum, uint64_t n) { return n ? sum / double(n) : 0.0; };
  return {
      {"requests",
       {{"received", received},
        {"completed", completed},
        {"cancelled", cancelled},
        {"failed", failed},
        {"reaped", reaped},
        {"rejected", rejected}}},
      {"tokens", {{"prompt", prompt_tokens}, {"generated", generated_tokens}}},
      {"steps", steps},
      {"step_tokens", step_tokens},
      {"measured",
       {{"ttft_ms", mean(ttft_ms_sum, ttft_n)},
        {"tpot_ms", mean(tpot_ms_sum, tpot_n)},
        {"queue_ms", mean(queue_ms_sum, queue_n)},
        {"tokens_per_s", step_ms_sum > 0 ? double(step_tokens) * 1000.0 / step_ms_sum : 0.0},
        {"step_ms", step_ms_sum},
        {"flag_wait_ms", flag_wait_ms_sum}}},
      {"modeled",
       {{"ttft_ms", mean(modeled_ttft_ms_sum, modeled_ttft_n)},
        {"tpot_ms", mean(modeled_tpot_ms_sum, modeled_tpot_n)},
        {"tokens_per_s",
         modeled_step_ms_sum > 0 ? double(step_tokens) * 1000.0 / modeled_step_ms_sum : 0.0},
        {"step_ms", modeled_step_ms_sum}}},
      {"kv_bytes_copied", kv_bytes_copied},
      {"restarts_seen", restarts_seen},
  };
}

Frontend::Frontend(std::unique_ptr<Engine> engine, const std::string& run_dir,
                   FrontendOptions options)
    : engine_(std::move(engine)),
      options_(options),
      tokenizer_(Vocab::from_gguf(engine_->model().file())),
      model_chat_template_(engine_->model().vocab().chat_template),
      run_dir_(run_dir),
      socket_path_(client_socket_path(run_dir)),
      socket_(options_.shared_socket),
      scheduler_(options.max_running, options.max_queue) {
  scheduler_.set_agent_config(options_.agent);
  step_ring_ = StepRing(options_.trace_steps);
  const int n_ctx = engine_->model().hp().n_ctx;
  if (options_.max_context <= 0 || options_.max_context > n_ctx) options_.max_context = n_ctx;
  if (options_.max_running <= 0 || options_.max_queue < 0)
    throw Error(Errc::invalid_argument, "frontend: max_running must be > 0 and max_queue >= 0");
  if (options_.model_name.empty())
    options_.model_name = std::filesystem::path(engine_->model().file().path()).stem().string();
  if (!socket_) {
    make_private_dir(run_dir);
    socket_ = std::make_shared<zmq::socket_t>(msg::bind_router(socket_path_));
    // A send to a client that is gone fails with EHOSTUNREACH instead of vanishing silently:
    // that is how a disconnect mid-stream is noticed.
    socket_->set(zmq::sockopt::router_mandatory, true);
  }
  if (options_.make_proactive_engine) {
    proactive_engine_ = options_.make_proactive_engine();
    // Proactive generate requests outside a session run on the proactive engine (Agent.xpu).
    scheduler_.set_lane_of([](const Request& r) {
      return r.priority == Priority::proactive && r.kind == RequestKind::generate && !r.session
                 ? Lane::proactive
                 : Lane::main;
    });
  }
  if (options_.journal) adopt_journal(std::exchange(options_.recovered, {}));
  if (options_.adopt_kv) options_.adopt_kv->store(false);
  started_ms_ = now_ms();
}

Frontend::~Frontend() {
  // A frontend that stops cleanly frees its requests' KV below: nothing is left to resume.
  for (auto& [key, r] : requests_)
    if (r->journal_slot) options_.journal->free(*r->journal_slot);
  // (The proactive engine frees its own sequences, a parked step's included.)
  for (auto& [key, r] : requests_)
    if (r->seq_open && r->owns_seq && !r->proactive_lane) engine_->close_seq(r->seq_id);
  for (auto& [id, s] : sessions_)
    if (s.open) engine_->close_seq(s.seq_id);
}

bool Frontend::has_work() const {
  if (warmup_) return true;
  for (Request* r : scheduler_.running_requests())
    if (r->finish_reason.empty() && (r->prefilling() || r->decoding())) return true;
  return scheduler_.queued() > 0 && scheduler_.can_admit();
}

bool Frontend::pump() {
  pump_io();
  step_once();
  return has_work();
}

void Frontend::pump_io() {
  read_socket();
  const double now = now_ms();
  if (now - last_reap_ms_ >= 20) reap(now);
  flush_outboxes();
}

void Frontend::step_once() {
  if (warmup_)
    warm_up_next();  // until it ends, or a request comes
  else
    step();
  flush_outboxes();
}

void Frontend::pump_for(std::chrono::milliseconds budget) {
  const double end = now_ms() + double(budget.count());
  while (pump() && now_ms() < end) {
  }
}

void Frontend::serve(const std::atomic<bool>& stop, std::chrono::milliseconds idle_tick) {
  while (!stop.load()) {
    if (!pump()) {
      zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, idle_tick);
    }
  }
}

void Frontend::read_socket() {
  msg::Envelope env;
  // A bounded batch per pump, so a flood of clients cannot starve the running requests.
  for (int i = 0; i < 256 && msg::try_recv_envelope(*socket_, env); ++i) dispatch(env);
}

Frontend::SendResult Frontend::send_to(const std::vector<std::string>& routing,
                                       std::span<const uint8_t> bytes) {
  if (routing.empty()) return SendResult::vanished;
  try {
    for (const auto& r : routing) {
      zmq::message_t frame(r.data(), r.size());
      if (!socket_->send(frame, zmq::send_flags::sndmore | zmq::send_flags::dontwait))
        return SendResult::full;
    }
    zmq::message_t body(bytes.data(), bytes.size());
    if (!socket_->send(body, zmq::send_flags::dontwait)) return SendResult::full;
    return SendResult::sent;
  } catch (const zmq::error_t&) {
    // EHOSTUNREACH: the client is gone (ZMQ_ROUTER_MANDATORY). Nothing else is expected on a
    // ROUTER; whatever it is, this client cannot be reached.
    return SendResult::vanished;
  }
}

void Frontend::reply_error(const std::vector<std::string>& routing, uint64_t id, Errc code,
                           const std::string& message) {
  const msg::Bytes b = msg::make_client_error(id, code, message);
  (void)send_to(routing, b);
}

void Frontend::deliver(Request& r, msg::Bytes bytes) {
  if (r.vanished) return;
  if (r.outbox.empty()) {
    switch (send_to(r.routing, bytes)) {
      case SendResult::sent:
        return;
      case SendResult::vanished:
        r.vanished = true;
        return;
      case SendResult::full:
        break;
    }
  }
  if (r.outbox.size() >= options_.max_outbox) {
    r.vanished = true;  // a client that reads nothing for this long is treated as gone
    return;
  }
  r.outbox.push_back(std::move(bytes));
}

void Frontend::flush_outboxes() {
  for (auto& [key, r] : requests_) {
    while (!r->outbox.empty() && !r->vanished) {
      const SendResult s = send_to(r->routing, r->outbox.front());
      if (s == SendResult::full) break;
      if (s == SendResult::vanished) r->vanished = true;
      r->outbox.pop_front();
    }
  }
}

bool Frontend::holds_request(const std::vector<std::string>& routing, uint64_t id) const {
  return requests_.count({peer_key(routing), id}) > 0;
}

nlohmann::json Frontend::status() const {
  nlohmann::json running = nlohmann::json::array();
  const double now = now_ms();
  for (const Request* r : scheduler_.running_requests())
    running.push_back({{"request_id", r->client_request_id},
                       {"kind", r->kind == RequestKind::eval ? "eval" : "generate"},
                       {"priority", r->priority == Priority::reactive ? "reactive" : "proactive"},
                       {"session", r->session},
                       {"prompt_tokens", r->prompt_tokens},
                       {"prefilled", r->n_prefilled},
                       {"shared_prefix_tokens", r->shared_prefix_tokens},
                       {"generated", r->generated.size()},
                       {"number", r->number},
                       {"age_ms", now - r->arrived_ms}});
  return {{"service", "frontend"},
          {"model", options_.model_name},
          {"plan", engine_->plan_name()},
          // Issue 23: what runs here and what the modelled times are of, on the SoC.
          {"executed_plan", engine_->executed_plan()},
          {"modeled_plan", engine_->modeled_plan()},
          {"trace", trace_status()},
          {"warmup", warmup_ ? nlohmann::json{{"running", true},
                                              {"engine", warmup_->lanes[warmup_->lane].name},
                                              {"engines_done", warmup_->engines.size()}}
                             : last_warmup_},
          {"uptime_ms", now - started_ms_},
          {"queue",
           {{"reactive", scheduler_.queued(Priority::reactive)},
            {"proactive", scheduler_.queued(Priority::proactive)}}},
          {"running", running},
          {"sessions", sessions_.size()},
          {"limits",
           {{"max_running", options_.max_running},
            {"max_queue", options_.max_queue},
            {"max_context", options_.max_context},
            {"max_sessions", options_.max_sessions},
            {"max_step_tokens", engine_->max_step_tokens()}}},
          {"engine", engine_->status()},
          {"agent", agent_status()},
          {"journal", journal_status()},
          {"metrics", metrics_.to_json()}};
}

}  // namespace duet::frontend
