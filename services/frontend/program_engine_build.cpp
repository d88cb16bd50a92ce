// ProgramEngine's programs (program_engine.h): which program runs each token bucket, and the
// programs themselves. Symbolic programs (core/program/symbolic.h) serve every token count up to
// their max_tokens, so buckets whose plans place every matmul alike share one program, sized for
// the largest of them; DUET_PROGRAMS=per-bucket builds one per bucket, as before.
#include <chrono>
#include <optional>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"

namespace duet::frontend {
namespace {

bool same_layer_plans(const std::vector<Plan>& a, const std::vector<Plan>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!a[i].same_placements(b[i])) return false;
  return true;
}

}  // namespace

void ProgramEngine::build_programs_and_buckets(uint32_t max_ctx, uint32_t n_pages) {
  const auto start = std::chrono::steady_clock::now();
  // What each program places, and the largest bucket it serves.
  struct Choice {
    Plan plan;
    std::vector<Plan> layers;
    uint32_t max_tokens = 0;
  };
  std::vector<Choice> choices;
  // The prefill buckets (every step's, without a decode placement), then the decode ones. A
  // program serves buckets of either phase when they place alike.
  for (const bool decode : {false, true}) {
    if (decode && !options_.decode_layer_plans_for) break;
    for (uint32_t b : options_.buckets) {
      Plan plan = options_.plan_for ? options_.plan_for(b) : Plan::fixed(options_.plan_name);
      std::vector<Plan> layers;
      if (decode)
        layers = options_.decode_layer_plans_for(b);
      else if (options_.layer_plans_for)
        layers = options_.layer_plans_for(b);
      size_t k = choices.size();
      if (!options_.per_bucket_programs)
        for (size_t j = 0; j < choices.size() && k == choices.size(); ++j)
          if (choices[j].plan.same_placements(plan) && same_layer_plans(choices[j].layers, layers))
            k = j;
      if (k == choices.size()) choices.push_back({plan, layers, b});
      choices[k].max_tokens = std::max(choices[k].max_tokens, b);
      buckets_.push_back(Bucket{b, decode, plan, k, plan, {}});
    }
  }

  auto spec_for = [&](const Plan& plan, const std::vector<Plan>& layers, uint32_t max_tokens) {
    ProgramSpec spec;
    spec.model = model_.get();
    spec.plan = plan;
    spec.layer_plans = layers;
    spec.max_tokens = max_tokens;
    spec.max_seqs = options_.max_seqs;
    spec.max_logit_rows = options_.max_seqs;
    spec.max_ctx = max_ctx;
    spec.kv_pages = n_pages;
    spec.page_tokens = options_.page_tokens;
    spec.kv_type = options_.kv_type;
    spec.kv_pages_offset = kv_->pages->page_offset(0);
    spec.name = options_.plan_name + "/" + std::to_string(max_tokens);
    spec.arena_segment = arena_name(options_.stack_id, options_.segment_tag);
    spec.kv_segment = kv_->name;
    spec.flags_segment = flags_name(options_.stack_id, options_.segment_tag);
    return spec;
  };
  for (const Choice& c : choices) {
    programs_.push_back(build_programs(spec_for(c.plan, c.layers, c.max_tokens)));
    if (!programs_.back().npu.ops.empty() && !npu_)
      throw Error(Errc::invalid_argument,
                  "plan '" + c.plan.name + "' uses the NPU but there is none");
  }
  if (soc_) {
    // The SoC's plan, when it is not the one executed, is built only to be modelled: its
    // programs are never registered with a device. The executed programs' schedules are made
    // once per program.
    std::vector<std::optional<Schedule>> executed(programs_.size());
    for (Bucket& bucket : buckets_) {
      if (options_.soc_plan_for) {
        bucket.soc_plan = options_.soc_plan_for(bucket.max_tokens);
        bucket.soc_schedule = schedule_from_programs(
            build_programs(
                spec_for(bucket.soc_plan, choices[bucket.program].layers, bucket.max_tokens)),
            bucket.soc_plan.npu_mode);
      } else {
        std::optional<Schedule>& s = executed[bucket.program];
        if (!s) s = schedule_from_programs(programs_[bucket.program], bucket.plan.npu_mode);
        bucket.soc_schedule = *s;
      }
    }
  }
  registration_.build_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace duet::frontend
