// Frontend: admission, the engine step, sampling, streaming and the end of a request.
// Over 600 lines (issue 26): one responsibility, a request's path through a step; split (admission
// / sampling and streaming) once the branches editing it this session have merged.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <utility>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

// Where text may be cut without splitting a UTF-8 character: back from `end` past continuation
// bytes.
size_t utf8_boundary(const std::string& text, size_t end) {
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  return end;
}

}  // namespace

// Device restarts the engine has seen ("restarts" in its status; 0 when it does not say).
uint64_t engine_restarts(const Engine& e) {
  try {
    const nlohmann::json s = e.status();
    auto it = s.find("restarts");
    return it != s.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  } catch (const std::exception&) {
    return 0;  // a status the engine cannot give now must not end a request
  }
}

bool Frontend::parked_step_aged(double now) const {
  for (const StepPart& p : parked_batch_->parts)
    if (p.request && now - std::max(p.request->arrived_ms, p.request->last_token_ms) >
                         scheduler_.agent_config().aging_ms)
      return true;
  return false;
}

ProactiveState Frontend::proactive_state() const {
  ProactiveState s;
  s.pending = scheduler_.queued(Priority::proactive) > 0;
  s.in_flight = async_.running();
  s.parked = parked_batch_.has_value() && !s.in_flight;
  for (const Request* r : scheduler_.running_requests()) {
    if (!r->finish_reason.empty()) continue;
    if (r->priority == Priority::reactive) {
      s.reactive = true;
      continue;
    }
    s.pending = true;
    s.prefill_due = s.prefill_due || r->prefilling() || r->in_parked_step;
    s.decoders = s.decoders || r->decoding();
  }
  return s;
}

void Frontend::step() {
  pass_begin_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
  const ProactiveState before = proactive_state();
  const double t0 = now_ms();
  const StepKind kind = step_lanes();
  proactive_time_.on_step(t0, now_ms(), before, kind, proactive_state());
}

namespace {

StepKind kind_of_main(const StepBatch& batch) {
  bool reactive = false, proactive = false;
  for (const StepPart& p : batch.parts)
    (p.request->priority == Priority::reactive ? reactive : proactive) = true;
  if (batch.empty()) return StepKind::none;
  return reactive && proactive ? StepKind::main_shared
         : reactive            ? StepKind::main_reactive
                               : StepKind::main_proactive;
}

}  // namespace

StepKind Frontend::step_lanes() {
  std::vector<std::pair<Request*, Error>> refused;
  try {
    scheduler_.admit([&](Request* r) {
      try {
        open_request(r);
      } catch (const Error& e) {
        // The KV cache is full: r waits for its turn, which comes when a running request ends
        // and returns its pages. With none running nothing will ever free them: r can never run
        // and fails now instead of waiting without a deadline (issue 20).
        if (e.code() == Errc::busy && scheduler_.running() > 0) throw;
        refused.emplace_back(r, e);  // r can never run: it fails once admitted
      }
    });
  } catch (const Error&) {
  }
  for (auto& [r, e] : refused) fail(*r, e.code(), e.what());
  // Algorithm 2 for real: when the proactive engine shares the main engine's KV pool, proactive
  // decoders decode in the main engine's steps and the proactive engine runs prefill only.
  scheduler_.set_riding(proactive_engine_ && engine_->kv_share() &&
                            engine_->kv_share() == proactive_engine_->kv_share(),
                        options_.max_running);
  // An overlapped proactive step that ended meanwhile: its results first, so that a prompt it
  // finished decodes in this pass's main step.
  if (async_.running() && async_.done()) collect_overlapped_step();
  const double now = now_ms();
  StepBatch main = scheduler_.build(engine_->max_step_tokens(), now, Lane::main);
  // Classified before the step: its requests may be gone after it.
  const StepKind main_kind = kind_of_main(main);
  if (!proactive_engine_) {
    run_main_step(main);
    return main_kind;
  }
  if (scheduler_.agent_config().overlap != agent::AgentConfig::Overlap::off && scheduler_.riding())
    return step_overlapped(main, main_kind, now);
  // The proactive lane: a parked step resumes once the gating of the lane lets it (no reactive
  // work, or one of its requests aged); else a fresh proactive batch, gated the same way.
  bool proactive_ready = false;
  std::optional<StepBatch> fresh;
  if (parked_batch_) {
    proactive_ready = !scheduler_.reactive_present() || parked_step_aged(now);
  } else {
    fresh = scheduler_.build(proactive_engine_->max_step_tokens(), now, Lane::proactive);
    proactive_ready = !fresh->empty();
  }
  // Both lanes ready (only when no reactive work is left, or aged proactive work is due; with
  // riding, the main lane is then the proactive decoders): they take turns, so neither starves.
  if (!main.empty() && (!proactive_ready || last_lane_ == Lane::proactive)) {
    last_lane_ = Lane::main;
    run_main_step(main);
    return main_kind;
  }
  if (proactive_ready) {
    last_lane_ = Lane::proactive;
    run_proactive_step(std::move(fresh));
    return StepKind::proactive_lane;
  }
  return StepKind::none;
}

