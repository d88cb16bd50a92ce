#pragma once
// The warm-up `duet stack up` and `duet stack restart` run once the stack is healthy
// (cmd_stack_warmup.cpp).
#include <string>
#include <vector>

namespace duet::cli {

// One model to warm up: the name its Warmup carries ("" = the stack's only model) and the one
// printed.
struct WarmupTarget {
  std::string model, label;
};

// Sends each target's Warmup and prints what ran ("NAME: warmed up in N ms (K steps)"); a failure
// is a warning on stderr (the stack is up: the first request builds the engine instead).
void warm_up(const std::string& stack, const std::string& run_dir, int timeout_s,
             const std::vector<WarmupTarget>& targets);
// The `warmup` setting `up` recorded in <run dir>/settings.json (on when the record lacks it).
bool recorded_warmup_on(const std::string& run_dir);
// The models an up stack serves, from its frontend's status.
std::vector<WarmupTarget> served_models(const std::string& stack, const std::string& run_dir);

}  // namespace duet::cli
