// Trace driver for reactive and proactive flows (issue 9): Poisson arrivals of both classes,
// served by (a) FCFS with continuous batching and chunked prefill, no priorities, one engine, and
// (b) the Agent.xpu policy (services/frontend/agent_policy.h): reactive prefill first and FIFO,
// proactive prefill preempted at op boundaries on its own engine and resumed without recompute,
// reactive-first decode batching with the proactive cap, aging. Prints JSON.
//
// Time: a virtual clock advances by each step's time (measured wall time, or modelled) and jumps
// over idle gaps; arrival rates are per trace minute, and --compress squeezes the trace so that a
// tiny model sees a load like a real one's (1 trace minute = 60 / compress seconds).
// The backends are in agent_backends.cpp and stack_driver.cpp, the report in agent_report.cpp.
#include <unistd.h>
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/agent/agent_backends.h"
#include "bench/agent/agent_report.h"
#include "bench/agent/agent_trace.h"
#include "bench/agent/stack_driver.h"
#include "core/base/error.h"

namespace duet::bench {
namespace {

using frontend::agent::AgentConfig;
using frontend::agent::AgentQueues;
using frontend::agent::Job;

constexpr size_t kNone = ~size_t{0};

struct Run {
  std::vector<Req> reqs;
  Backend& backend;
  double now = 0;
  size_t next_arrival = 0, finished = 0;
  std::vector<double> preempt_latency_us;
  uint64_t preemptions = 0, steps = 0;