void Frontend::run_main_step(const StepBatch& batch) {
  if (batch.empty()) return;
  uint64_t riders = 0, proactive_decoders = 0;
  bool reactive = false;
  for (const StepPart& p : batch.parts) {
    reactive = reactive || p.request->priority == Priority::reactive;
    if (p.decode && p.request->priority == Priority::proactive) ++proactive_decoders;
    if (p.decode && p.request->proactive_lane) ++riders;
  }
  AgentMetrics& m = agent_metrics_;
  if (riders > 0) {
    ++m.ride_steps;
    m.ride_tokens += riders;
    if (reactive) {
      ++m.shared_steps;
      m.shared_tokens += riders;
    }
  }
  if (reactive)
    m.max_proactive_in_reactive_step =
        std::max(m.max_proactive_in_reactive_step, proactive_decoders);
  StepStats stats;
  std::vector<float> logits;
  try {
    logits = engine_->step(batch.entries, &stats);
  } catch (const std::exception& e) {
    // The step's requests cannot go on (their KV state is unknown); everyone else can.
    const Errc code =
        dynamic_cast<const Error*>(&e) ? static_cast<const Error&>(e).code() : Errc::internal;
    for (const StepPart& p : batch.parts) fail(*p.request, code, e.what());
    return;
  }
  // The slack rule's step time model learns from every main-engine step (scheduler.h).
  size_t step_tokens = 0;
  for (const StepPart& p : batch.parts) step_tokens += p.n_tokens;
  scheduler_.observe_main_step(static_cast<int>(step_tokens), stats.measured_us);
  apply_batch(batch, logits, stats);
}

void Frontend::run_proactive_step(std::optional<StepBatch> fresh) {
  Engine& engine = *proactive_engine_;
  const bool resuming = !fresh.has_value();
  StepStats stats;
  std::optional<std::vector<float>> logits;
  std::deque<msg::Envelope> held;
  double asked_us = 0;  // steady clock, when a reactive arrival asked for the preemption
  auto us_now = [] { return now_ms() * 1000.0; };
  try {
    if (!resuming && (!engine.preemptible() || !scheduler_.agent_config().preempt_proactive)) {
      logits = engine.step(fresh->entries, &stats);
    } else {
      // The step runs on a worker; this thread reads the clients meanwhile and preempts the step
      // at the first reactive Generate. Every message is handled once the step has stopped.
      logits = watch_.run(
          [&]() -> std::optional<std::vector<float>> {
            return resuming ? engine.resume(&stats)
                            : engine.step_preemptible(fresh->entries, &stats);
          },
          *socket_, held, 256,
          [&](const msg::Envelope& env) {
            if (asked_us > 0) return;
            try {
              const fbc::ClientMessage* m = msg::verify_client(env.payload);
              if (m->body_type() != fbc::ClientBody::Generate ||
                  m->body_as_Generate()->priority() != fbc::Priority::Reactive)
                return;
            } catch (const Error&) {
              return;  // handled (refused) after the step like any other message
            }
            asked_us = us_now();
            engine.request_preempt();
          });
    }
  } catch (const std::exception& e) {
    const Errc code =
        dynamic_cast<const Error*>(&e) ? static_cast<const Error&>(e).code() : Errc::internal;
    StepBatch batch = resuming ? std::move(*parked_batch_) : std::move(*fresh);
    parked_batch_.reset();
    for (const StepPart& p : batch.parts)
      if (p.request) p.request->in_parked_step = false;
    for (uint64_t seq : std::exchange(deferred_close_, {})) engine.close_seq(seq);
    for (const StepPart& p : batch.parts)
      if (p.request) fail(*p.request, code, e.what());
    for (msg::Envelope& env : held) dispatch(env);
    return;
  }
  ++agent_metrics_.proactive_steps;
  agent_metrics_.held_messages += held.size();
  if (!logits) {
    // Parked at an op boundary: its activations stay in the proactive engine's arena and its KV
    // rows in place until it resumes.
    ++agent_metrics_.preemptions;
    const double latency = asked_us > 0 ? us_now() - asked_us : 0;
    agent_metrics_.preempt_latency_us_sum += latency;
    agent_metrics_.preempt_latency_us_max =
        std::max(agent_metrics_.preempt_latency_us_max, latency);
    if (!resuming) {
      parked_batch_ = std::move(*fresh);
      for (const StepPart& p : parked_batch_->parts) p.request->in_parked_step = true;
    }
  } else {
    if (resuming) ++agent_metrics_.resumes;
    StepBatch batch = resuming ? std::move(*parked_batch_) : std::move(*fresh);
    parked_batch_.reset();
    for (const StepPart& p : batch.parts)
      if (p.request) p.request->in_parked_step = false;
    for (uint64_t seq : std::exchange(deferred_close_, {})) engine.close_seq(seq);
    for (const StepPart& p : batch.parts) agent_metrics_.carried_tokens += p.decode ? 1 : 0;
    apply_batch(batch, *logits, stats);
  }
  // After the step's results: a Cancel among them finds its request as it now is.
  for (msg::Envelope& env : held) dispatch(env);
}

