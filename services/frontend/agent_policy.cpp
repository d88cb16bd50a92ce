#include "services/frontend/agent_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/base/error.h"

namespace duet::frontend::agent {

bool aged(const Job& j, double now_ms, const AgentConfig& cfg) {
  return j.promoted || (j.flow == Flow::proactive && now_ms - j.enqueued_ms > cfg.aging_ms);
}

void AgentQueues::push_prefill(Job j) {
  (j.flow == Flow::reactive ? reactive_prefill_ : proactive_prefill_).push_back(j);
}

void AgentQueues::push_decode(Job j) {
  (j.flow == Flow::reactive ? reactive_decode_ : proactive_decode_).push_back(j);
}

int AgentQueues::age(double now_ms) {
  int n = 0;
  for (std::deque<Job>* q : {&proactive_prefill_, &proactive_decode_})
    for (Job& j : *q)
      if (!j.promoted && aged(j, now_ms, cfg_)) {
        j.promoted = true;
        ++n;
      }
  return n;
}

bool AgentQueues::promoted_prefill_waiting() const {
  return std::any_of(proactive_prefill_.begin(), proactive_prefill_.end(),
                     [](const Job& j) { return j.promoted; });
}

std::optional<Job> AgentQueues::pop_prefill(double now_ms) {
  age(now_ms);
  // A promoted job joins the reactive order by when it was enqueued: it goes ahead of reactive
  // jobs that came after it, so a steady reactive stream cannot starve it.
  auto promoted = std::find_if(proactive_prefill_.begin(), proactive_prefill_.end(),
                               [](const Job& j) { return j.promoted; });
  const bool promoted_first =
      promoted != proactive_prefill_.end() &&
      (reactive_prefill_.empty() || promoted->enqueued_ms < reactive_prefill_.front().enqueued_ms);
  if (!reactive_prefill_.empty() && !promoted_first) {
    Job j = reactive_prefill_.front();
    reactive_prefill_.pop_front();
    return j;
  }
  auto it = promoted_first ? promoted : proactive_prefill_.begin();
  if (it == proactive_prefill_.end()) return std::nullopt;
  Job j = *it;
  proactive_prefill_.erase(it);
  return j;
}

std::optional<Job> AgentQueues::pop_prefill(Flow flow, double now_ms) {
  age(now_ms);
  std::deque<Job>& q = flow == Flow::reactive ? reactive_prefill_ : proactive_prefill_;
  auto it = std::find_if(q.begin(), q.end(), [](const Job& j) { return j.promoted; });
  if (it == q.end()) it = q.begin();
  if (it == q.end()) return std::nullopt;
  Job j = *it;
  q.erase(it);
  return j;
}

std::vector<Job> AgentQueues::pop_decode_all(Flow flow) {
  std::deque<Job>& q = flow == Flow::reactive ? reactive_decode_ : proactive_decode_;
  std::vector<Job> out(q.begin(), q.end());
  q.clear();
  return out;
}

bool should_preempt(const Job& running, bool reactive_waiting) {
  return reactive_waiting && !urgent(running);
}

ElasticBinding elastic_binding(int n_tokens, bool decode_busy, int chunk_tokens,
                               const OpCost& op_us) {
  if (n_tokens <= 0)
    throw Error(Errc::invalid_argument, "elastic binding: a prefill step of no tokens");
  if (chunk_tokens <= 0)
    throw Error(Errc::invalid_argument, "elastic binding: chunk size must be positive");
  ElasticBinding b;
  b.n_chunks = n_tokens / chunk_tokens;
  const int rem = n_tokens - b.n_chunks * chunk_tokens;
  const double npu_chunk = b.n_chunks ? op_us(chunk_tokens, Device::npu) : 0;
  const double gpu_chunk = b.n_chunks ? op_us(chunk_tokens, Device::gpu) : 0;
  const double gpu_rem = rem ? op_us(rem, Device::gpu) : 0;
  if (decode_busy) {
    b.npu_chunks = b.n_chunks;
    b.npu_us = b.npu_chunks * npu_chunk;
    b.gpu_us = gpu_rem;
    b.defer_us = std::max(0.0, b.npu_us - gpu_rem);
  } else {
    // argmin over i of |i * T_npu - (N - i) * T_gpu - T_gpu(rem)|; ties go to the NPU (it leaves
    // the GPU to decode).
    double best = std::numeric_limits<double>::infinity();
    for (int i = 0; i <= b.n_chunks; ++i) {
      const double gap = std::abs(i * npu_chunk - (b.n_chunks - i) * gpu_chunk - gpu_rem);
      if (gap <= best) {
        best = gap;
        b.npu_chunks = i;
      }
    }
    b.npu_us = b.npu_chunks * npu_chunk;
    b.gpu_us = (b.n_chunks - b.npu_chunks) * gpu_chunk + gpu_rem;
  }
  b.npu_tokens = b.npu_chunks * chunk_tokens;
  b.gpu_tokens = n_tokens - b.npu_tokens;
  return b;
}

Plan elastic_plan(const ElasticBinding& b) {
  if (b.npu_tokens == 0) return Plan::gpu_only();
  if (b.gpu_tokens == 0) return Plan::npu_only();
  Plan p;
  p.name = "elastic-" + std::to_string(b.npu_tokens);
  for (Placement& pl : p.matmul) pl = {Strategy::activation_split, 0, b.npu_tokens};
  return p;
}

Stage gpu_next(bool prefill_ready, bool decode_ready) {
  if (prefill_ready) return Stage::prefill;
  return decode_ready ? Stage::decode : Stage::none;
}

bool may_overlap(const Work& running, const Work& candidate) {
  return !(running.memory_bound && candidate.memory_bound && running.flow != candidate.flow);
}

DecodeBatch reactive_first_batch(const std::vector<Job>& current,
                                 const std::vector<Job>& new_reactive,
                                 const std::vector<Job>& new_proactive, int cap,
                                 bool reactive_elsewhere) {
  if (cap < 0) throw Error(Errc::invalid_argument, "decode batch cap must not be negative");
  DecodeBatch out;
  std::vector<Job> proactive;
  for (const std::vector<Job>* src : {&current, &new_reactive, &new_proactive})
    for (const Job& j : *src) (urgent(j) ? out.batch : proactive).push_back(j);
  const bool any_reactive = reactive_elsewhere || !out.batch.empty();
  std::stable_sort(proactive.begin(), proactive.end(), [](const Job& a, const Job& b) {
    if (a.seq_len != b.seq_len) return a.seq_len < b.seq_len;
    return a.enqueued_ms < b.enqueued_ms;
  });
  for (const Job& j : proactive) {
    if (!any_reactive || static_cast<int>(out.batch.size()) < cap)
      out.batch.push_back(j);
    else
      out.evicted.push_back(j);
  }
  return out;
}

StepTimeModel::StepTimeModel(double weight) : weight_(weight) {
  if (!(weight > 0 && weight <= 1))
    throw Error(Errc::invalid_argument, "step time model: the weight must be in (0, 1]");
}

void StepTimeModel::observe(int tokens, double us) {
  if (tokens < 1)
    throw Error(Errc::invalid_argument,
                "step time model: a step of " + std::to_string(tokens) + " tokens");
  if (!(us >= 0) || !std::isfinite(us))
    throw Error(Errc::invalid_argument, "step time model: a step time must be finite and >= 0");
  const size_t i = static_cast<size_t>(tokens) - 1;
  if (mean_us_.size() <= i) {
    mean_us_.resize(i + 1, 0);
    n_.resize(i + 1, 0);
  }
  mean_us_[i] = n_[i] == 0 ? us : (1 - weight_) * mean_us_[i] + weight_ * us;
  ++n_[i];
}

std::optional<double> StepTimeModel::predict(int tokens) const {
  if (tokens < 1 || static_cast<size_t>(tokens) > n_.size() || n_[tokens - 1] == 0)
    return std::nullopt;
  return mean_us_[static_cast<size_t>(tokens) - 1];
}

uint64_t StepTimeModel::samples(int tokens) const {
  return tokens < 1 || static_cast<size_t>(tokens) > n_.size() ? 0 : n_[tokens - 1];
}

int slack_riders(const StepTimeModel& model, int reactive_tokens, int candidates, double slack) {
  if (!(slack >= 0))
    throw Error(Errc::invalid_argument, "rider slack must be >= 0 (infinity: no bound)");
  if (candidates < 0) throw Error(Errc::invalid_argument, "a negative number of riders");
  if (reactive_tokens <= 0 || std::isinf(slack)) return candidates;
  const std::optional<double> base = model.predict(reactive_tokens);
  if (!base) return 0;
  const double limit = (1 + slack) * *base;
  int admitted = 0;
  for (int k = 1; k <= candidates; ++k) {
    const std::optional<double> t = model.predict(reactive_tokens + k);
    // Unmeasured: tried (and so measured) when every smaller count fits; a step time grows
    // with its tokens, so past a count that does not fit an unmeasured one is not tried.
    if (!t) return admitted == k - 1 ? k : admitted;
    if (*t <= limit) admitted = k;
  }
  return admitted;
}

}  // namespace duet::frontend::agent
