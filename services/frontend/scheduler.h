#pragma once
// Continuous batching: which requests wait, which run, and what one engine step carries.
// Two queues, reactive before proactive (issue 9 grows preemption and aging from here). Each step
// carries one decode token of every decoding request, then prefill chunks (reactive first, in
// arrival order) up to the engine's token budget, so long prompts never stall decoding.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "services/frontend/agent_policy.h"
#include "services/frontend/engine.h"
#include "services/frontend/request.h"

namespace duet::frontend {

// What one step gives a request: `n_tokens` appended, and where its logit rows are in the step's
// output (first_logit_row .. + n_logit_rows).
struct StepPart {
  Request* request = nullptr;
  size_t n_tokens = 0;
  bool decode = false;
  size_t first_logit_row = 0;
  size_t n_logit_rows = 0;
};

struct StepBatch {
  std::vector<SeqStep> entries;
  std::vector<StepPart> parts;
  size_t n_logit_rows = 0;
  bool empty() const { return entries.empty(); }
};

// Which engine a batch is for: the stack's main engine, or the proactive engine (Agent.xpu: its
// steps are preemptible) that holds the KV of Request::proactive_lane requests.
enum class Lane : uint8_t { main, proactive };

class Scheduler {
 public:
  Scheduler(int max_running, int max_queue) : max_running_(max_running), max_queue_(max_queue) {}

  // Queues a request; Error(busy) when the queue is full.
  void enqueue(Request* r);
  // Moves queued requests into the running set while there is room; `open` reserves the
  // request's KV and throws Error(busy) when the engine has none left (the request stays first
  // in its queue). Returns the requests admitted.
  template <class Open>
  std::vector<Request*> admit(Open&& open);
  // A request a restarted frontend adopted with its sequence open (issue 22): running at once.
  void add_running(Request* r) { running_.push_back(r); }
  // Drops a request from wherever it is (queue or running).
  void remove(Request* r);
  // now_ms: the steady clock of Request::arrived_ms (aging); < 0: read it here. Only the
  // running requests of `lane` take part.
  StepBatch build(int max_step_tokens, double now_ms = -1, Lane lane = Lane::main);
  // A reactive request is running (admitted, unfinished): the proactive lane is gated (build).
  bool reactive_present() const;
  // A reactive request is admitted and not fully prefilled.
  bool reactive_prefill_present() const;
  // Whether the proactive lane may step now (contention gating): no reactive request runs, or
  // (AgentConfig::overlap all) none of them is prefilling.
  bool proactive_lane_open() const;
  // Agent.xpu rules (agent_policy.h): while any reactive request runs, proactive decoders ride
  // along only up to decode_cap (the longest contexts wait first); a proactive request waiting
  // past aging_ms (for its first or next token) is promoted: it bypasses the cap and its
  // prefill goes with the reactive ones, in arrival order.
  // Without riding, the proactive lane's KV is on the other engine, so a proactive step is a step
  // of its own between reactive ones. Contention gating (may_overlap: memory-bound decode of
  // different classes does not overlap; a proactive prefill would be preempted at once) holds the
  // whole lane while reactive work is present, promoted requests excepted (AgentConfig::overlap
  // all: only while a reactive prompt is being prefilled; proactive_lane_open()).
  // Riding (set_riding: the two engines share one KV pool, kv_share.h): the proactive lane's
  // decoders decode in the MAIN lane's steps, picked by Algorithm 2 like any proactive decoder
  // (all of them when no reactive request runs, else up to the cap), and the proactive lane
  // runs prefill only (its preemptible steps): a decoder is never parked with a preempted
  // prefill, so it can ride in the reactive steps that follow. Riders go after the reactive (and
  // promoted) prefill, so they never push a reactive prompt's chunk into another step. At most
  // max_step_seqs sequences a step.
  // Carrying (AgentConfig::carry_decoders, with riding): while no reactive request runs and a
  // proactive prefill is due (no step parked), the proactive decoders decode in the proactive
  // lane's prefill step, after its prompt rows, the prefill taking what they leave of the
  // budget: one step of both as FCFS's steps are, instead of a decode step and a prefill step
  // in turn (each with its own fixed cost and padding). A reactive arrival preempts that step
  // like any proactive step; its decoders are then parked with it (at a small rider slack they
  // would mostly not ride in the reactive steps anyway) and finish when it resumes. Off by
  // default: measured no faster here (bench/agent/RESULTS.md).
  void set_agent_config(const agent::AgentConfig& c) { agent_ = c; }
  const agent::AgentConfig& agent_config() const { return agent_; }
  // Which lane (engine) a request will run on. Each lane's engine holds max_running sequences,
  // so admission counts the running requests per lane: proactive requests filling the proactive
  // engine never keep a reactive one from a slot on the main engine. Unset: one lane.
  void set_lane_of(std::function<Lane(const Request&)> lane_of) { lane_of_ = std::move(lane_of); }
  Lane lane_of(const Request& r) const { return lane_of_ ? lane_of_(r) : Lane::main; }
  // Slack-aware piggybacking (agent_policy.h, slack_riders): with agent_config().rider_slack
  // finite, the proactive decoders a step with reactive work would carry (riders, or proactive
  // decoders of the main lane) are cut to those that keep the step's predicted time within
  // (1 + slack) of the step without them, predicted from the main engine's measured steps: the
  // caller reports each main-lane step here.
  void observe_main_step(int tokens, double measured_us) {
    if (tokens > 0) step_times_.observe(tokens, measured_us);
  }
  const agent::StepTimeModel& step_times() const { return step_times_; }
  // Proactive decoders the slack rule kept out of a step with reactive work (the cap and the
  // step's budget aside), summed over steps.
  uint64_t slack_refused() const { return slack_refused_; }
  void set_riding(bool on, int max_step_seqs) {
    riding_ = on;
    max_step_seqs_ = max_step_seqs;
  }
  bool riding() const { return riding_; }
  // A queued request (the first of either class) has a free slot in its lane.
  bool can_admit() const;

