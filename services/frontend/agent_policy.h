#pragma once
// Agent.xpu scheduling rules (seeds/agent-xpu.txt §4.3-4.5), as pure functions over plain data so
// that each rule is testable alone and the serving loop, the trace bench and the sd8gen3 model
// all use the same code. Times are milliseconds on the caller's clock.
//
//   AgentQueues           dual queues per class (prefill, decode); reactive FIFO; aging
//   should_preempt        a waiting reactive prefill stops a running proactive (not aged) prefill
//   elastic_binding       Algorithm 1: chunked prefill split between NPU and GPU per step
//   gpu_next              prefill-first arbitration of the GPU
//   may_overlap           contention gating of memory-bound work of different classes
//   reactive_first_batch  Algorithm 2: decode batch with the proactive cap and its eviction rule
//   StepTimeModel, slack_riders  slack-aware piggybacking (§4.5): riders only while the step's
//                         predicted time stays within (1 + slack) of the reactive-only step
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "core/program/plan.h"

namespace duet::frontend::agent {

enum class Flow : uint8_t { reactive = 0, proactive = 1 };

struct AgentConfig {
  int decode_cap = 3;       // B_cap: batch size up to which proactive work piggybacks on reactive
  double aging_ms = 30000;  // a proactive job waiting longer than this is promoted
  int chunk_tokens = 32;    // S_chk: the NPU's standard prefill chunk (a compiled graph size)
  // Slack-aware piggybacking (§4.5 ②: "batching rules that bound the additional latency seen by
  // reactive tasks"): a proactive decoder rides in a step with reactive work only while the
  // step's predicted time stays within (1 + rider_slack) of the same step without riders (and
  // under decode_cap). Infinity: the cap alone (the paper's B_cap rule as written). The serving
  // loop's default is set from measurement (services/frontend/main.cpp, DUET_AGENT_RIDER_SLACK).
  double rider_slack = std::numeric_limits<double>::infinity();
  // With no reactive work, proactive decoders decode in the proactive prefill step (scheduler.h:
  // carrying) rather than in decode steps of their own between prefill steps. Off by default:
  // measured slower on this backend (bench/agent/RESULTS.md, 2026-11-22 16:10 section).
  bool carry_decoders = false;
  // Proactive steps run preemptibly (a reactive arrival stops them within a few ops).
  // false: they run as plain steps (a reactive arrival waits for the step to end). A preemptible
  // step keeps a few ops in flight ahead of its check (gpu_runner_step.cpp) and now costs about
  // what a plain one does; bench/agent/RESULTS.md measures the trade (17:34 section).
  bool preempt_proactive = true;
  // Overlap (§4.5 ①, compute slack: "proactive prefill can overlap with the decode pipeline
  // whenever no reactive prefill is pending"): the proactive engine's prefill step runs on a
  // worker while the main engine steps. off: the two take turns, one step at a time. proactive:
  // beside main steps that carry proactive work only (a main step with reactive work parks it
  // first; the lane stays gated while reactive work runs). all: beside any main step while no
  // reactive prefill is pending, reactive decode included (a reactive prefill parks it). Needs
  // riding (the engines share one KV pool); the steps overlap on the host only where they use
  // different devices (each device service runs one step at a time).
  enum class Overlap : uint8_t { off, proactive, all };
  Overlap overlap = Overlap::off;
};

// A request as the policies see it.
struct Job {
  uint64_t id = 0;
  Flow flow = Flow::reactive;
  double enqueued_ms = 0;  // when it (re)entered its current queue: aging counts from here
  int seq_len = 0;         // tokens in its context now (decode cost grows with it)
  bool promoted = false;   // aged: treated as reactive from now on (set by the queues)
};

// Aged: a proactive job that has waited past the threshold. Promotion is sticky.
bool aged(const Job& j, double now_ms, const AgentConfig& cfg);
// Treated as reactive: reactive, or promoted.
inline bool urgent(const Job& j) {
  return j.flow == Flow::reactive || j.promoted;
}

// Dual queues per class for the prefill and the decode stage.
class AgentQueues {
 public:
  explicit AgentQueues(AgentConfig cfg = {}) : cfg_(cfg) {}
  void push_prefill(Job j);
  void push_decode(Job j);
  // Promotes proactive jobs of both stages that waited past the threshold (oldest first, they
  // keep their arrival order among the promoted). Returns how many were promoted now.
  int age(double now_ms);
  // The next prefill: reactive FIFO, a promoted proactive job taking its place among them by its
  // enqueue time; then proactive FIFO.
  std::optional<Job> pop_prefill(double now_ms);
  // The next prefill of one class: reactive FIFO; proactive promoted first, then FIFO.
  std::optional<Job> pop_prefill(Flow flow, double now_ms);
  bool reactive_prefill_waiting() const { return !reactive_prefill_.empty(); }
  bool promoted_prefill_waiting() const;  // as of the last age()
  // Everything waiting for a decode slot, for reactive_first_batch (drains the decode queues).
  std::vector<Job> pop_decode_all(Flow flow);
  size_t prefill_size(Flow f) const {
    return (f == Flow::reactive ? reactive_prefill_ : proactive_prefill_).size();
  }
  size_t decode_size(Flow f) const {
    return (f == Flow::reactive ? reactive_decode_ : proactive_decode_).size();
  }
  const AgentConfig& config() const { return cfg_; }

