#include "puzzle/subgraph_profile.h"

#include <algorithm>
#include <functional>
#include <map>
#include <string>

#include "core/base/error.h"
#include "core/planner/profiler.h"
#include "puzzle/subgraph_plan.h"

namespace duet::puzzle {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
uint64_t combine(uint64_t a, uint64_t b) {
  return mix(a ^ mix(b + 0x632be59bd9b4e019ULL));
}

// The Merkle root of a list of hashes: pairs combined level by level, an odd one carried up.
uint64_t merkle_root(std::vector<uint64_t> level) {
  if (level.empty()) return mix(0);
  while (level.size() > 1) {
    std::vector<uint64_t> up;
    for (size_t i = 0; i + 1 < level.size(); i += 2) up.push_back(combine(level[i], level[i + 1]));
    if (level.size() % 2) up.push_back(level.back());
    level = std::move(up);
  }
  return level[0];
}

uint64_t leaf_hash(const ScheduleOp& op) {
  uint64_t h = mix(static_cast<uint64_t>(op.kind) | static_cast<uint64_t>(op.device) << 8 |
                   static_cast<uint64_t>(op.role) << 16 | static_cast<uint64_t>(op.wtype) << 24 |
                   static_cast<uint64_t>(op.npu_mode) << 32);
  for (int64_t v :
       {op.m, op.k, op.width, int64_t{op.row_begin}, int64_t{op.row_end}, int64_t{op.seq_begin},
        int64_t{op.seq_end}, int64_t{op.n_heads}, int64_t{op.n_kv_heads}, int64_t{op.head_dim}})
    h = combine(h, static_cast<uint64_t>(v));
  return h;
}

}  // namespace

size_t ModelCoster::KeyHash::operator()(const Key& k) const {
  return combine(combine(k.hash, static_cast<uint64_t>(k.n)), static_cast<uint64_t>(k.context));
}

ModelCoster::ModelCoster(const ModelShape& shape, const SocProfile& soc, int64_t context_bucket,
                         ShapeTypes types)
    : shape_(shape),
      soc_(soc),
      context_bucket_(context_bucket),
      types_(types),
      options_(solver_options_for(soc)),
      units_(unit_count(shape)) {
  if (context_bucket < 0)
    throw Error(Errc::invalid_argument, "puzzle: context_bucket must be >= 0");
  options_.soc = &soc_;
}

const Plan& ModelCoster::tensor_plan(int64_t n_tokens) {
  if (auto it = tensor_plans_.find(n_tokens); it != tensor_plans_.end()) return it->second;
  const SocModeledLatency src(soc_);
  const PlanResult r =
      solve_plan(model_weight_shapes(shape_, types_.matmul), shape_.n_layer,
                 n_tokens == 1 ? Phase::decode : Phase::prefill, n_tokens, src, options_);
  return tensor_plans_.emplace(n_tokens, r.plan).first->second;
}

const ModelCoster::Variant& ModelCoster::variant(Proc proc, int64_t n_tokens) {
  const std::pair<int, int64_t> key{static_cast<int>(proc), proc == Proc::both ? n_tokens : 0};
  if (auto it = variants_.find(key); it != variants_.end()) return it->second;
  const Plan plan = proc == Proc::gpu   ? Plan::gpu_only()
                    : proc == Proc::npu ? Plan::npu_only()
                                        : tensor_plan(n_tokens);
  return variants_.emplace(key, build_variant(plan)).first->second;
}

ModelCoster::Variant ModelCoster::build_variant(const Plan& plan) const {
  Variant v;
  v.schedule = schedule_from_shape(shape_, types_, plan);
  const int head = units_ - 1;
  std::vector<bool> seen_add(static_cast<size_t>(shape_.n_layer), false);
  for (const ScheduleOp& op : v.schedule.gpu) {
    int u = head;
    if (op.layer >= 0) {
      u = 2 * op.layer + (seen_add[op.layer] ? 1 : 0);
      if (op.kind == OpKind::Add) seen_add[op.layer] = true;
    } else if (op.kind == OpKind::Embed) {
      u = 0;
    }
    v.gpu_unit.push_back(u);
  }
  for (const ScheduleOp& op : v.schedule.npu) {
    int u = head;
    if (op.layer >= 0) {
      const bool attn = op.role == MatmulRole::q || op.role == MatmulRole::k ||
                        op.role == MatmulRole::v || op.role == MatmulRole::o;
      u = 2 * op.layer + (attn ? 0 : 1);
    }
    v.npu_unit.push_back(u);
  }
  // Each unit's first op index on each device, to write waits relative to their unit.
  std::vector<uint32_t> first[2];
  for (int d = 0; d < 2; ++d) {
    const std::vector<int>& units = d == 0 ? v.gpu_unit : v.npu_unit;
    first[d].assign(static_cast<size_t>(units_), 0);
    for (size_t i = units.size(); i-- > 0;) first[d][units[i]] = static_cast<uint32_t>(i);
  }
  // A wait on an op of an earlier unit is kept only where that unit is in the subgraph, so it is
  // hashed apart from the unit's own ops, by how far back it reaches.
  std::vector<std::vector<uint64_t>> leaves(static_cast<size_t>(units_));
  std::vector<std::map<int, std::vector<uint64_t>>> links(static_cast<size_t>(units_));
  for (int d = 0; d < 2; ++d) {
    const std::vector<ScheduleOp>& ops = d == 0 ? v.schedule.gpu : v.schedule.npu;
    const std::vector<int>& units = d == 0 ? v.gpu_unit : v.npu_unit;
    for (size_t i = 0; i < ops.size(); ++i) {
      const uint64_t pos = static_cast<uint64_t>(d) << 32 | (i - first[d][units[i]]);
      uint64_t h = combine(leaf_hash(ops[i]), pos);
      for (const OpRef& w : ops[i].waits) {
        const int wd = static_cast<int>(w.device);
        const int wu = (wd == 0 ? v.gpu_unit : v.npu_unit)[w.index];
        const uint64_t target = static_cast<uint64_t>(wd) << 32 | (w.index - first[wd][wu]);
        if (wu == units[i])
          h = combine(h, target);
        else
          links[units[i]][units[i] - wu].push_back(combine(pos, target));
      }
      leaves[units[i]].push_back(h);
    }
  }
  for (int u = 0; u < units_; ++u) {
    v.unit_hash.push_back(merkle_root(std::move(leaves[u])));
    std::vector<std::pair<int, uint64_t>> l;
    for (auto& [delta, hashes] : links[u]) l.push_back({delta, merkle_root(std::move(hashes))});
    v.unit_links.push_back(std::move(l));
  }
  // A tensor plan's hash: its placements, so two token counts with one plan share profiles.
  v.plan_hash =
      combine(mix(static_cast<uint64_t>(plan.npu_mode)), std::hash<std::string>{}(plan.name));
  for (const Placement& p : plan.matmul)
    v.plan_hash = combine(combine(combine(v.plan_hash, static_cast<uint64_t>(p.strategy)),
                                  static_cast<uint64_t>(p.gpu_rows)),
                          static_cast<uint64_t>(p.npu_tokens));
  return v;
}