void Frontend::apply_batch(const StepBatch& batch, const std::vector<float>& logits,
                           const StepStats& stats) {
  const size_t n_vocab = static_cast<size_t>(tokenizer_.n_vocab());
  if (logits.size() != batch.n_logit_rows * n_vocab) {
    const std::string what = "engine returned " + std::to_string(logits.size()) +
                             " logits, expected " + std::to_string(batch.n_logit_rows * n_vocab);
    for (const StepPart& p : batch.parts)
      if (p.request) fail(*p.request, Errc::internal, what);
    return;
  }
  ++metrics_.steps;
  metrics_.step_tokens += stats.n_tokens;
  metrics_.step_ms_sum += stats.measured_us / 1000.0;
  metrics_.modeled_step_ms_sum += stats.modeled_us / 1000.0;
  metrics_.flag_wait_ms_sum += stats.flag_wait_us / 1000.0;
  metrics_.kv_bytes_copied += stats.kv_bytes_copied;
  // (Read before sampling: a request that ends in apply_part is freed there.)
  std::vector<uint64_t> numbers;
  if (step_ring_.enabled())
    for (const StepPart& p : batch.parts)
      if (p.request) numbers.push_back(p.request->number);
  const double now = now_ms();
  for (const StepPart& p : batch.parts) {
    if (!p.request) continue;  // released while its step was parked
    std::span<const float> rows(logits.data() + p.first_logit_row * n_vocab,
                                p.n_logit_rows * n_vocab);
    try {
      apply_part(p, rows, stats, now);
    } catch (const Error& e) {
      fail(*p.request, e.code(), e.what());
    } catch (const std::exception& e) {
      fail(*p.request, Errc::internal, e.what());
    }
  }
  // After sampling: the record's end is when the step's tokens were out.
  if (step_ring_.enabled()) record_step(std::move(numbers), stats);
}

void Frontend::close_seq_of(Request& r) {
  if (r.proactive_lane && parked_batch_) {
    bool parked = false;
    for (StepPart& p : parked_batch_->parts)
      if (p.request == &r) {
        p.request = nullptr;
        parked = true;
      }
    if (parked) {
      // Its KV is part of the parked step: freed once that step is over.
      deferred_close_.push_back(r.seq_id);
      return;
    }
  }
  engine_of(r).close_seq(r.seq_id);
}

