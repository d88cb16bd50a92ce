#include "services/frontend/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "core/base/error.h"

namespace duet::frontend {

void Scheduler::enqueue(Request* r) {
  if (static_cast<int>(queued()) >= max_queue_)
    throw Error(Errc::busy, "the request queue is full (" + std::to_string(max_queue_) +
                                " waiting, " + std::to_string(running_.size()) +
                                " running); retry later");
  queue(r->priority).push_back(r);
}

void Scheduler::remove(Request* r) {
  for (auto* q : {&reactive_, &proactive_})
    q->erase(std::remove(q->begin(), q->end(), r), q->end());
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
}

bool Scheduler::can_admit() const {
  for (const auto* q : {&reactive_, &proactive_})
    if (!q->empty() && running_in(lane_of(*q->front())) < max_running_) return true;
  return false;
}

bool Scheduler::reactive_present() const {
  // Queued reactive requests do not count: admission takes them first whenever there is room, so
  // one still queued waits for a slot that only the running (maybe proactive) requests free.
  return std::any_of(running_.begin(), running_.end(), [](const Request* r) {
    return r->priority == Priority::reactive && r->finish_reason.empty();
  });
}

bool Scheduler::reactive_prefill_present() const {
  return std::any_of(running_.begin(), running_.end(), [](const Request* r) {
    return r->priority == Priority::reactive && r->finish_reason.empty() && r->prefilling();
  });
}

bool Scheduler::proactive_lane_open() const {
  if (!reactive_present()) return true;
  return agent_.overlap == agent::AgentConfig::Overlap::all && !reactive_prefill_present();
}

StepBatch Scheduler::build(int max_step_tokens, double now_ms, Lane lane) {
  if (now_ms < 0)
    now_ms = std::chrono::duration<double, std::milli>(
                 std::chrono::steady_clock::now().time_since_epoch())
                 .count();
  StepBatch b;
  size_t budget = static_cast<size_t>(std::max(1, max_step_tokens));
  auto add = [&](Request* r, size_t n, bool decode) {
    StepPart part{r, n, decode, b.n_logit_rows, 0};
    if (decode) {
      b.entries.push_back({r->seq_id, {*r->next_token}, r->pos, true, true});
      part.n_logit_rows = 1;
    } else if (r->every_position()) {
      // Every position's logits: one entry per token (an engine fuses consecutive entries).
      for (size_t i = 0; i < n; ++i)
        b.entries.push_back(
            {r->seq_id, {r->prompt[r->n_prefilled + i]}, r->pos + static_cast<int32_t>(i), true});
      part.n_logit_rows = n;
    } else {
      const auto first = r->prompt.begin() + static_cast<std::ptrdiff_t>(r->n_prefilled);
      const bool last_chunk = r->n_prefilled + n == r->prompt.size();
      b.entries.push_back({r->seq_id,
                           std::vector<int32_t>(first, first + static_cast<std::ptrdiff_t>(n)),
                           r->pos, last_chunk});
      part.n_logit_rows = last_chunk ? 1 : 0;
    }
    b.n_logit_rows += part.n_logit_rows;
    b.parts.push_back(part);
    budget -= n;
  };
  // The engines take max_running entries (sequences) a step, each with at most one logit row.
  // Every request adds one entry, except one that needs every position's logits (an eval, a
  // prompt_logprobs request: Request::every_position): one per position, so its chunk is cut to
  // the entries left, less those kept for the carried decoders.
  const size_t max_entries = static_cast<size_t>(std::max(1, max_running_));
  size_t kept_entries = 0;
  auto entries_left = [&] {
    const size_t used = b.entries.size() + kept_entries;
    return used < max_entries ? max_entries - used : 0;
  };
  auto prefill_chunk = [&](const Request* r) {
    const size_t n = std::min(budget, r->prompt.size() - r->n_prefilled);
    return r->every_position() ? std::min(n, entries_left()) : n;
  };

  // Decode first: Algorithm 2 (agent_policy.h) picks the decoders: every reactive one, and the
  // proactive ones up to the cap while a reactive request runs, shortest contexts first; aged
  // proactive ones bypass the cap. When there are more decoders than the budget, the cursor
  // rotates who waits so that no request starves.
  auto waited_ms = [&](const Request* r) {
    return now_ms - std::max(r->arrived_ms, r->last_token_ms);
  };
  auto promoted = [&](const Request* r) {
    return r->priority == Priority::proactive && waited_ms(r) > agent_.aging_ms;
  };
  const bool reactive_running = std::any_of(running_.begin(), running_.end(), [](const Request* r) {
    return r->priority == Priority::reactive && r->finish_reason.empty();
  });
  const bool proactive_lane = lane == Lane::proactive;
  // Contention gating of the proactive lane (scheduler.h): only promoted requests go while a
  // reactive request waits or runs.
  const bool gated = proactive_lane && !proactive_lane_open();
  auto in_lane = [&](const Request* r) {
    return r->proactive_lane == proactive_lane && (!gated || promoted(r));
  };
  // Carrying (scheduler.h): no reactive work, no parked step, and a proactive prefill to run:
  // the proactive decoders go in that prefill step, after its prompt rows.
  const bool carry = riding_ && agent_.carry_decoders &&
                     agent_.overlap == agent::AgentConfig::Overlap::off && !reactive_running &&
                     std::none_of(running_.begin(), running_.end(),
                                  [](const Request* r) { return r->in_parked_step; }) &&
                     std::any_of(running_.begin(), running_.end(), [](const Request* r) {
                       return r->proactive_lane && r->prefilling() && r->finish_reason.empty();
                     });
  const bool carrying = carry && proactive_lane;
  // Riding (scheduler.h): every decoder decodes in the main lane, never while its step is parked;
  // carried, the proactive lane's decoders decode in the proactive lane's step instead.
  auto decodes_here = [&](const Request* r) {
    if (!riding_) return in_lane(r);
    if (r->in_parked_step) return false;
    if (carry && r->proactive_lane) return proactive_lane;
    return !proactive_lane;
  };
  auto is_rider = [&](const Request* r) {
    return riding_ && r->proactive_lane && (!promoted(r) || carrying);
  };
  std::vector<agent::Job> candidates;
  for (size_t i = 0; i < running_.size(); ++i) {
    const Request* r = running_[i];
    if (decodes_here(r) && r->decoding())
      candidates.push_back(
          {i, r->priority == Priority::reactive ? agent::Flow::reactive : agent::Flow::proactive,
           std::max(r->arrived_ms, r->last_token_ms), r->pos, promoted(r)});
  }
  std::vector<Request*> decoders, riders;
  auto pick = [&](Request* r) { (is_rider(r) ? riders : decoders).push_back(r); };
  if (reactive_running && !proactive_lane) {
    for (const agent::Job& j :
         agent::reactive_first_batch(candidates, {}, {}, agent_.decode_cap, true).batch)
      pick(running_[j.id]);
  } else {
    for (const agent::Job& j : candidates) pick(running_[j.id]);  // admission order
  }
  if (!riders.empty()) {
    // The main engine takes max_step_seqs sequences a step; each request of the main lane may
    const int main_lane = static_cast<int>(std::count_if(
        running_.begin(), running_.end(), [](const Request* r) { return !r->proactive_lane; }));
    // bring one. Without room for all, a cursor rotates who waits (as for the decoders).
    const size_t room = static_cast<size_t>(std::max(0, max_step_seqs_ - main_lane));
    if (riders.size() > room) {
      std::rotate(riders.begin(),
                  riders.begin() + static_cast<std::ptrdiff_t>(rider_cursor_ % riders.size()),
                  riders.end());
      riders.resize(room);
      rider_cursor_ += room;
    }
  }
  // Prefill: reactive (FIFO) and promoted proactive requests in arrival order, then the rest.
  std::vector<Request*> urgent_prefill;
  for (Request* r : running_)
    if (in_lane(r) && r->prefilling() && r->finish_reason.empty() &&
        (r->priority == Priority::reactive || promoted(r)))
      urgent_prefill.push_back(r);
  std::stable_sort(
      urgent_prefill.begin(), urgent_prefill.end(),
      [](const Request* a, const Request* x) { return a->arrived_ms < x->arrived_ms; });
  if (reactive_running && !proactive_lane && !std::isinf(agent_.rider_slack)) {
    // Slack-aware piggybacking (scheduler.h): the step's reactive part is its urgent decoders and
    // urgent prefill (what it carries without proactive decoders); those decoders come after the
    // urgent ones in `decoders` (reactive_first_batch's order), the riders are their own list.
    auto piggy = [&](const Request* r) {
      return r->priority == Priority::proactive && !promoted(r);
    };
    const size_t urgent_decoders = static_cast<size_t>(std::count_if(
        decoders.begin(), decoders.end(), [&](const Request* r) { return !piggy(r); }));
    size_t reactive_tokens = urgent_decoders;
    for (const Request* r : urgent_prefill) reactive_tokens += r->prompt.size() - r->n_prefilled;
    reactive_tokens = std::min(reactive_tokens, budget);
    const size_t piggy_decoders = decoders.size() - urgent_decoders;
    const size_t candidates = std::min(piggy_decoders + riders.size(), budget - reactive_tokens);
    const size_t allowed =
        static_cast<size_t>(agent::slack_riders(step_times_, static_cast<int>(reactive_tokens),
                                                static_cast<int>(candidates), agent_.rider_slack));
    slack_refused_ += candidates - allowed;
    const size_t keep_decoders = std::min(piggy_decoders, allowed);
    decoders.resize(urgent_decoders + keep_decoders);
    riders.resize(std::min(riders.size(), allowed - keep_decoders));
  }
  if (!decoders.empty()) {
    const size_t n = decoders.size();
    const size_t take = std::min(n, budget);
    const size_t start = n > take ? decode_cursor_ % n : 0;
    for (size_t i = 0; i < take; ++i) add(decoders[(start + i) % n], 1, true);
    if (n > take) decode_cursor_ += take;
  }
  // Carried decoders keep their rows: the prefill gets what they leave of the budget (as FCFS's
  // steps give decode its tokens first), and they go after the prompt rows.
  const size_t carried =
      carrying ? std::min({riders.size(), budget - 1, std::max<size_t>(entries_left(), 1) - 1}) : 0;
  budget -= carried;
  kept_entries = carried;
  for (Request* r : urgent_prefill) {
    if (budget == 0 || entries_left() == 0) break;
    add(r, prefill_chunk(r), false);
  }
  if (!carrying)
    for (Request* r : riders) {
      if (budget == 0 || entries_left() == 0) break;
      add(r, 1, true);
    }
  for (Request* r : running_) {
    if (budget == 0 || entries_left() == 0) break;
    if (!in_lane(r) || r->priority != Priority::proactive || promoted(r) || !r->prefilling() ||
        !r->finish_reason.empty())
      continue;
    add(r, prefill_chunk(r), false);
  }
  budget += carried;
  kept_entries = 0;
  for (size_t i = 0; i < carried; ++i) add(riders[i], 1, true);
  return b;
}

}  // namespace duet::frontend