uint64_t ModelCoster::subgraph_hash(int first, int last, Proc proc, int64_t n_tokens) {
  if (first < 0 || last >= units_ || last < first)
    throw Error(Errc::invalid_argument, "puzzle: subgraph [" + std::to_string(first) + ", " +
                                            std::to_string(last) + "] outside the model's " +
                                            std::to_string(units_) + " units");
  const Variant& v = variant(proc, n_tokens);
  std::vector<uint64_t> units;
  for (int u = first; u <= last; ++u) {
    uint64_t h = v.unit_hash[u];
    for (const auto& [delta, link] : v.unit_links[u])
      if (delta <= u - first) h = combine(h, combine(static_cast<uint64_t>(delta), link));
    units.push_back(h);
  }
  return combine(merkle_root(std::move(units)), v.plan_hash);
}

Schedule ModelCoster::subgraph_schedule(int first, int last, Proc proc, int64_t n_tokens) {
  (void)subgraph_hash(first, last, proc, n_tokens);  // checks the range
  const Variant& v = variant(proc, n_tokens);
  Schedule s;
  s.npu_mode = v.schedule.npu_mode;
  std::vector<int64_t> new_index[2];
  for (int d = 0; d < 2; ++d) {
    const std::vector<int>& units = d == 0 ? v.gpu_unit : v.npu_unit;
    new_index[d].assign(units.size(), -1);
    int64_t n = 0;
    for (size_t i = 0; i < units.size(); ++i)
      if (units[i] >= first && units[i] <= last) new_index[d][i] = n++;
  }
  for (int d = 0; d < 2; ++d) {
    const std::vector<ScheduleOp>& ops = d == 0 ? v.schedule.gpu : v.schedule.npu;
    std::vector<ScheduleOp>& out = d == 0 ? s.gpu : s.npu;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (new_index[d][i] < 0) continue;
      ScheduleOp op = ops[i];
      op.waits.clear();
      // A wait on an op of an earlier unit outside the subgraph is met before it starts: the
      // subgraph before it has ended (and a hand-off paid) by then.
      for (const OpRef& w : ops[i].waits) {
        const int64_t ni = new_index[static_cast<int>(w.device)][w.index];
        if (ni >= 0) op.waits.push_back({w.device, static_cast<uint32_t>(ni)});
      }
      out.push_back(std::move(op));
    }
  }
  return s;
}

int64_t ModelCoster::bucket(int64_t context) const {
  if (context_bucket_ == 0 || context == 0) return context;
  return (context + context_bucket_ - 1) / context_bucket_ * context_bucket_;
}

StageCost ModelCoster::run(const Schedule& s, int64_t n_tokens, int64_t context, Proc proc) const {
  TimelineOptions t;
  t.n_tokens = n_tokens;
  t.context = context;
  const Timeline tl = compose_timeline(s, soc_, options_, t);
  StageCost c;
  c.proc = proc;
  c.span_us = tl.step_us;
  c.gpu_us = tl.gpu_busy_us;
  c.npu_us = tl.npu_busy_us;
  for (const std::vector<TimedOp>* list : {&tl.gpu, &tl.npu})
    for (const TimedOp& op : *list) c.bytes += op.demand_gbps * op.compute_us * 1e3;
  return c;
}

StageCost ModelCoster::subgraph(int first, int last, Proc proc, int64_t n_tokens, int64_t context) {
  context = bucket(context);
  const Key key{subgraph_hash(first, last, proc, n_tokens), n_tokens, context};
  if (auto it = cache_.find(key); it != cache_.end()) {
    ++stats_.hits;
    return it->second;
  }
  ++stats_.misses;
  StageCost c = run(subgraph_schedule(first, last, proc, n_tokens), n_tokens, context, proc);
  // A tensor plan that keeps this subgraph's matmuls on the GPU leaves the NPU free.
  if (proc == Proc::both && c.npu_us == 0) c.proc = Proc::gpu;
  cache_.emplace(key, c);
  return c;
}

}  // namespace duet::puzzle