  void finish_if_done(Req& r, Flow engine) {
    if (r.generated < r.out_len) return;
    r.done_us = now;
    backend.close(engine, r.id);
    ++finished;
  }
  void apply_prefill(Req& r, size_t chunk, int32_t token, Flow engine) {
    r.prefilled += chunk;
    r.pos += static_cast<int32_t>(chunk);
    if (r.prefilled < r.prompt.size()) return;
    r.generated = 1;
    r.first_token_us = now;
    r.last_token = token;
    r.waiting_since_us = now;
    finish_if_done(r, engine);
  }
  void apply_decode(Req& r, int32_t token, Flow engine) {
    ++r.pos;
    ++r.generated;
    r.last_token = token;
    r.waiting_since_us = now;
    finish_if_done(r, engine);
  }
  SeqWork decode_work(const Req& r) const { return {r.id, {r.last_token}, r.pos}; }
  SeqWork prefill_work(const Req& r, size_t chunk) const {
    return {r.id,
            std::vector<int32_t>(r.prompt.begin() + static_cast<long>(r.prefilled),
                                 r.prompt.begin() + static_cast<long>(r.prefilled + chunk)),
            r.pos};
  }
  double next_reactive_after_now() const {
    for (size_t i = next_arrival; i < reqs.size(); ++i)
      if (reqs[i].flow == Flow::reactive) return reqs[i].arrival_us - now;
    return kNever;
  }
  void record(const StepOutcome& o) {
    now += o.us;
    ++steps;
    if (o.preempted) {
      ++preemptions;
      preempt_latency_us.push_back(o.preempt_latency_us);
    }
  }
};

// FCFS: every step carries one token of every decoding request and fills the rest of the step
// with the prompt chunk of the earliest request still prefilling (continuous batching).
void run_fcfs(Run& run) {
  std::vector<size_t> active;
  while (run.finished < run.reqs.size()) {
    while (run.next_arrival < run.reqs.size() && run.reqs[run.next_arrival].arrival_us <= run.now) {
      Req& r = run.reqs[run.next_arrival];
      run.backend.open(Flow::reactive, r.id, static_cast<int>(r.prompt.size()) + r.out_len);
      active.push_back(run.next_arrival++);
    }
    std::erase_if(active, [&](size_t i) { return run.reqs[i].done_us > 0; });
    if (active.empty()) {
      run.now = run.reqs[run.next_arrival].arrival_us;
      continue;
    }
    std::vector<SeqWork> batch;
    std::vector<size_t> decoders;
    size_t prefiller = kNone;
    for (size_t i : active) {
      const Req& r = run.reqs[i];
      if (r.prefilled == r.prompt.size()) {
        if (static_cast<int>(decoders.size()) + 1 >= run.backend.max_seqs()) continue;  // next step
        decoders.push_back(i);
        batch.push_back(run.decode_work(r));
      } else if (prefiller == kNone) {
        prefiller = i;
      }
    }
    size_t chunk = 0;
    const int room = run.backend.max_step_tokens() - static_cast<int>(batch.size());
    if (prefiller != kNone && room > 0) {
      const Req& r = run.reqs[prefiller];
      chunk = std::min(r.prompt.size() - r.prefilled, static_cast<size_t>(room));
      batch.push_back(run.prefill_work(r, chunk));
    }
    const StepOutcome o = run.backend.step(Flow::reactive, batch, !decoders.empty(), kNever);
    run.record(o);
    for (size_t k = 0; k < decoders.size(); ++k)
      run.apply_decode(run.reqs[decoders[k]], o.next_tokens[k], Flow::reactive);
    if (chunk) run.apply_prefill(run.reqs[prefiller], chunk, o.next_tokens.back(), Flow::reactive);
  }
}

Job job_of(const Req& r) {
  return Job{r.id, r.flow, r.waiting_since_us / 1000.0, r.pos, r.promoted};
}

// Agent.xpu: one step per iteration, chosen by the rules of agent_policy.h.
void run_agent(Run& run, const AgentConfig& cfg) {
  AgentQueues q(cfg);
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < run.reqs.size(); ++i) index[run.reqs[i].id] = i;
  size_t re_active = kNone, pro_active = kNone;
  size_t pro_chunk = 0;
  std::vector<size_t> re_dec, pro_dec;
  auto max_chunk = [&](const Req& r) {
    return std::min(r.prompt.size() - r.prefilled,
                    static_cast<size_t>(run.backend.max_step_tokens()));
  };
  auto to_decode = [&](size_t i) {
    if (run.reqs[i].done_us > 0) return;
    (run.reqs[i].flow == Flow::reactive ? re_dec : pro_dec).push_back(i);
  };
  // A proactive prefill step carries the proactive decoders along when `carry` (as FCFS's steps
  // do); they ride in it until it completes, parked with it when it is preempted.
  std::vector<size_t> riders;
  auto run_proactive_prefill = [&](double preempt_after, bool carry) {
    Req& r = run.reqs[pro_active];
    StepOutcome o;
    if (run.backend.parked()) {
      o = run.backend.resume(preempt_after);
    } else {
      const size_t max_step = static_cast<size_t>(run.backend.max_step_tokens());
      if (carry) riders.swap(pro_dec);
      while (riders.size() >= std::min(max_step, static_cast<size_t>(run.backend.max_seqs()))) {
        pro_dec.push_back(riders.back());
        riders.pop_back();
      }
      pro_chunk = std::min(r.prompt.size() - r.prefilled, max_step - riders.size());
      std::vector<SeqWork> batch;
      for (size_t i : riders) batch.push_back(run.decode_work(run.reqs[i]));
      batch.push_back(run.prefill_work(r, pro_chunk));
      o = run.backend.step(Flow::proactive, batch, !riders.empty() || !re_dec.empty(),
                           preempt_after);
    }
    run.record(o);
    if (o.preempted) return;
    for (size_t k = 0; k < riders.size(); ++k) {
      run.apply_decode(run.reqs[riders[k]], o.next_tokens[k], Flow::proactive);
      to_decode(riders[k]);
    }
    riders.clear();
    run.apply_prefill(r, pro_chunk, o.next_tokens.back(), Flow::proactive);
    if (r.prefilled == r.prompt.size()) {
      to_decode(pro_active);
      pro_active = kNone;
    }
  };
  auto decode_step = [&](Flow engine, std::vector<size_t> who) {
    // More decoders than a step takes: the longest-waiting go first.
    if (who.size() > static_cast<size_t>(run.backend.max_seqs())) {
      std::stable_sort(who.begin(), who.end(), [&](size_t a, size_t b) {
        return run.reqs[a].waiting_since_us < run.reqs[b].waiting_since_us;
      });
      who.resize(static_cast<size_t>(run.backend.max_seqs()));
    }
    std::vector<SeqWork> batch;
    for (size_t i : who) batch.push_back(run.decode_work(run.reqs[i]));
    const StepOutcome o = run.backend.step(engine, batch, true, kNever);
    run.record(o);
    for (size_t k = 0; k < who.size(); ++k)
      run.apply_decode(run.reqs[who[k]], o.next_tokens[k], run.reqs[who[k]].flow);
  };
  while (run.finished < run.reqs.size()) {
    while (run.next_arrival < run.reqs.size() && run.reqs[run.next_arrival].arrival_us <= run.now) {
      Req& r = run.reqs[run.next_arrival++];
      r.waiting_since_us = r.arrival_us;
      q.push_prefill(job_of(r));
    }
    std::erase_if(re_dec, [&](size_t i) { return run.reqs[i].done_us > 0; });
    std::erase_if(pro_dec, [&](size_t i) { return run.reqs[i].done_us > 0; });
    const double now_ms = run.now / 1000.0;
    q.age(now_ms);
    for (size_t i : pro_dec)
      if (run.now - run.reqs[i].waiting_since_us > cfg.aging_ms * 1000.0)
        run.reqs[i].promoted = true;

    // 1. Reactive prefill first, FIFO, never preempted.
    if (re_active == kNone && q.reactive_prefill_waiting()) {
      re_active = index.at(q.pop_prefill(Flow::reactive, now_ms)->id);
      Req& r = run.reqs[re_active];
      run.backend.open(Flow::reactive, r.id, static_cast<int>(r.prompt.size()) + r.out_len);
    }
    if (re_active != kNone) {
      // The step also carries every reactive decoder (continuous batching within the class, as
      // the serving loop's scheduler does): a reactive prefill must not stall reactive decode.
      Req& r = run.reqs[re_active];
      std::vector<size_t> riding;
      std::vector<SeqWork> batch;
      for (size_t i : re_dec)
        if (static_cast<int>(riding.size()) + 1 < run.backend.max_seqs() &&
            static_cast<int>(riding.size()) + 1 < run.backend.max_step_tokens()) {
          riding.push_back(i);
          batch.push_back(run.decode_work(run.reqs[i]));
        }
      const size_t chunk = std::min(
          max_chunk(r), static_cast<size_t>(run.backend.max_step_tokens()) - riding.size());
      batch.push_back(run.prefill_work(r, chunk));
      const StepOutcome o = run.backend.step(Flow::reactive, batch, !re_dec.empty(), kNever);
      run.record(o);
      for (size_t k = 0; k < riding.size(); ++k)
        run.apply_decode(run.reqs[riding[k]], o.next_tokens[k], Flow::reactive);
      std::erase_if(re_dec, [&](size_t i) { return run.reqs[i].done_us > 0; });
      run.apply_prefill(r, chunk, o.next_tokens.back(), Flow::reactive);
      if (r.prefilled == r.prompt.size()) {
        to_decode(re_active);
        re_active = kNone;
      }
      continue;
    }
    // A promoted proactive prefill is not held back by reactive decode (and not preempted).
    const bool reactive_decoding = !re_dec.empty();
    if (pro_active == kNone && (!reactive_decoding || q.promoted_prefill_waiting())) {
      if (auto j = q.pop_prefill(Flow::proactive, now_ms)) {
        pro_active = index.at(j->id);
        Req& r = run.reqs[pro_active];
        r.promoted = j->promoted;
        run.backend.open(Flow::proactive, r.id, static_cast<int>(r.prompt.size()) + r.out_len);
      }
    }
    if (reactive_decoding) {
      // 2. Algorithm 2: every reactive decoder; proactive ones piggyback up to the cap.
      std::vector<Job> current;
      for (size_t i : re_dec) current.push_back(job_of(run.reqs[i]));
      for (size_t i : pro_dec) current.push_back(job_of(run.reqs[i]));
      const frontend::agent::DecodeBatch b =
          frontend::agent::reactive_first_batch(current, {}, {}, cfg.decode_cap);
      std::vector<size_t> re_part, pro_part;
      for (const Job& j : b.batch)
        (j.flow == Flow::reactive ? re_part : pro_part).push_back(index.at(j.id));
      if (run.backend.co_batches()) {
        std::vector<size_t> all = re_part;
        all.insert(all.end(), pro_part.begin(), pro_part.end());
        decode_step(Flow::reactive, all);
      } else {
        decode_step(Flow::reactive, re_part);
        // Contention gating (may_overlap): here the proactive decoders cannot ride in the
        // reactive step (their KV is on the other engine); a step of their own is memory-bound
        // work of the other class between reactive steps, so only promoted (aged) ones go.
        std::vector<size_t> due;
        for (size_t i : pro_part)
          if (run.reqs[i].promoted) due.push_back(i);
        if (!due.empty() && !run.backend.parked()) decode_step(Flow::proactive, due);
      }
      // A promoted proactive prefill takes the GPU after the reactive iteration (the paper gives
      // it the iGPU while reactive prefill keeps the NPU); a non-promoted one waits until no
      // reactive work is left.
      if (pro_active != kNone && run.reqs[pro_active].promoted)
        run_proactive_prefill(kNever, false);
      continue;
    }
    // 3. No reactive work: proactive prefill first (preempted when a reactive request arrives),
    //    then every proactive decoder (no cap without reactive work).
    if (pro_active != kNone) {
      run_proactive_prefill(run.reqs[pro_active].promoted ? kNever : run.next_reactive_after_now(),
                            true);
      continue;
    }
    if (!pro_dec.empty()) {
      decode_step(Flow::proactive, pro_dec);
      continue;
    }
    if (run.next_arrival < run.reqs.size())
      run.now = std::max(run.now, run.reqs[run.next_arrival].arrival_us);
  }
}

nlohmann::json summarize(const Run& run, double compress) {
  return summarize(run.reqs, run.preemptions, run.preempt_latency_us, run.steps, run.now, compress);
}

// The trace through the real serving loop (stack_driver.h): the timings come back per request;
// preemptions and their latency from the frontend's status.
nlohmann::json run_stack(const std::vector<Req>& trace, bool agent, const std::string& duet,
                         const std::string& model, const std::string& stack_id, double compress,
                         double timeout_s, const AgentKnobs& knobs) {
  std::vector<TraceItem> items;
  for (const Req& r : trace)
    items.push_back({r.flow == Flow::reactive, r.arrival_us, r.prompt, r.out_len});
  const StackRun run = run_trace_on_stack(items, agent, duet, model, stack_id, timeout_s, knobs);
  std::vector<Req> done = trace;
  for (size_t i = 0; i < done.size(); ++i) {
    done[i].done_us = run.timings[i].done_us;
    done[i].first_token_us = run.timings[i].first_token_us;
  }
  const nlohmann::json& a = run.agent_status;
  const uint64_t preemptions = a.value("preemptions", uint64_t{0});
  // The frontend keeps the mean and the max; both are reported as they are.
  nlohmann::json j = summarize(done, preemptions, {}, a.value("proactive_steps", uint64_t{0}),
                               run.makespan_us, compress);
  j["preempt_latency_mean_us"] = a.value("preempt_latency_mean_us", 0.0);
  j["preempt_latency_max_us"] = a.value("preempt_latency_max_us", 0.0);
  j["steps"] = nullptr;  // the frontend counts steps per lane; see "agent_status"
  j["agent_status"] = a;
  // Where the frontend's time went while proactive work waited (stack_driver.h).
  if (!run.proactive_time_ms.is_null()) j["proactive_time_ms"] = run.proactive_time_ms;
  // Load: the fraction of the trace the engines were stepping (near 1: saturated), and the
  // tokens per second of engine time (what the stack serves while busy).
  j["busy_fraction"] = run.makespan_us > 0 ? run.busy_ms * 1000.0 / run.makespan_us : 0.0;
  j["busy_tokens_per_s"] =
      run.busy_ms > 0 ? static_cast<double>(run.busy_tokens) * 1000.0 / run.busy_ms : 0.0;
  double isolated = 0;
  for (double us : run.isolated_reactive_us) isolated += us / 1000.0;
  j["reactive_isolated_mean_ms"] =
      run.isolated_reactive_us.empty() ? 0.0 : isolated / double(run.isolated_reactive_us.size());
  double isolated_ttft = 0;
  for (double ms : run.isolated_reactive_ttft_ms) isolated_ttft += ms;
  j["reactive_isolated_ttft_mean_ms"] =
      run.isolated_reactive_ttft_ms.empty()
          ? 0.0
          : isolated_ttft / double(run.isolated_reactive_ttft_ms.size());
  return j;
}

}  // namespace
}  // namespace duet::bench

