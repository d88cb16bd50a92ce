#include "bench/agent/stack_driver.h"

#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
#include <utility>

#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"
#include "shm/segment.h"

namespace duet::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::string run_command(const std::string& cmd, int* rc) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) throw Error(Errc::internal, "agent_bench: cannot run " + cmd);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  return out;
}

// Owns the stack from `up` to `down`: whatever happens in between, nothing is left behind.
class Stack {
 public:
  Stack(const std::string& duet, const std::string& model, const std::string& id, bool agent,
        const AgentKnobs& knobs)
      : duet_(duet), id_(id) {
    int rc = 0;
    const std::string out = run_command(
        std::string("DUET_AGENT=") + (agent ? "on" : "off") +
            " DUET_AGENT_DECODE_CAP=" + std::to_string(knobs.decode_cap) +
            " DUET_AGENT_AGING_MS=" + std::to_string(knobs.aging_ms) +
            (knobs.rider_slack.empty() ? std::string()
                                       : " DUET_AGENT_RIDER_SLACK='" + knobs.rider_slack + "'") +
            (knobs.carry.empty() ? std::string()
                                 : " DUET_AGENT_PROACTIVE_CARRY='" + knobs.carry + "'") +
            (knobs.preempt.empty() ? std::string()
                                   : " DUET_AGENT_PREEMPT='" + knobs.preempt + "'") +
            (knobs.overlap.empty() ? std::string()
                                   : " DUET_AGENT_OVERLAP='" + knobs.overlap + "'") +
            (knobs.proactive_plan.empty()
                 ? std::string()
                 : " DUET_AGENT_PROACTIVE_PLAN='" + knobs.proactive_plan + "'") +
            (knobs.proactive_step_tokens.empty()
                 ? std::string()
                 : " DUET_AGENT_PROACTIVE_STEP_TOKENS='" + knobs.proactive_step_tokens + "'") +
            (knobs.max_queue.empty() ? std::string()
                                     : " DUET_MAX_QUEUE='" + knobs.max_queue + "'") +
            " '" + duet_ + "' stack up --stack " + id_ + " --model '" + model + "'",
        &rc);
    if (rc != 0) {
      down();
      throw Error(Errc::unavailable, "agent_bench: `duet stack up` failed: " + out);
    }
  }
  ~Stack() { down(); }

 private:
  void down() {
    int rc = 0;
    (void)run_command("'" + duet_ + "' stack down --stack " + id_, &rc);
    shm::remove_stack_segments(id_);
  }
  std::string duet_, id_;
};

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

StackRun run_trace_on_stack(const std::vector<TraceItem>& trace, bool agent,
                            const std::string& duet, const std::string& model,
                            const std::string& stack_id, double timeout_s,
                            const AgentKnobs& knobs) {
  Stack stack(duet, model, stack_id, agent, knobs);
  client::Client c(client::stack_endpoint(stack_id));
  // Warm-up outside the trace: the engines are built by their first request (programs
  // registered, the solver asked), which is not what the trace measures.
  for (const client::Priority p : {client::Priority::reactive, client::Priority::proactive}) {
    client::GenerateRequest w;
    w.prompt_ids = {1, 3, 4, 5};
    w.max_tokens = 2;
    w.priority = agent ? p : client::Priority::reactive;
    (void)c.generate(w, {}, std::chrono::seconds(120));
  }
  StackRun out;
  out.timings.resize(trace.size());
  auto engine_time = [&c] {
    const nlohmann::json m = c.status()["metrics"];
    return std::pair<double, uint64_t>{m["measured"]["step_ms"].get<double>(),
                                       m["step_tokens"].get<uint64_t>()};
  };
  const auto [busy_ms0, busy_tokens0] = engine_time();
  const nlohmann::json time_before =
      c.status()["agent"].value("proactive_time_ms", nlohmann::json::object());
  std::map<uint64_t, size_t> item_of;  // client request id -> trace item
  size_t next = 0, done = 0;
  const auto t0 = Clock::now();
  const auto give_up =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (done < trace.size()) {
    if (Clock::now() > give_up)
      throw Error(Errc::timeout, "agent_bench: the trace did not finish within " +
                                     std::to_string(timeout_s) + " s (" + std::to_string(done) +
                                     " of " + std::to_string(trace.size()) + " done)");
    while (next < trace.size() && trace[next].arrival_us <= us_since(t0)) {
      const TraceItem& it = trace[next];
      client::GenerateRequest r;
      r.prompt_ids = it.prompt;
      r.max_tokens = it.out_len;
      r.ignore_eos = true;  // every request runs to its length, as in the trace
      r.stream = false;
      r.heartbeat_ms = 0;  // this loop sends no KeepAlive
      // FCFS: no priorities, every request in the one class.
      r.priority = agent && !it.reactive ? client::Priority::proactive : client::Priority::reactive;
      item_of[c.submit(r)] = next++;
    }
    const double wait_us =
        next < trace.size() ? std::max(0.0, trace[next].arrival_us - us_since(t0)) : 100000.0;
    auto ev = c.next_event(
        std::chrono::milliseconds(static_cast<int64_t>(std::min(wait_us, 100000.0) / 1000.0)));
    if (!ev) continue;
    auto it = item_of.find(ev->request_id);
    if (it == item_of.end()) continue;
    if (ev->kind == client::Event::Kind::error)
      throw Error(ev->code, "agent_bench: request failed on the stack: " + ev->message);
    if (ev->kind != client::Event::Kind::done) continue;
    ItemTiming& t = out.timings[it->second];
    t.done_us = us_since(t0);
    t.first_token_us = trace[it->second].arrival_us + ev->done.stats.ttft_ms * 1000.0;
    if (ev->done.ids.size() != static_cast<size_t>(trace[it->second].out_len))
      throw Error(Errc::internal, "agent_bench: a request returned " +
                                      std::to_string(ev->done.ids.size()) + " tokens, not " +
                                      std::to_string(trace[it->second].out_len));
    ++done;
  }
  out.makespan_us = us_since(t0);
  out.agent_status = c.status()["agent"];
  if (out.agent_status.contains("proactive_time_ms")) {
    out.proactive_time_ms = nlohmann::json::object();
    for (const auto& [k, v] : out.agent_status["proactive_time_ms"].items())
      out.proactive_time_ms[k] = v.get<double>() - time_before.value(k, 0.0);
  }
  const auto [busy_ms1, busy_tokens1] = engine_time();
  out.busy_ms = busy_ms1 - busy_ms0;
  out.busy_tokens = busy_tokens1 - busy_tokens0;
  if (agent)
    for (const TraceItem& it : trace) {
      if (!it.reactive) continue;
      client::GenerateRequest r;
      r.prompt_ids = it.prompt;
      r.max_tokens = it.out_len;
      r.ignore_eos = true;
      r.stream = false;
      const auto t1 = Clock::now();
      const client::GenerateResult alone = c.generate(r, {}, std::chrono::seconds(120));
      out.isolated_reactive_us.push_back(us_since(t1));
      out.isolated_reactive_ttft_ms.push_back(alone.stats.ttft_ms);
    }
  return out;
}

}  // namespace duet::bench
