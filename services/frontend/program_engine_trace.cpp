// ProgramEngine: the modelled SoC timeline of its steps and what `duet trace` asks of a step.
#include <algorithm>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"

namespace duet::frontend {
namespace {

std::string with_role_and_layer(std::string name, bool matmul, int role, int layer) {
  if (matmul && role >= 0 && role < kMatmulRoles)
    name += " " + std::string(matmul_role_name(static_cast<MatmulRole>(role)));
  if (layer >= 0) name += " L" + std::to_string(layer);
  return name;
}

std::string op_name(const fb::OpT& op) {
  const bool matmul = op.kind == fb::OpKind::MatMul || op.kind == fb::OpKind::Logits;
  return with_role_and_layer(fb::EnumNameOpKind(op.kind), matmul, op.role, op.layer);
}

std::string timed_op_name(const TimedOp& op) {
  const bool matmul = op.kind == OpKind::MatMul || op.kind == OpKind::Logits;
  return with_role_and_layer(op_kind_name(op.kind), matmul, static_cast<int>(op.role), op.layer);
}

}  // namespace

Timeline ProgramEngine::modeled_timeline(size_t bucket_index, uint32_t n_tokens, int64_t context,
                                         int32_t logits_rows) const {
  TimelineOptions t;
  t.n_tokens = n_tokens;
  t.context = context;
  t.logits_rows = std::max(logits_rows, 1);
  return compose_timeline(buckets_[bucket_index].soc_schedule, *soc_, soc_options_, t);
}

// Composing a timeline costs tens of microseconds for a 1B model, which a tiny model's decode
// step (~0.3 ms here) would feel on every step. Steps of one shape differ only by context, and
// only attention depends on it (linearly in the timing models), so the step is composed at the
// context's KV-page boundaries below and above and interpolated; each boundary is composed once.
double ProgramEngine::modeled_step_us(size_t bucket_index, uint32_t n_tokens, int64_t context,
                                      int32_t logits_rows) const {
  if (!soc_) return 0;
  const int64_t page = options_.page_tokens;
  const int64_t c0 = context / page * page;
  auto at = [&](int64_t c) {
    const auto key = std::make_tuple(bucket_index, n_tokens, logits_rows, c);
    auto it = modeled_cache_.find(key);
    if (it != modeled_cache_.end()) return it->second;
    if (modeled_cache_.size() >= 8192) modeled_cache_.clear();  // bounded
    const double us = modeled_timeline(bucket_index, n_tokens, c, logits_rows).step_us;
    modeled_cache_.emplace(key, us);
    return us;
  };
  const double lo = at(c0);
  if (context == c0) return lo;
  return lo + (at(c0 + page) - lo) * static_cast<double>(context - c0) / static_cast<double>(page);
}

nlohmann::json ProgramEngine::trace_step(const StepDetail& step) const {
  if (step.engine != instance_) return {};
  const Bucket* bucket = nullptr;
  for (const Bucket& b : buckets_)
    if (b.max_tokens == step.bucket_tokens && b.decode == step.decode) bucket = &b;
  if (!bucket) return {};
  nlohmann::json gpu_ops = nlohmann::json::array(), npu_ops = nlohmann::json::array();
  for (const auto& op : programs_[bucket->program].gpu.ops) gpu_ops.push_back(op_name(*op));
  for (const auto& op : programs_[bucket->program].npu.ops) npu_ops.push_back(op_name(*op));
  nlohmann::json j = {{"plan", bucket->plan.name},
                      {"phase", phase_of(*bucket)},
                      {"gpu_ops", std::move(gpu_ops)},
                      {"npu_ops", std::move(npu_ops)}};
  if (soc_) {
    const size_t index = static_cast<size_t>(bucket - buckets_.data());
    const Timeline tl = modeled_timeline(index, step.n_tokens, step.context,
                                         static_cast<int32_t>(step.logits_rows));
    nlohmann::json lanes = nlohmann::json::object();
    for (const auto& [lane, ops] : {std::pair{"gpu", &tl.gpu}, std::pair{"npu", &tl.npu}}) {
      nlohmann::json list = nlohmann::json::array();
      for (const TimedOp& op : *ops)
        list.push_back({{"name", timed_op_name(op)},
                        {"start_us", op.start_us},
                        {"end_us", op.end_us},
                        {"layer", op.layer},
                        {"tokens", op.tokens},
                        {"waited_cross", op.waited_cross}});
      lanes[lane] = std::move(list);
    }
    j["modeled"] = {{"soc", soc_->name},
                    {"plan", bucket->soc_plan.name},
                    {"step_us", tl.step_us},
                    {"summary", timeline_summary_json(tl)},
                    {"gpu", std::move(lanes["gpu"])},
                    {"npu", std::move(lanes["npu"])}};
  }
  return j;
}

}  // namespace duet::frontend
