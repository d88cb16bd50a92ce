#pragma once
// The frontend's view of "something that computes tokens": the scheduler batches requests into
// steps and an Engine runs each step. Engines:
//   ReferenceEngine  core/model/forward.h per sequence, in process (the oracle; --plan reference)
//   ProgramEngine    the plan's programs on gpu_svc and npu_svc over shm (the product), or the
//                    same programs on in-process runners (the stack-overhead benchmark)
// An engine owns the KV cache of every open sequence. A sequence's KV stays put from open_seq to
// close_seq: steps append to it in place (zero KV bytes copied), so a preempted or interrupted
// request resumes where it stopped.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/model.h"

namespace duet::frontend {

struct KvShare;  // kv_share.h

// One sequence's part of a step: `tokens` are appended at positions pos0, pos0+1, ...
struct SeqStep {
  uint64_t seq_id = 0;
  std::vector<int32_t> tokens;
  int32_t pos0 = 0;
  bool want_logits = true;  // logits of the last token of this entry
  // A decode entry: the request's sampled token (the scheduler sets it). A step whose entries
  // are all decode entries is a decode step, any other a prefill step; an engine with a
  // placement per phase runs each step's phase's (ProgramEngineOptions::decode_layer_plans_for).
  bool decode = false;
};

// What one step did, for `duet trace` (issue 23): filled by engines that run programs on the
// device services, from the clock reads their phase accounting (status "phase_ms") already makes.
// Times are steady-clock ns. Whatever is costly (op names, the modelled timeline, the devices'
// op spans) is looked up only when a trace is asked for (Engine::trace_step).
struct StepDetail {
  uint64_t engine = 0;  // which engine object ran it (0: none that traces)
  uint64_t seq = 0;     // the step seq the devices saw (their rings key on it)
  uint32_t gpu_program = 0, npu_program = 0;
  bool on_gpu = false, on_npu = false;
  uint32_t bucket_tokens = 0;  // the programs' max tokens
  bool decode = false;         // it ran the decode placement (SeqStep::decode)
  uint32_t n_tokens = 0, n_seqs = 0, logits_rows = 0;
  int64_t context = 0;  // the longest sequence's positions before the step
  int64_t begin_ns = 0, prepared_ns = 0, rung_ns = 0, flags_ns = 0, reports_ns = 0, end_ns = 0;
  bool preempted = false;
};

struct StepStats {
  double measured_us = 0;  // wall time of the step here
  // The step on the SoC profile: the modelled timeline (core/planner/timeline.h) of the plan the
  // stack models for the SoC (0 when the engine has no model)
  double modeled_us = 0;
  double flag_wait_us = 0;  // time spent waiting on completion flags
  uint64_t kv_bytes_copied = 0;
  uint32_t n_tokens = 0;
  StepDetail detail;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual const LlamaModel& model() const = 0;
  // The plan it runs ("reference", "gpu-only", "tensor", ...).
  virtual std::string plan_name() const = 0;
  // What it executes on this host and what it models on the SoC (issue 23 item 5: `auto` runs
  // the plan fastest here and models the solver's plan for the SoC), named for stats and status.
  virtual std::string executed_plan() const { return plan_name(); }
  virtual std::string modeled_plan() const { return plan_name(); }
  // For `duet trace`: the step's ops by device (names), the modelled SoC timeline of the same
  // step, and where the devices' rings are; {} when the engine does not trace or no longer has
  // the programs the step ran (rebuilt since).
  virtual nlohmann::json trace_step(const StepDetail& /*step*/) const { return {}; }
  // Reserves KV for a sequence of up to max_positions; Error(busy) when the KV cache is full.
  virtual void open_seq(uint64_t seq_id, int max_positions) = 0;
  // Frees the sequence's KV at once; unknown ids are ignored.
  virtual void close_seq(uint64_t seq_id) = 0;
  // Guarantees an open sequence KV for `positions` positions (what it holds counts), so that a
  // running request never fails for lack of KV (issue 20): Error(busy) when the pool cannot
  // promise it now (pages in use or promised to others: wait), Error(out_of_range) when it never
  // could (more than the whole pool). Engines whose open_seq already reserves do nothing.
  virtual void reserve_seq(uint64_t /*seq_id*/, int /*positions*/) {}
  // A restarted frontend (issue 22) re-opens a sequence a killed one left in the shared KV pool:
  // its pages (KvPages owner seq_id) already hold positions 0..n_past-1, so nothing is
  // recomputed. Error(bad_format) when the pool does not hold those positions for it;
  // Error(unsupported) from engines whose KV does not outlive their process.
  virtual void adopt_seq(uint64_t seq_id, int /*max_positions*/, int /*n_past*/) {
    throw Error(Errc::unsupported, "sequence " + std::to_string(seq_id) +
                                       ": this engine's KV does not outlive its frontend");
  }
  // After adoption: frees every page of the pool whose owner is not an open sequence (what the
  // killed frontend held for requests that were not adopted). Returns the pages freed.
  virtual uint32_t reclaim_unadopted() { return 0; }
  // Forgets positions >= n_past of a sequence (a chat turn that rewinds, a stop string).
  virtual void truncate_seq(uint64_t seq_id, int n_past) = 0;
  // Prefix sharing (issue 20 item 4): a sequence just opened, with nothing in it, takes the KV of
  // the longest run of whole blocks its prompt starts with that some sequence already computed
  // (read-only, not recomputed); returns how many positions it now holds: a multiple of the page
  // size, always less than prompt.size(), 0 when nothing matched or the engine does not share.
  // The caller's first step then starts at that position. Call before reserve_seq.
  virtual int share_prefix(uint64_t /*seq_id*/, std::span<const int32_t> /*prompt*/) { return 0; }
  // One step over several sequences (continuous batching). Returns, for each entry with
  // want_logits, n_vocab logits of its last token, entries in order.
  virtual std::vector<float> step(const std::vector<SeqStep>& batch, StepStats* stats) = 0;
  // The most tokens one step may carry (prefill longer than this is chunked by the caller).
  virtual int max_step_tokens() const = 0;
  virtual nlohmann::json status() const = 0;
  // The KV pool this engine's sequences live in when it shares one with other engines
  // (kv_share.h): engines with the same non-null share can step each other's sequences.
  virtual const KvShare* kv_share() const { return nullptr; }

  // Preemptible steps (Agent.xpu, issue 9; the contract is ProgramEngine's). An engine that can
  // stop a step at an op boundary says preemptible(); the serving loop then runs proactive work
  // on it: request_preempt() (any thread) makes step_preemptible() return nullopt with the step
  // parked, resume() continues it where it stopped. Engines that cannot simply run the step.
  virtual bool preemptible() const { return false; }
  virtual std::optional<std::vector<float>> step_preemptible(const std::vector<SeqStep>& batch,
                                                             StepStats* stats) {
    return step(batch, stats);
  }
  virtual std::optional<std::vector<float>> resume(StepStats*) {
    throw Error(Errc::invalid_argument, "resume: this engine never parks a step");
  }
  virtual bool parked() const { return false; }
  virtual void request_preempt() {}
};

}  // namespace duet::frontend