nlohmann::json Frontend::agent_status() const {
  const AgentMetrics& m = agent_metrics_;
  nlohmann::json j = {
      {"proactive_engine", proactive_engine_ != nullptr},
      {"preemptible", proactive_engine_ && proactive_engine_->preemptible()},
      {"parked", parked_batch_.has_value() && !async_.running()},
      {"in_flight", async_.running()},
      {"preemptions", m.preemptions},
      {"resumes", m.resumes},
      {"proactive_steps", m.proactive_steps},
      {"messages_held_during_steps", m.held_messages},
      {"preempt_latency_mean_us", m.preemptions ? m.preempt_latency_us_sum / m.preemptions : 0.0},
      {"preempt_latency_max_us", m.preempt_latency_us_max},
      {"riding", scheduler_.riding()},
      {"ride_steps", m.ride_steps},
      {"ride_tokens", m.ride_tokens},
      {"shared_steps", m.shared_steps},
      {"shared_tokens", m.shared_tokens},
      {"max_proactive_in_reactive_step", m.max_proactive_in_reactive_step},
      {"decode_cap", scheduler_.agent_config().decode_cap},
      {"rider_slack", std::isinf(scheduler_.agent_config().rider_slack)
                          ? nlohmann::json(nullptr)
                          : nlohmann::json(scheduler_.agent_config().rider_slack)},
      {"slack_refused", scheduler_.slack_refused()},
      {"carry", scheduler_.agent_config().carry_decoders},
      {"preempt_proactive", scheduler_.agent_config().preempt_proactive},
      {"overlap", scheduler_.agent_config().overlap == agent::AgentConfig::Overlap::off ? "off"
                  : scheduler_.agent_config().overlap == agent::AgentConfig::Overlap::proactive
                      ? "proactive"
                      : "all"},
      {"proactive_plan", proactive_engine_ ? proactive_engine_->plan_name() : ""},
      {"carried_tokens", m.carried_tokens},
      {"aging_ms", scheduler_.agent_config().aging_ms},
      {"proactive_time_ms", proactive_time_.to_json()}};
  // (Not while its step runs on a worker: the engine is that thread's until the step ends.)
  if (proactive_engine_ && !async_.running()) j["engine"] = proactive_engine_->status();
  // What the slack rule predicts from: the main engine's mean step time per token count (ms).
  nlohmann::json step_ms = nlohmann::json::object();
  const agent::StepTimeModel& model = scheduler_.step_times();
  for (int n = 1; n <= std::min(model.max_tokens_seen(), 8); ++n)
    if (const std::optional<double> t = model.predict(n))
      step_ms[std::to_string(n)] = std::round(*t / 10.0) / 100.0;
  j["main_step_ms_by_tokens"] = step_ms;
  return j;
}

void Frontend::apply_part(const StepPart& part, std::span<const float> logits,
                          const StepStats& stats, double now) {
  Request& r = *part.request;
  r.pos += static_cast<int32_t>(part.n_tokens);
  r.flag_wait_us += stats.flag_wait_us;
  r.kv_bytes_copied += stats.kv_bytes_copied;
  if (part.decode) {
    r.modeled_decode_us += stats.modeled_us;
    ++r.modeled_decode_steps;
    r.next_token.reset();
  } else {
    r.n_prefilled += part.n_tokens;
    r.modeled_prefill_us += stats.modeled_us;
  }
  if (r.kind == RequestKind::eval) {
    r.eval_logits.insert(r.eval_logits.end(), logits.begin(), logits.end());
    if (!r.prefilling()) finish(r, "length");
    return;
  }
  if (part.n_logit_rows == 0) {  // a prefill chunk before the last
    journal_progress(r);
    return;
  }
  accept_token(r, r.sampler->sample(logits), now);
}

void Frontend::accept_token(Request& r, int32_t token, double now) {
  if (r.first_token_ms == 0) r.first_token_ms = now;
  r.last_token_ms = now;
  r.next_token = token;
  if (tokenizer_.is_eog(token) && !r.ignore_eos) {  // EOS, EOT and the vocab's other ends
    finish(r, "eos");
    return;
  }
  const size_t scan_from = r.text_sent;  // text before it was released: no stop string there
  r.generated.push_back(token);
  r.text += r.decoder->push(token);
  if (!r.stop.empty()) {
    size_t cut = std::string::npos;
    for (const auto& s : r.stop) cut = std::min(cut, r.text.find(s, scan_from));
    if (cut != std::string::npos) {
      r.text.resize(cut);
      finish(r, "stop");
      return;
    }
  }
  if (static_cast<int>(r.generated.size()) >= r.max_tokens) {
    finish(r, "length");
    return;
  }
  // Journaled before it is streamed: a token a client has is always in the journal, so a
  // restarted frontend can resume from whatever the client got.
  journal_progress(r);
  if (r.stream) stream_out(r);
}

