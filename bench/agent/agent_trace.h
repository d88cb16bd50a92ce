#pragma once
// The trace of agent_bench (issue 9): Poisson arrivals of reactive and proactive requests with
// uniform prompt and output lengths, and each request's progress as a driver runs it.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "bench/agent/agent_backends.h"

namespace duet::bench {

struct Req {
  uint64_t id = 0;
  Flow flow = Flow::reactive;
  double arrival_us = 0;
  std::vector<int32_t> prompt;
  int out_len = 0;
  size_t prefilled = 0;
  int32_t pos = 0;
  int generated = 0;
  int32_t last_token = 0;
  double done_us = 0, waiting_since_us = 0, first_token_us = 0;
  bool promoted = false;
};

struct TraceOptions {
  double reactive_per_min = 3, proactive_per_min = 6, compress = 30;
  int requests = 40;
  int reactive_prompt[2] = {48, 128}, reactive_out[2] = {16, 32};
  int proactive_prompt[2] = {192, 320}, proactive_out[2] = {48, 96};
  double length_scale = 1;
  uint64_t seed = 1;
};

inline std::vector<Req> make_trace(const TraceOptions& o) {
  std::mt19937_64 rng(o.seed);
  auto uniform = [&](const int r[2]) {
    return static_cast<int>(std::uniform_int_distribution<int>(r[0], r[1])(rng) * o.length_scale);
  };
  std::vector<Req> out;
  double t[2] = {0, 0};
  const double rate_per_us[2] = {o.reactive_per_min * o.compress / 60e6,
                                 o.proactive_per_min * o.compress / 60e6};
  for (int i = 0; i < o.requests; ++i) {
    for (int c = 0; c < 2; ++c)
      if (t[c] == 0) t[c] = std::exponential_distribution<double>(rate_per_us[c])(rng);
    const int c = t[0] <= t[1] ? 0 : 1;
    Req r;
    r.id = static_cast<uint64_t>(i) + 1;
    r.flow = c == 0 ? Flow::reactive : Flow::proactive;
    r.arrival_us = t[c];
    const int n = uniform(c == 0 ? o.reactive_prompt : o.proactive_prompt);
    r.prompt.push_back(1);
    for (int k = 1; k < n; ++k) r.prompt.push_back(static_cast<int32_t>(3 + rng() % 2000));
    r.out_len = std::max(1, uniform(c == 0 ? o.reactive_out : o.proactive_out));
    out.push_back(std::move(r));
    t[c] += std::exponential_distribution<double>(rate_per_us[c])(rng);
  }
  return out;
}

}  // namespace duet::bench