 private:
  AgentConfig cfg_;
  std::deque<Job> reactive_prefill_, proactive_prefill_, reactive_decode_, proactive_decode_;
};

// Prefill preemption: a reactive prefill waiting preempts the running prefill only when that one
// is proactive and not promoted. Reactive never preempts reactive (nor a promoted job).
bool should_preempt(const Job& running, bool reactive_waiting);

// Algorithm 1, per prefill step of n_tokens. op_us(tokens, device) predicts a token-wise op of
// that many tokens on a device. Decode idle: the number of standard chunks on the NPU balances
// the NPU's time against the GPU's (its chunks plus the ragged remainder). Decode busy: every
// standard chunk on the NPU, the remainder on the GPU, deferred so that it ends with the NPU.
struct ElasticBinding {
  int n_chunks = 0;               // N_chk: standard chunks in the step
  int npu_chunks = 0;             // n_npu
  int npu_tokens = 0;             // token rows [0, npu_tokens) on the NPU
  int gpu_tokens = 0;             // the rest on the GPU
  double defer_us = 0;            // how long the GPU part waits (decode busy)
  double npu_us = 0, gpu_us = 0;  // predicted per op
};
using OpCost = std::function<double(int tokens, Device device)>;
ElasticBinding elastic_binding(int n_tokens, bool decode_busy, int chunk_tokens,
                               const OpCost& op_us);
// The binding as a plan: activation_split of every matmul with npu_tokens on the NPU (gpu_only
// when no chunk fits, npu_only when the NPU takes every token).
Plan elastic_plan(const ElasticBinding& b);

// Prefill-first arbitration of the GPU: a prefill's GPU kernels go before decode's, whatever
// their class (prefill bursts are short; decode fills the gaps).
enum class Stage : uint8_t { none, prefill, decode };
Stage gpu_next(bool prefill_ready, bool decode_ready);

// Contention gating: memory-bound work of different classes must not overlap (the
// lower-priority side is deferred); same-class or compute-bound work may.
struct Work {
  Flow flow = Flow::reactive;
  bool memory_bound = false;
};
bool may_overlap(const Work& running, const Work& candidate);

// Algorithm 2. Reactive jobs (and promoted ones) are all admitted. Proactive ones fill the
// batch while it is smaller than cap, or without limit when no reactive job is present.
// Eviction rule: the proactive jobs with the LONGEST contexts are evicted first (they inflate the
// batch's per-token time the most: attention reads their whole KV), ties broken by admitting the
// longer-waiting one. (The paper's text says this; its pseudo-code sorts descending and so would
// admit the longest, which contradicts the stated goal.)
struct DecodeBatch {
  std::vector<Job> batch;    // reactive (and promoted) first, then the piggybacked proactive
  std::vector<Job> evicted;  // back to the proactive decode queue
};
// reactive_elsewhere: a reactive request is present though not decoding (prefilling): the cap
// holds.
DecodeBatch reactive_first_batch(const std::vector<Job>& current,
                                 const std::vector<Job>& new_reactive,
                                 const std::vector<Job>& new_proactive, int cap,
                                 bool reactive_elsewhere = false);

// Step times as an engine measured them, per token count (the engine runs one compiled program
// per token bucket, and on a memory-bound device a few more decode rows cost next to nothing
// while on a compute-bound one each costs its share: which one this is, only measurement says).
// An exponentially weighted mean per count, so the model follows the machine's load; no
// constant of any device is built in.
class StepTimeModel {
 public:
  // weight: how much the newest sample counts (0 < weight <= 1).
  explicit StepTimeModel(double weight = 0.2);
  // One step of `tokens` tokens took `us` microseconds. Throws invalid_argument on tokens < 1
  // or a negative / non-finite time.
  void observe(int tokens, double us);
  // The mean time of a step of that many tokens; nullopt before one was measured.
  std::optional<double> predict(int tokens) const;
  uint64_t samples(int tokens) const;
  int max_tokens_seen() const { return static_cast<int>(mean_us_.size()); }

 private:
  double weight_;
  std::vector<double> mean_us_;  // index tokens - 1
  std::vector<uint64_t> n_;
};

// How many of `candidates` proactive decoders (one token each) may join a step whose reactive
// part is `reactive_tokens` tokens: the largest k <= candidates with
// predict(reactive_tokens + k) <= (1 + slack) * predict(reactive_tokens). The base step's time
// unknown: none (the reactive-only step is then measured; the conservative side). The time of
// reactive_tokens + k unknown while the base and every smaller count fit: k is admitted and so
// measured (each count is tried, then its measurement decides; the proactive-only steps measure
// the small counts anyway). No reactive work (reactive_tokens <= 0): every candidate, nothing to
// bound. Throws invalid_argument on a negative slack or candidates < 0.
int slack_riders(const StepTimeModel& model, int reactive_tokens, int candidates, double slack);

}  // namespace duet::frontend::agent