void Frontend::stream_out(Request& r) {
  if (r.awaiting_resume) return;  // adopted: its client's Resume says where its stream stands
  // Text that may still turn out to start a stop string is held back until it cannot.
  const bool over = !r.finish_reason.empty();
  const size_t hold = over || r.max_stop_bytes == 0 ? 0 : r.max_stop_bytes - 1;
  const size_t end = utf8_boundary(r.text, r.text.size() > hold ? r.text.size() - hold : 0);
  if (end <= r.text_sent && r.ids_sent >= r.generated.size()) return;
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<int32_t> ids(r.generated.begin() + static_cast<std::ptrdiff_t>(r.ids_sent),
                           r.generated.end());
  const std::string text =
      end > r.text_sent ? r.text.substr(r.text_sent, end - r.text_sent) : std::string();
  auto body = fbc::CreateTokenChunkDirect(fbb, r.client_request_id, &ids, text.c_str());
  fbb.Finish(
      fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::TokenChunk, body.Union()),
      fbc::ClientMessageIdentifier());
  r.ids_sent = r.generated.size();
  r.text_sent = std::max(r.text_sent, end);
  deliver(r, msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
}

msg::Bytes Frontend::make_done(const Request& r) const {
  flatbuffers::FlatBufferBuilder fbb;
  const double ttft = r.first_token_ms > 0 ? r.first_token_ms - r.arrived_ms : 0;
  const size_t sampled = r.generated.size() - r.adopted_tokens + (r.finish_reason == "eos" ? 1 : 0);
  const double tpot = sampled > 1 ? (r.last_token_ms - r.first_token_ms) / double(sampled - 1) : 0;
  const double queue = r.admitted_ms > 0 ? r.admitted_ms - r.arrived_ms : 0;
  const double modeled_tpot =
      r.modeled_decode_steps ? r.modeled_decode_us / r.modeled_decode_steps / 1000.0 : 0;
  const uint64_t restarts = engine_restarts(*engine_);
  const Engine& ran = r.proactive_lane && proactive_engine_ ? *proactive_engine_ : *engine_;
  auto stats = fbc::CreateStatsDirect(
      fbb, r.prompt_tokens, static_cast<uint32_t>(r.generated.size()), ttft, tpot, queue,
      r.modeled_prefill_us / 1000.0, modeled_tpot, r.flag_wait_us / 1000.0, r.kv_bytes_copied,
      static_cast<uint32_t>(restarts > r.restarts_at_start ? restarts - r.restarts_at_start : 0),
      engine_->plan_name().c_str(), r.finish_reason.c_str(), ran.executed_plan().c_str(),
      ran.modeled_plan().c_str());
  auto body = fbc::CreateDoneDirect(fbb, r.client_request_id, r.text.c_str(), &r.generated, stats);
  fbb.Finish(
      fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::Done, body.Union()),
      fbc::ClientMessageIdentifier());
  return msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

void Frontend::finish(Request& r, const std::string& reason) {
  r.finish_reason = reason;
  if (r.kind == RequestKind::eval && reason == "length") {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fbc::CreateEvalReplyDirect(
        fbb, r.prompt_tokens, static_cast<uint32_t>(tokenizer_.n_vocab()), &r.eval_logits);
    fbb.Finish(fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::EvalReply,
                                        body.Union()),
               fbc::ClientMessageIdentifier());
    deliver(r, msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
    ++metrics_.completed;
  } else if (r.kind == RequestKind::eval) {
    deliver(r,
            msg::make_client_error(r.client_request_id, Errc::cancelled,
                                   "eval " + std::to_string(r.client_request_id) + " " + reason));
    ++(reason == "disconnected" ? metrics_.reaped : metrics_.cancelled);
  } else {
    if (reason != "stop") r.text += r.decoder->flush();
    journal_progress(r);  // before anything of it goes out (accept_token)
    if (r.stream) stream_out(r);
    if (!r.awaiting_resume) deliver(r, make_done(r));  // else at its Resume (frontend_resume.cpp)
    if (reason == "cancelled")
      ++metrics_.cancelled;
    else if (reason == "disconnected")
      ++metrics_.reaped;
    else
      ++metrics_.completed;
    metrics_.prompt_tokens += r.prompt_tokens;
    metrics_.generated_tokens += r.generated.size();
    if (r.first_token_ms > 0) {
      metrics_.ttft_ms_sum += r.first_token_ms - r.arrived_ms;
      ++metrics_.ttft_n;
      if (r.modeled_prefill_us > 0) {
        metrics_.modeled_ttft_ms_sum += r.modeled_prefill_us / 1000.0;
        ++metrics_.modeled_ttft_n;
      }
    }
    const size_t sampled = r.generated.size() - r.adopted_tokens + (reason == "eos" ? 1 : 0);
    if (sampled > 1) {
      metrics_.tpot_ms_sum += (r.last_token_ms - r.first_token_ms) / double(sampled - 1);
      ++metrics_.tpot_n;
    }
    if (r.modeled_decode_steps) {
      metrics_.modeled_tpot_ms_sum += r.modeled_decode_us / r.modeled_decode_steps / 1000.0;
      ++metrics_.modeled_tpot_n;
    }
  }
  if (r.admitted_ms > 0) {
    metrics_.queue_ms_sum += r.admitted_ms - r.arrived_ms;
    ++metrics_.queue_n;
  }
  const uint64_t restarts = engine_restarts(*engine_);
  if (restarts > r.restarts_at_start) metrics_.restarts_seen += restarts - r.restarts_at_start;
  release(r);
}

