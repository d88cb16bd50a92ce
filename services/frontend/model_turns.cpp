#include "services/frontend/model_turns.h"

#include <algorithm>
#include <string>

#include "core/base/error.h"

namespace duet::frontend {

ModelTurns::ModelTurns(std::vector<int> ranks, int aging_steps)
    : ranks_(std::move(ranks)),
      aging_steps_(aging_steps),
      waited_(ranks_.size(), 0),
      stats_(ranks_.size()) {
  if (aging_steps_ < 1)
    throw Error(Errc::invalid_argument,
                "model turns: aging_steps is " + std::to_string(aging_steps_) + ", not >= 1");
}

namespace {

void check_size(size_t flags, size_t models) {
  if (flags != models)
    throw Error(Errc::internal, "model turns: " + std::to_string(flags) + " ready flags for " +
                                    std::to_string(models) + " models");
}

}  // namespace

int ModelTurns::choose(const std::vector<bool>& ready) const {
  check_size(ready.size(), ranks_.size());
  int pick = -1;
  int64_t best = 0;
  for (size_t m = 0; m < ranks_.size(); ++m) {
    if (!ready[m]) continue;
    const int64_t effective =
        int64_t{ranks_[m]} - static_cast<int64_t>(waited_[m] / uint64_t(aging_steps_));
    if (pick < 0 || effective < best ||
        (effective == best && waited_[m] > waited_[static_cast<size_t>(pick)])) {
      pick = static_cast<int>(m);
      best = effective;
    }
  }
  return pick;
}

void ModelTurns::record(size_t stepped, const std::vector<bool>& ready) {
  check_size(ready.size(), ranks_.size());
  const auto n_ready = std::count(ready.begin(), ready.end(), true);
  for (size_t m = 0; m < ranks_.size(); ++m) {
    Stats& s = stats_[m];
    if (m == stepped) {
      ++s.steps;
      if (n_ready > 1) ++s.contended_steps;
      s.max_wait_steps = std::max(s.max_wait_steps, waited_[m]);
      waited_[m] = 0;
    } else if (ready[m]) {
      ++s.passed_over;
      ++waited_[m];
    } else {
      // Not ready: nothing of it waits. A model that runs out of work and comes back later starts
      // its wait afresh, as a newly arrived one.
      waited_[m] = 0;
    }
  }
}

uint64_t ModelTurns::wait_bound_steps(size_t model) const {
  const int best = *std::min_element(ranks_.begin(), ranks_.end());
  return uint64_t(ranks_.at(model) - best) * uint64_t(aging_steps_) + ranks_.size() - 1;
}

nlohmann::json ModelTurns::status(size_t model) const {
  const Stats& s = stats_.at(model);
  return {{"rank", ranks_.at(model)},
          {"steps", s.steps},
          {"contended_steps", s.contended_steps},
          {"passed_over", s.passed_over},
          {"max_wait_steps", s.max_wait_steps},
          {"wait_bound_steps", wait_bound_steps(model)},
          {"waiting_steps", waited_.at(model)}};
}

}  // namespace duet::frontend
