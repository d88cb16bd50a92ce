// Frontend: the proactive step beside the main engine's steps (AgentConfig::overlap, issue 9).
//
// Agent.xpu §4.5 ①: proactive prefill (compute-bound) may overlap the decode pipeline whenever
// no reactive prefill is pending. With overlap on, the proactive engine's step (prefill only: the
// engines share one KV pool and proactive decoders ride in the main engine's steps) runs on a
// worker thread while this thread goes on serving: reading clients, admitting, and running the
// main engine's steps over the requests that step does not hold. Its batch is parked_batch_ from
// its start: its requests are in_parked_step (no main step touches their KV, a release defers
// their close), exactly as while it is parked. Contention gating decides what may run beside it:
// a main step with reactive work under `proactive`, a reactive prefill under `all`, first parks
// it at its next op boundary (request_preempt, then wait for the worker: the preemption latency).
#include <algorithm>
#include <utility>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

StepKind Frontend::step_overlapped(const StepBatch& main, StepKind main_kind, double now) {
  using Overlap = agent::AgentConfig::Overlap;
  const Overlap overlap = scheduler_.agent_config().overlap;
  const bool reactive_main =
      main_kind == StepKind::main_reactive || main_kind == StepKind::main_shared;
  // What may run beside a proactive step now: never a reactive prefill (the prefill pipeline is
  // one request at a time, reactive first); reactive decode only under `all`.
  const bool beside =
      !scheduler_.reactive_prefill_present() && (overlap == Overlap::all || !reactive_main);
  if (async_.running() && !beside) {
    if (async_asked_us_ == 0) {
      async_asked_us_ = now_ms() * 1000.0;
      proactive_engine_->request_preempt();
    }
    collect_overlapped_step();  // parked at an op boundary (or over)
  }
  if (!async_.running()) {
    // A parked step resumes, else a fresh one starts, once the lane is open (or a request in it
    // aged) and it may run beside this pass's main step.
    bool ready = false;
    std::optional<StepBatch> fresh;
    if (parked_batch_) {
      ready = scheduler_.proactive_lane_open() || parked_step_aged(now);
    } else {
      fresh = scheduler_.build(proactive_engine_->max_step_tokens(), now, Lane::proactive);
      ready = !fresh->empty();
    }
    if (ready && (beside || main.empty())) start_overlapped_step(std::move(fresh));
  }
  if (!main.empty()) {
    run_main_step(main);
    return main_kind;
  }
  if (!async_.running()) return StepKind::none;
  // Nothing for the main engine: wait for the step or a client message, without spinning.
  async_.wait(*socket_, std::chrono::milliseconds(5));
  if (async_.done()) collect_overlapped_step();
  return StepKind::proactive_lane;
}

void Frontend::start_overlapped_step(std::optional<StepBatch> fresh) {
  const bool resuming = !fresh.has_value();
  if (!resuming) {
    parked_batch_ = std::move(*fresh);
    for (const StepPart& p : parked_batch_->parts) p.request->in_parked_step = true;
  }
  async_resuming_ = resuming;
  async_asked_us_ = 0;
  last_lane_ = Lane::proactive;
  async_.start(*proactive_engine_, resuming ? std::vector<SeqStep>{} : parked_batch_->entries,
               resuming);
}

void Frontend::collect_overlapped_step() {
  Engine& engine = *proactive_engine_;
  StepStats stats;
  AsyncStep::Result logits;
  // The step is over: its requests are free again and the closes it deferred happen now.
  auto end_batch = [&] {
    StepBatch batch = std::move(*parked_batch_);
    parked_batch_.reset();
    for (const StepPart& p : batch.parts)
      if (p.request) p.request->in_parked_step = false;
    for (uint64_t seq : std::exchange(deferred_close_, {})) engine.close_seq(seq);
    return batch;
  };
  try {
    logits = async_.collect(&stats);
  } catch (const std::exception& e) {
    const Errc code =
        dynamic_cast<const Error*>(&e) ? static_cast<const Error&>(e).code() : Errc::internal;
    const StepBatch batch = end_batch();
    for (const StepPart& p : batch.parts)
      if (p.request) fail(*p.request, code, e.what());
    return;
  }
  ++agent_metrics_.proactive_steps;
  if (!logits) {
    // Parked: its batch stays parked_batch_, its requests held, until it resumes.
    ++agent_metrics_.preemptions;
    const double latency = async_asked_us_ > 0 ? now_ms() * 1000.0 - async_asked_us_ : 0;
    agent_metrics_.preempt_latency_us_sum += latency;
    agent_metrics_.preempt_latency_us_max =
        std::max(agent_metrics_.preempt_latency_us_max, latency);
    async_asked_us_ = 0;
    return;
  }
  if (async_resuming_) ++agent_metrics_.resumes;
  async_asked_us_ = 0;
  const StepBatch batch = end_batch();
  apply_batch(batch, *logits, stats);
}

}  // namespace duet::frontend
