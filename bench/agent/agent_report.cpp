// The agent bench's report: the summary of a run's requests (latencies, throughput,
// preemptions), the isolated-request floor, the load the trace offers and FCFS vs Agent.xpu.
#include "bench/agent/agent_report.h"

#include <algorithm>
#include <cmath>

namespace duet::bench {
namespace {

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

double p90(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(0.9 * static_cast<double>(v.size())))];
}

}  // namespace

// The floor no scheduler beats: each reactive request of the trace alone on an idle backend
// (its prompt in chunks, then one decode step per token). 1 - floor / FCFS is the largest
// reactive latency reduction the trace allows.
double isolated_reactive_mean_ms(Backend& b, const std::vector<Req>& trace) {
  std::vector<double> latency_ms;
  for (const Req& r : trace) {
    if (r.flow != Flow::reactive) continue;
    b.open(Flow::reactive, r.id, static_cast<int>(r.prompt.size()) + r.out_len);
    double us = 0;
    int32_t pos = 0, last = 0;
    for (size_t done = 0; done < r.prompt.size();) {
      const size_t chunk =
          std::min(r.prompt.size() - done, static_cast<size_t>(b.max_step_tokens()));
      SeqWork w{r.id,
                std::vector<int32_t>(r.prompt.begin() + static_cast<long>(done),
                                     r.prompt.begin() + static_cast<long>(done + chunk)),
                pos};
      const StepOutcome o = b.step(Flow::reactive, {w}, false, kNever);
      us += o.us;
      done += chunk;
      pos += static_cast<int32_t>(chunk);
      last = o.next_tokens.back();
    }
    for (int k = 1; k < r.out_len; ++k) {
      const StepOutcome o = b.step(Flow::reactive, {{r.id, {last}, pos}}, false, kNever);
      us += o.us;
      ++pos;
      last = o.next_tokens.back();
    }
    b.close(Flow::reactive, r.id);
    latency_ms.push_back(us / 1000.0);
  }
  return mean(latency_ms);
}

nlohmann::json summarize(const std::vector<Req>& reqs, uint64_t preemptions,
                         const std::vector<double>& preempt_latency_us, uint64_t steps,
                         double makespan_us, double compress) {
  std::vector<double> re_lat, pro_norm, re_ttft;
  double pro_tokens = 0, first = reqs.front().arrival_us, last = 0;
  for (const Req& r : reqs) {
    const double lat_ms = (r.done_us - r.arrival_us) / 1000.0;
    if (r.flow == Flow::reactive) {
      re_lat.push_back(lat_ms);
      re_ttft.push_back((r.first_token_us - r.arrival_us) / 1000.0);
    } else {
      pro_norm.push_back(lat_ms / r.out_len);
      pro_tokens += r.out_len;
      last = std::max(last, r.done_us);
    }
  }
  // Per request, in arrival order: where a mean comes from (one slow request or all of them).
  auto rounded = [](std::vector<double> v) {
    for (double& x : v) x = std::round(x * 10.0) / 10.0;
    return v;
  };
  return {{"reactive_requests", re_lat.size()},
          {"reactive_latencies_ms", rounded(re_lat)},
          {"reactive_ttfts_ms", rounded(re_ttft)},
          {"reactive_mean_ms", mean(re_lat)},
          {"reactive_p90_ms", p90(re_lat)},
          {"reactive_ttft_mean_ms", mean(re_ttft)},
          {"proactive_requests", pro_norm.size()},
          {"proactive_last_done_s", (last - first) / 1e6},
          {"proactive_norm_latency_ms_per_token", mean(pro_norm)},
          {"proactive_tokens_per_s", pro_tokens / ((last - first) / 1e6)},
          {"preemptions", preemptions},
          {"preempt_latency_mean_us", mean(preempt_latency_us)},
          {"preempt_latency_max_us",
           preempt_latency_us.empty()
               ? 0.0
               : *std::max_element(preempt_latency_us.begin(), preempt_latency_us.end())},
          {"steps", steps},
          {"makespan_s", makespan_us / 1e6},
          {"compress", compress}};
}

// The work the trace offers per second of its arrivals (prompt + output tokens; proactive and
// all): set against busy_tokens_per_s, it says how loaded the stack is.
nlohmann::json offered_load(const std::vector<Req>& trace) {
  double pro = 0, all = 0, span_us = 0;
  for (const Req& r : trace) {
    const double tokens = static_cast<double>(r.prompt.size()) + r.out_len;
    all += tokens;
    if (r.flow == Flow::proactive) pro += tokens;
    span_us = std::max(span_us, r.arrival_us);
  }
  const double span_s = span_us / 1e6;
  return {{"arrival_span_s", span_s},
          {"proactive_tokens_per_s", span_s > 0 ? pro / span_s : 0.0},
          {"all_tokens_per_s", span_s > 0 ? all / span_s : 0.0}};
}

nlohmann::json compare(const nlohmann::json& fcfs, const nlohmann::json& agent,
                       double isolated_ms) {
  const double fr = fcfs["reactive_mean_ms"], ar = agent["reactive_mean_ms"];
  const double ft = fcfs["proactive_tokens_per_s"], at = agent["proactive_tokens_per_s"];
  return {{"reactive_mean_reduction_pct", fr > 0 ? 100.0 * (fr - ar) / fr : 0.0},
          {"reactive_isolated_mean_ms", isolated_ms},
          {"best_possible_reduction_pct", fr > 0 ? 100.0 * (fr - isolated_ms) / fr : 0.0},
          {"proactive_throughput_ratio", ft > 0 ? at / ft : 0.0},
          {"target_met", fr > 0 && (fr - ar) / fr >= 0.8 && at >= ft}};
}

}  // namespace duet::bench