  size_t queued(Priority p) const { return queue(p).size(); }
  size_t queued() const { return reactive_.size() + proactive_.size(); }
  size_t running() const { return running_.size(); }
  const std::vector<Request*>& running_requests() const { return running_; }
  int max_running() const { return max_running_; }
  int max_queue() const { return max_queue_; }

 private:
  int running_in(Lane lane) const {
    return static_cast<int>(std::count_if(running_.begin(), running_.end(),
                                          [&](const Request* x) { return lane_of(*x) == lane; }));
  }
  std::deque<Request*>& queue(Priority p) {
    return p == Priority::reactive ? reactive_ : proactive_;
  }
  const std::deque<Request*>& queue(Priority p) const {
    return p == Priority::reactive ? reactive_ : proactive_;
  }

  int max_running_;
  int max_queue_;
  std::deque<Request*> reactive_, proactive_;
  std::vector<Request*> running_;  // in admission order
  size_t decode_cursor_ = 0;       // rotates which decoders go first when the budget is short
  agent::AgentConfig agent_;
  std::function<Lane(const Request&)> lane_of_;
  bool riding_ = false;
  size_t rider_cursor_ = 0;
  int max_step_seqs_ = 0;
  agent::StepTimeModel step_times_;
  uint64_t slack_refused_ = 0;
};

template <class Open>
std::vector<Request*> Scheduler::admit(Open&& open) {
  std::vector<Request*> admitted;
  for (Priority p : {Priority::reactive, Priority::proactive}) {
    auto& q = queue(p);
    while (!q.empty() && running_in(lane_of(*q.front())) < max_running_) {
      Request* r = q.front();
      open(r);  // may throw busy: r stays queued
      q.pop_front();
      running_.push_back(r);
      admitted.push_back(r);
    }
  }
  return admitted;
}

}  // namespace duet::frontend