void Frontend::fail(Request& r, Errc code, const std::string& message) {
  r.finish_reason = "error";
  deliver(r, msg::make_client_error(r.client_request_id, code, message));
  journal_progress(r);
  ++metrics_.failed;
  if (r.session) {
    // The session's KV may hold half a step: it cannot be trusted for the next turn.
    auto it = sessions_.find(r.session);
    if (it != sessions_.end()) {
      if (it->second.open) engine_->close_seq(it->second.seq_id);
      sessions_.erase(it);
    }
    r.seq_open = false;
  }
  release(r);
}

void Frontend::release(Request& r) {
  if (!r.released) {
    r.released = true;
    scheduler_.remove(&r);
    if (r.session) {
      auto it = sessions_.find(r.session);
      if (it != sessions_.end()) {
        Session& s = it->second;
        s.busy = false;
        s.last_used_ms = now_ms();
        if (r.n_prefilled > 0) {
          s.n_past = r.pos;
          // The last sampled token is not in the KV yet: the next turn appends it first.
          s.pending = r.prefilling() ? std::nullopt : r.next_token;
          if (r.chat_turn && r.prefilling()) s.chat_cut = true;
          if (r.chat_turn && !r.prefilling()) {
            if (s.kind == Session::Kind::unset) s.kind = Session::Kind::chat;
            s.chat.family = r.chat_family;
            s.chat.messages.insert(s.chat.messages.end(), r.chat_messages.begin(),
                                   r.chat_messages.end());
            s.chat.messages.push_back({"assistant", r.text});
          }
        }  // else the turn appended nothing and the session stays as it was
        if (!s.open) sessions_.erase(it);  // never admitted: nothing to keep
      }
    } else if (r.seq_open) {
      close_seq_of(r);
    }
    r.seq_open = false;
  }
  // Messages the client has not taken yet still go out; the request is kept until they do, or
  // (adopted) until its client resumes it.
  if ((!r.outbox.empty() || r.awaiting_resume) && !r.vanished) return;
  requests_.erase({peer_key(r.routing), r.client_request_id});
}

void Frontend::reap(double now) {
  last_reap_ms_ = now;
  std::vector<Request*> gone, drained;
  for (auto& [key, r] : requests_) {
    if (r->awaiting_resume && now - r->adopted_ms > options_.resume_wait_ms) {
      r->vanished = true;  // adopted, and its client never came back for it
      if (!r->finish_reason.empty()) {
        drained.push_back(r.get());
        continue;
      }
      gone.push_back(r.get());
      continue;
    }
    if (!r->finish_reason.empty()) {
      // Finished, waiting for its outbox: forget it once delivered or its client is gone.
      if ((r->outbox.empty() && !r->awaiting_resume) || r->vanished) drained.push_back(r.get());
      continue;
    }
    // The client beats three times per period (core/ipc/client.h): three periods of silence is
    // gone.
    const double limit = 3.0 * r->heartbeat_ms + 20.0;
    if (r->vanished || (r->heartbeat_ms > 0 && now - r->last_seen_ms > limit))
      gone.push_back(r.get());
  }
  for (Request* r : gone) {
    // A client that stopped its KeepAlives may still be listening (a stalled thread, a loop that
    // only reads events): it learns why its request ended instead of waiting for a Done forever.
    if (!r->vanished)
      reply_error(r->routing, r->client_request_id, Errc::timeout,
                  "request " + std::to_string(r->client_request_id) + ": no KeepAlive for " +
                      std::to_string(static_cast<int64_t>(now - r->last_seen_ms)) +
                      " ms (heartbeat_ms " + std::to_string(r->heartbeat_ms) + "): cancelled");
    r->vanished = true;
    finish(*r, "disconnected");
  }
  for (Request* r : drained) release(*r);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second.busy && now - it->second.last_used_ms > options_.session_idle_ms) {
      if (it->second.open) engine_->close_seq(it->second.seq_id);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace duet::frontend
