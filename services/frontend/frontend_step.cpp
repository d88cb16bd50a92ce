// Frontend: the engine step: choosing the lanes (main, proactive, parked), running the main and
// proactive steps, applying a batch's logits to its requests, and the agent policy's status.
// What happens to a request after its step is in frontend_stream.cpp, admission in
// frontend_admit.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <utility>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

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

}  // namespace duet::frontend
