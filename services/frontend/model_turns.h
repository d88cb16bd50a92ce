#pragma once
// Whose step runs next when several models of one stack have work (issue 25: Puzzle's third
// chromosome, model priorities, executed by the stack). The models' steps meet in the frontend
// process: ModelRouter::pump (model_router.h) runs one engine step at a time, and gpu_svc and
// npu_svc run the steps they are rung for in that order. So the order is chosen here, at step
// boundaries: a running step always finishes (non-preemptive, as Puzzle's subgraphs; a step of
// a subgraph plan is all of its subgraphs).
//
// Each model has a rank (0 runs first; equal ranks take turns). Among the models ready to step,
// the one with the least effective rank steps:
//   effective rank = rank - waited / aging_steps      (integer division)
// where `waited` counts the steps the model has been passed over while ready since it last
// stepped; ties go to the model that has waited longer, then to the earlier model. So equal
// ranks are round robin, and a lower-priority model is never starved: after (its rank - the best
// ready rank) x aging_steps passed-over steps it ranks with the best, and from then on each other
// model steps at most once before it (a model that steps starts waiting from 0 again). Its wait
// is at most (rank - best rank) x aging_steps + models - 1 steps (`max_wait_steps` in status
// shows the longest seen). Waits in time are those steps' durations; a waiting model's
// deadlines (heartbeats, resume waits, idle sessions) are kept because the router reads, reaps
// and flushes every model on every turn: only the step waits. (A model's Agent.xpu proactive
// step, overlapped on its worker thread, runs beside the main steps as in a one-model stack; the
// ranks order the main steps.)
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace duet::frontend {

class ModelTurns {
 public:
  struct Stats {
    uint64_t steps = 0;            // steps this model took
    uint64_t contended_steps = 0;  // of them, taken while another model was ready too
    uint64_t passed_over = 0;      // steps another model took while this one was ready
    uint64_t max_wait_steps = 0;   // the longest run of passed-over steps before its turn
  };

  // ranks[i]: model i's rank (0 first). aging_steps >= 1 (invalid_argument otherwise).
  ModelTurns(std::vector<int> ranks, int aging_steps);

  // ready[i]: model i has a step to run now (one entry per model). Returns the model to step,
  // or -1 when none is ready.
  int choose(const std::vector<bool>& ready) const;
  // Model `stepped` ran a step while `ready` were ready (it among them): counts its step, its
  // contention and the others' waits. A chosen model that found nothing to run (its work blocked
  // on KV, say) is not recorded: the router chooses again without it.
  void record(size_t stepped, const std::vector<bool>& ready);

  size_t size() const { return ranks_.size(); }
  int rank(size_t model) const { return ranks_.at(model); }
  int aging_steps() const { return aging_steps_; }
  const Stats& stats(size_t model) const { return stats_.at(model); }
  // {"rank", "steps", "contended_steps", "passed_over", "max_wait_steps", "waiting_steps"}
  nlohmann::json status(size_t model) const;
  // The bound above, for the ranks given: the most steps a ready model `model` waits.
  uint64_t wait_bound_steps(size_t model) const;

 private:
  std::vector<int> ranks_;
  int aging_steps_;
  std::vector<uint64_t> waited_;  // passed-over steps since the model last stepped (while ready)
  std::vector<Stats> stats_;
};

}  // namespace duet::frontend
