// Greedy sampling per logits row, side by side in one run: duet::Sampler (NaN check, then the
// maximum and its first position) against the one-pass std::max_element it replaced (with the
// same NaN check written as an early-exit loop, as before). JSON on stdout.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "core/model/sampling.h"

namespace {

using Clock = std::chrono::steady_clock;

// The former greedy path, kept here only as the yardstick.
int32_t greedy_max_element(const std::vector<float>& logits) {
  for (size_t i = 0; i < logits.size(); ++i)
    if (std::isnan(logits[i])) throw std::runtime_error("NaN");
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

template <class Fn>
double best_us(int reps, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"greedy sampling per logits row, duet::Sampler vs std::max_element (JSON)"};
  int vocab = 128256, reps = 2000;
  app.add_option("--vocab", vocab, "logits per row (llama3.2: 128256)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--reps", reps, "rows timed per path (the best is kept)")
      ->check(CLI::Range(1, 1000000));
  CLI11_PARSE(app, argc, argv);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = static_cast<float>((i * 2654435761u) % 1000) / 100.0f;
  duet::Sampler sampler({});
  int32_t a = 0, b = 0;
  const double sampler_us = best_us(reps, [&] { a = sampler.sample(logits); });
  const double max_element_us = best_us(reps, [&] { b = greedy_max_element(logits); });
  if (a != b) {
    std::fprintf(stderr, "sampling_bench: the two paths disagree (%d vs %d)\n", a, b);
    return 1;
  }
  nlohmann::json out = {{"vocab", vocab},
                        {"reps", reps},
                        {"sampler_us", sampler_us},
                        {"max_element_us", max_element_us},
                        {"speedup", max_element_us / sampler_us}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