int main(int argc, char** argv) {
  using namespace duet;
  using namespace duet::bench;
  CLI::App app{"agent_bench: reactive/proactive trace, Agent.xpu policy vs FCFS"};
  TraceOptions t;
  std::string mode = "both", model = std::string(DUET_SOURCE_DIR) + "/models/fortune-q8_0.gguf";
  std::string soc_name = "sd8gen3", shape_name = "llama3.2-1b";
  double modeled_compress = 1, modeled_scale = 4;
  AgentConfig cfg;
  std::string duet = std::string(DUET_BINARY_DIR) + "/bin/duet";
  double stack_timeout_s = 600;
  app.add_option("--mode", mode,
                 "measured | modeled | both (in process and modelled) | stack (the real serving "
                 "loop: `duet stack up`, FCFS with DUET_AGENT=off)");
  app.add_option("--duet", duet, "the duet CLI (stack mode)");
  app.add_option("--stack-timeout", stack_timeout_s, "seconds a stack run may take");
  app.add_option("--reactive-per-min", t.reactive_per_min);
  app.add_option("--proactive-per-min", t.proactive_per_min);
  app.add_option("--requests", t.requests);
  app.add_option("--compress", t.compress, "trace minutes squeezed by this factor (measured)");
  app.add_option("--modeled-compress", modeled_compress, "the same for the modelled run");
  app.add_option("--modeled-length-scale", modeled_scale,
                 "prompt/output lengths x this when modelled");
  app.add_option("--seed", t.seed);
  app.add_option("--model", model);
  app.add_option("--soc", soc_name);
  app.add_option("--shape", shape_name);
  app.add_option("--cap", cfg.decode_cap);
  app.add_option("--aging-ms", cfg.aging_ms);
  std::string rider_slack;
  app.add_option("--rider-slack", rider_slack,
                 "stack mode: DUET_AGENT_RIDER_SLACK for the Agent's frontend (a number >= 0, or "
                 "inf for the cap alone; unset: the frontend's default)");
  std::string carry;
  app.add_option(
         "--carry", carry,
         "stack mode: DUET_AGENT_PROACTIVE_CARRY for the Agent's frontend (on | off; unset: "
         "the frontend's default)")
      ->check(CLI::IsMember({"on", "off"}));
  std::string preempt;
  app.add_option("--preempt", preempt,
                 "stack mode: DUET_AGENT_PREEMPT for the Agent's frontend (on: proactive steps "
                 "preemptible; off: plain steps; unset: the frontend's default)")
      ->check(CLI::IsMember({"on", "off"}));
  std::string overlap;
  app.add_option("--overlap", overlap,
                 "stack mode: DUET_AGENT_OVERLAP for the Agent's frontend (off | proactive | "
                 "all; unset: the frontend's default)")
      ->check(CLI::IsMember({"off", "proactive", "all"}));
  std::string proactive_plan;
  app.add_option("--proactive-plan", proactive_plan,
                 "stack mode: DUET_AGENT_PROACTIVE_PLAN for the Agent's frontend (a stack plan; "
                 "unset: the frontend's default)");
  std::string proactive_step_tokens;
  app.add_option("--proactive-step-tokens", proactive_step_tokens,
                 "stack mode: DUET_AGENT_PROACTIVE_STEP_TOKENS for the Agent's frontend (64-512; "
                 "unset: the frontend's default)");
  std::string max_queue;
  app.add_option("--max-queue", max_queue,
                 "stack mode: DUET_MAX_QUEUE for both stacks (requests waiting beyond the "
                 "running batch; unset: the frontend's default, 64). Long traces at high "
                 "compression need more: FCFS's queue fills and the frontend refuses a request");
  CLI11_PARSE(app, argc, argv);
  if (mode != "measured" && mode != "modeled" && mode != "both" && mode != "stack") {
    std::fprintf(stderr, "agent_bench: --mode must be measured, modeled, both or stack, not '%s'\n",
                 mode.c_str());
    return 2;
  }
  if (t.requests < 2 || t.reactive_per_min <= 0 || t.proactive_per_min <= 0 || t.compress <= 0) {
    std::fprintf(stderr, "agent_bench: --requests >= 2 and positive rates and compression\n");
    return 2;
  }
  if (!rider_slack.empty()) {
    char* end = nullptr;
    const double x = std::strtod(rider_slack.c_str(), &end);
    if (end == rider_slack.c_str() || *end != '\0' || !(x >= 0)) {
      std::fprintf(stderr, "agent_bench: --rider-slack must be a number >= 0 or inf, not '%s'\n",
                   rider_slack.c_str());
      return 2;
    }
  }
  try {
    nlohmann::json out;
    out["trace"] = {{"reactive_per_min", t.reactive_per_min},
                    {"proactive_per_min", t.proactive_per_min},
                    {"requests", t.requests},
                    {"seed", t.seed},
                    {"decode_cap", cfg.decode_cap},
                    {"aging_ms", cfg.aging_ms}};
    if (mode == "measured" || mode == "both") {
      const std::vector<Req> trace = make_trace(t);
      auto one = make_measured_backend(model, false);
      Run fcfs{trace, *one};
      run_fcfs(fcfs);
      one.reset();
      auto two = make_measured_backend(model, true);
      Run agent{trace, *two};
      run_agent(agent, cfg);
      const nlohmann::json f = summarize(fcfs, t.compress), a = summarize(agent, t.compress);
      const double floor_ms = isolated_reactive_mean_ms(*two, trace);
      out["measured"] = {
          {"model", model}, {"fcfs", f}, {"agent", a}, {"compare", compare(f, a, floor_ms)}};
    }
    if (mode == "stack") {
      const std::vector<Req> trace = make_trace(t);
      const std::string id = "agentb" + std::to_string(getpid());
      const AgentKnobs knobs{cfg.decode_cap, cfg.aging_ms, rider_slack,    carry,
                             preempt,        overlap,      proactive_plan, proactive_step_tokens,
                             max_queue};
      const nlohmann::json f =
          run_stack(trace, false, duet, model, id + "f", t.compress, stack_timeout_s, knobs);
      const nlohmann::json a =
          run_stack(trace, true, duet, model, id + "a", t.compress, stack_timeout_s, knobs);
      out["stack"] = {{"model", model},
                      {"rider_slack", rider_slack.empty() ? "default" : rider_slack},
                      {"carry", carry.empty() ? "default" : carry},
                      {"preempt", preempt.empty() ? "default" : preempt},
                      {"overlap", overlap.empty() ? "default" : overlap},
                      {"proactive_plan", proactive_plan.empty() ? "default" : proactive_plan},
                      {"proactive_step_tokens",
                       proactive_step_tokens.empty() ? "default" : proactive_step_tokens},
                      {"max_queue", max_queue.empty() ? "default" : max_queue},
                      {"offered", offered_load(trace)},
                      {"fcfs", f},
                      {"agent", a},
                      {"compare", compare(f, a, a["reactive_isolated_mean_ms"].get<double>())}};
    }
    if (mode == "modeled" || mode == "both") {
      TraceOptions m = t;
      m.compress = modeled_compress;
      m.length_scale = modeled_scale;
      const std::vector<Req> trace = make_trace(m);
      const SocProfile soc = load_soc_profile(soc_name);
      const ModelShape& shape = model_shape(shape_name);
      auto fb = make_modeled_backend(soc, shape, 256, 512);
      Run fcfs{trace, *fb};
      run_fcfs(fcfs);
      auto ab = make_modeled_backend(soc, shape, 256, 512);
      AgentConfig mc = cfg;
      Run agent{trace, *ab};
      run_agent(agent, mc);
      const nlohmann::json f = summarize(fcfs, m.compress), a = summarize(agent, m.compress);
      auto idle = make_modeled_backend(soc, shape, 256, 512);
      const double floor_ms = isolated_reactive_mean_ms(*idle, trace);
      out["modeled"] = {
          {"soc", soc_name}, {"shape", shape_name}, {"length_scale", modeled_scale},
          {"fcfs", f},       {"agent", a},          {"compare", compare(f, a, floor_ms)}};
    }
    std::printf("%s\n", out.dump(2).c_str());
  } catch (const Error& e) {
    std::fprintf(stderr, "agent_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
