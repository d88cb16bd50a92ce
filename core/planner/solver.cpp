#include "core/planner/solver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "core/base/error.h"
#include "core/planner/npu_timing.h"

namespace duet {
namespace {

constexpr double kActivationBytes = 2;  // fp16 activations (A16)

struct NpuCost {
  double us = 0;
  double compile_us = 0;
  std::vector<int64_t> graphs;
  int64_t padded = 0;  // tokens the graphs cover
};

OpShape op_of(const WeightShape& w, int64_t rows, int64_t tokens) {
  return OpShape{w.kind, w.wtype, rows, w.k, tokens, true};
}

std::vector<int64_t> sorted_graph_tokens(const SolverOptions& o) {
  std::vector<int64_t> s = o.npu_graph_tokens;
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  if (s.empty() || s.front() < 1)
    throw Error(Errc::invalid_argument, "solver: NPU graph token counts must be >= 1");
  return s;
}

bool is_graph_size(int64_t t, const SolverOptions& o) {
  return std::find(o.npu_graph_tokens.begin(), o.npu_graph_tokens.end(), t) !=
         o.npu_graph_tokens.end();
}

NpuCost npu_cost(const WeightShape& w, int64_t rows, int64_t tokens, NpuGraphMode mode,
                 const LatencySource& src, const SolverOptions& o) {
  NpuCost c;
  c.graphs = npu_graphs_for(tokens, mode, o);
  for (int64_t g : c.graphs) {
    c.us += src.npu_us(op_of(w, rows, g));
    c.padded += g;
  }
  if (mode == NpuGraphMode::online_prepare && !is_graph_size(tokens, o)) {
    if (!o.soc)
      throw Error(Errc::invalid_argument,
                  "solver: online-prepare needs a SoC profile for compile costs");
    c.compile_us = npu_graph_compile_us(*o.soc, op_of(w, rows, tokens));
  }
  return c;
}

double copy_us(int64_t padded_rows, int64_t k, const SolverOptions& o) {
  if (padded_rows <= 0) return 0;
  return static_cast<double>(padded_rows * k) * kActivationBytes / (o.copy_gbps * 1e3);
}

double weight_bytes(const WeightShape& w, int64_t rows) {
  return static_cast<double>(rows * w.k) * static_cast<double>(dtype_block_bytes(w.wtype)) /
         static_cast<double>(dtype_block_elems(w.wtype));
}

std::string join_graphs(const std::vector<int64_t>& graphs) {
  std::string s;
  for (int64_t g : graphs) s += (s.empty() ? "" : "+") + std::to_string(g);
  return s;
}

std::string fmt_us(double us) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f us", us);
  return buf;
}

// Small integer GPU:NPU ratios, ascending in the GPU's share, each once (2:2 is 1:1).
std::vector<std::pair<int, int>> ratio_grid(int max_term) {
  std::vector<std::pair<int, int>> out;
  for (int a = 1; a <= max_term; ++a)
    for (int b = 1; b <= max_term; ++b)
      if (std::gcd(a, b) == 1) out.emplace_back(a, b);
  std::sort(out.begin(), out.end(),
            [](auto x, auto y) { return x.first * y.second < y.first * x.second; });
  return out;
}

// Token counts the NPU can take as an activation chunk without padding, below n.
std::vector<int64_t> chunk_candidates(int64_t n, NpuGraphMode mode, const SolverOptions& o) {
  std::vector<int64_t> out;
  const std::vector<int64_t> sizes = sorted_graph_tokens(o);
  if (mode == NpuGraphMode::pipe) {
    const int64_t step = sizes.size() > 1 ? sizes[1] : sizes[0];
    for (int64_t c = step; c < n; c += step) {
      const std::vector<int64_t> g = npu_graphs_for(c, mode, o);
      if (std::accumulate(g.begin(), g.end(), int64_t{0}) == c) out.push_back(c);
    }
  } else {
    for (int64_t s : sizes)
      if (s > 1 && s < n) out.push_back(s);
  }
  return out;
}

// The whole op on the NPU under a graph mode. Under pipe it is several graphs (the runner pads the
// last): npu_only; a padding placement is one graph padded up (padding_placement).
Placement whole_npu(int64_t n, NpuGraphMode mode, const SolverOptions& o) {
  const std::vector<int64_t> g = npu_graphs_for(n, mode, o);
  const int64_t covered = std::accumulate(g.begin(), g.end(), int64_t{0});
  if (covered > n && mode == NpuGraphMode::padding) return {Strategy::padding, 0, covered};
  return {Strategy::npu_only, 0, 0};
}

// One graph padded up to the next standard size (core/program/plan.h: padding runs so under any
// plan mode); none when n is a standard size itself.
std::optional<Placement> padding_placement(int64_t n, const SolverOptions& o) {
  const std::vector<int64_t> g = npu_graphs_for(n, NpuGraphMode::padding, o);
  const int64_t covered = std::accumulate(g.begin(), g.end(), int64_t{0});
  if (covered == n) return std::nullopt;
  return Placement{Strategy::padding, 0, covered};
}

void check_weight(const WeightShape& w) {
  if (w.m <= 0 || w.k <= 0 || w.roles.empty())
    throw Error(Errc::invalid_argument,
                "solver: weight '" + w.name + "' needs m, k > 0 and a plan role");
}

}  // namespace

std::string_view phase_name(Phase p) {
  return p == Phase::prefill ? "prefill" : "decode";
}

Phase phase_from_name(std::string_view name) {
  if (name == "prefill") return Phase::prefill;
  if (name == "decode") return Phase::decode;
  throw Error(Errc::invalid_argument,
              "unknown phase '" + std::string(name) + "' (prefill or decode)");
}

SolverOptions solver_options_for(const SocProfile& soc) {
  SolverOptions o;
  if (soc.gpu.params.count("fast_sync_us")) o.sync_us = soc.gpu.param("fast_sync_us");
  if (soc.mem.single_gbps > 0) o.copy_gbps = soc.mem.single_gbps;
  o.shared_gbps = soc.mem.dual_gbps;
  o.soc = &soc;
  return o;
}

std::vector<int64_t> npu_graphs_for(int64_t tokens, NpuGraphMode mode, const SolverOptions& o) {
  if (tokens < 1) throw Error(Errc::invalid_argument, "solver: NPU token count must be >= 1");
  const std::vector<int64_t> sizes = sorted_graph_tokens(o);
  if (mode == NpuGraphMode::exact || mode == NpuGraphMode::online_prepare) return {tokens};
  std::vector<int64_t> out;
  if (mode == NpuGraphMode::padding) {
    // One padded graph; past the largest, as many of the largest as needed, the last padded.
    int64_t rem = tokens;
    while (rem > sizes.back()) {
      out.push_back(sizes.back());
      rem -= sizes.back();
    }
    out.push_back(*std::lower_bound(sizes.begin(), sizes.end(), rem));
    return out;
  }
  // Pipe: the largest graph that fits the rest; under the smallest prefill graph, the rest is
  // padded up to the smallest graph that holds it (NPU-1: it costs the same).
  const int64_t prefill_min = sizes.size() > 1 ? sizes[1] : sizes[0];
  int64_t rem = tokens;
  while (rem > 0) {
    int64_t pick;
    if (rem >= prefill_min) {
      pick = *std::prev(std::upper_bound(sizes.begin(), sizes.end(), rem));
    } else {
      pick = *std::lower_bound(sizes.begin(), sizes.end(), rem);
    }
    out.push_back(pick);
    rem -= pick;
  }
  return out;
}

OpDecision evaluate_placement(const WeightShape& w, int64_t n, const Placement& p, int ratio_gpu,
                              int ratio_npu, NpuGraphMode mode, const LatencySource& src,
                              const SolverOptions& o) {
  check_weight(w);
  if (n < 1) throw Error(Errc::invalid_argument, "solver: token count must be >= 1");
  OpDecision d;
  d.name = w.name;
  d.kind = w.kind;
  d.wtype = w.wtype;
  d.m = w.m;
  d.k = w.k;
  d.n = n;
  d.placement = p;
  d.ratio_gpu = ratio_gpu;
  d.ratio_npu = ratio_npu;
  d.t_gpu = src.gpu_us(op_of(w, w.m, n));
  d.t_npu = npu_cost(w, w.m, n, mode, src, o).us;
  const int64_t g = p.gpu_rows;
  const bool splits_rows = p.strategy == Strategy::weight_split || p.strategy == Strategy::hybrid;
  if (splits_rows && (g <= 0 || g >= w.m))
    throw Error(Errc::invalid_argument,
                "solver: " + w.name + " split needs 0 < gpu_rows < " + std::to_string(w.m));
  const std::string ratio = std::to_string(ratio_gpu) + ":" + std::to_string(ratio_npu);
  NpuCost npu;
  double gpu_weight_bytes = 0;  // weights the GPU part streams (split placements)
  int64_t npu_rows = w.m;       // rows of each NPU graph
  switch (p.strategy) {
    case Strategy::gpu_only:
      d.gpu_part_us = d.t_gpu;
      d.ratio = "GPU-only";
      break;
    case Strategy::npu_only:
      npu = npu_cost(w, w.m, n, mode, src, o);
      d.ratio = "NPU-only";
      break;
    case Strategy::padding:
      npu = npu_cost(w, w.m, n, NpuGraphMode::padding, src, o);
      d.ratio = "NPU-only";
      break;
    case Strategy::weight_split:
      d.gpu_part_us = src.gpu_us(op_of(w, g, n));
      npu = npu_cost(w, w.m - g, n, mode, src, o);
      gpu_weight_bytes = weight_bytes(w, g);
      npu_rows = w.m - g;
      d.ratio = ratio;
      break;
    case Strategy::activation_split:
      if (p.npu_tokens < 1 || p.npu_tokens >= n)
        throw Error(Errc::invalid_argument, "solver: activation split of " + w.name +
                                                " needs 0 < npu_tokens < " + std::to_string(n));
      npu = npu_cost(w, w.m, p.npu_tokens, mode, src, o);
      d.gpu_part_us = src.gpu_us(op_of(w, w.m, n - p.npu_tokens));
      gpu_weight_bytes = weight_bytes(w, w.m);
      d.ratio = "dynamic:" + join_graphs(npu.graphs);
      break;
    case Strategy::hybrid: {
      if (p.npu_tokens < 1)
        throw Error(Errc::invalid_argument,
                    "solver: hybrid split of " + w.name + " needs npu_tokens");
      const int64_t chunk = std::min(p.npu_tokens, n);
      npu = npu_cost(w, w.m - g, chunk, mode, src, o);
      // The GPU runs its rows of the NPU's chunk, then every row of the ragged rest, in order.
      d.gpu_part_us =
          src.gpu_us(op_of(w, g, chunk)) + (n > chunk ? src.gpu_us(op_of(w, w.m, n - chunk)) : 0.0);
      gpu_weight_bytes = weight_bytes(w, g) + (n > chunk ? weight_bytes(w, w.m) : 0.0);
      npu_rows = w.m - g;
      d.ratio = ratio + " (weight)" + (p.npu_tokens < n ? " dynamic:" : " graphs:") +
                join_graphs(npu.graphs);
      break;
    }
  }
  if (p.strategy == Strategy::gpu_only) {
    d.chosen_us = d.t_gpu;
  } else {
    d.npu_part_us = npu.us;
    d.sync_us = o.sync_us;
    d.compile_us = npu.compile_us;
    const int64_t npu_tokens =
        p.strategy == Strategy::activation_split || p.strategy == Strategy::hybrid
            ? std::min(p.npu_tokens, n)
            : n;
    d.copy_us = copy_us(npu.padded - npu_tokens, w.k, o);
    const bool both_devices = d.gpu_part_us > 0;
    if (both_devices && o.shared_gbps > 0) {
      // Every NPU graph streams its rows of the weight again; activations are small beside them.
      const double bytes = gpu_weight_bytes +
                           weight_bytes(w, npu_rows) * static_cast<double>(npu.graphs.size()) +
                           static_cast<double>((n + npu.padded) * w.k) * kActivationBytes;
      d.shared_bw_us = bytes / (o.shared_gbps * 1e3);
    }
    if (both_devices) d.contention_us = o.contention * std::min(d.gpu_part_us, d.npu_part_us);
    d.chosen_us = std::max({d.gpu_part_us, d.npu_part_us, d.shared_bw_us}) + d.contention_us +
                  d.sync_us + d.copy_us;
  }
  return d;
}

OpDecision solve_op(const WeightShape& w, int64_t n, NpuGraphMode mode, const LatencySource& src,
                    const SolverOptions& o) {
  check_weight(w);
  std::vector<OpDecision> tried;
  tried.push_back(evaluate_placement(w, n, {Strategy::gpu_only, 0, 0}, 0, 0, mode, src, o));
  tried.push_back(evaluate_placement(w, n, whole_npu(n, mode, o), 0, 0, mode, src, o));
  if (mode != NpuGraphMode::padding)
    if (const auto pad = padding_placement(n, o))
      tried.push_back(evaluate_placement(w, n, *pad, 0, 0, mode, src, o));
  // Split rows in NPU tiles; a fused weight (gate+up) splits each of its parts alike.
  const int64_t align = o.row_align * static_cast<int64_t>(w.roles.size());
  const std::vector<int64_t> chunks = chunk_candidates(n, mode, o);
  const std::vector<int64_t> all_graphs = npu_graphs_for(n, mode, o);
  const int64_t covered = std::accumulate(all_graphs.begin(), all_graphs.end(), int64_t{0});
  for (auto [a, b] : ratio_grid(o.max_ratio_term)) {
    const int64_t g =
        std::llround(static_cast<double>(w.m) * a / (a + b) / static_cast<double>(align)) * align;
    if (g <= 0 || g >= w.m) continue;
    // A weight split whose NPU part needs padding or several graphs is HeteroInfer's hybrid:
    // activation-centric chunks (with padding) plus a weight-centric split.
    if (all_graphs.size() > 1 || covered > n)
      tried.push_back(evaluate_placement(w, n, {Strategy::hybrid, g, covered}, a, b, mode, src, o));
    else
      tried.push_back(evaluate_placement(w, n, {Strategy::weight_split, g, 0}, a, b, mode, src, o));
    for (int64_t c : chunks)
      tried.push_back(evaluate_placement(w, n, {Strategy::hybrid, g, c}, a, b, mode, src, o));
  }
  for (int64_t c : chunks)
    tried.push_back(
        evaluate_placement(w, n, {Strategy::activation_split, 0, c}, 0, 0, mode, src, o));

  // Earlier candidates are simpler: a later one must be strictly better to win.
  size_t best = 0;
  for (size_t i = 1; i < tried.size(); ++i)
    if (tried[i].chosen_us < tried[best].chosen_us * (1 - 1e-9)) best = i;
  OpDecision d = tried[best];
  const OpDecision* runner_up = nullptr;
  for (const OpDecision& t : tried)
    if (t.placement.strategy != d.placement.strategy &&
        (!runner_up || t.chosen_us < runner_up->chosen_us))
      runner_up = &t;
  double best_npu_us = tried[1].chosen_us;
  for (const OpDecision& t : tried)
    if (t.placement.strategy == Strategy::npu_only || t.placement.strategy == Strategy::padding)
      best_npu_us = std::min(best_npu_us, t.chosen_us);
  // The objective's terms: the chosen placement's, then the two single-device ones.
  std::string terms;
  if (d.placement.strategy == Strategy::gpu_only) {
    terms = "T_gpu(all) " + fmt_us(d.t_gpu);
  } else {
    terms = "max(T_gpu(p1) " + fmt_us(d.gpu_part_us) + ", T_npu(p2) " + fmt_us(d.npu_part_us) +
            (d.shared_bw_us > 0 ? ", shared bandwidth " + fmt_us(d.shared_bw_us) : "") + ")" +
            (d.contention_us > 0 ? " + contention " + fmt_us(d.contention_us) : "") + " + T_sync " +
            fmt_us(d.sync_us) + " + T_copy " + fmt_us(d.copy_us) + " = " + fmt_us(d.chosen_us);
  }
  d.why = "least of " + std::to_string(tried.size()) + " placements: " + terms +
          "; single devices: T_gpu(all) " + fmt_us(tried[0].chosen_us) +
          ", T_npu(all) + T_sync + T_copy " + fmt_us(best_npu_us);
  if (runner_up) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%+.1f%%", 100.0 * (runner_up->chosen_us / d.chosen_us - 1));
    d.why += "; next best " + std::string(strategy_name(runner_up->placement.strategy)) + " " +
             runner_up->ratio + " " + fmt_us(runner_up->chosen_us) + " (" + pct + ")";
  }
  return d;
}

namespace {

PlanResult assemble(std::string name, NpuGraphMode mode, Phase phase, int64_t n, int n_layer,
                    const std::vector<WeightShape>& weights, std::vector<OpDecision> ops) {
  PlanResult r;
  r.plan.name = std::move(name);
  r.plan.npu_mode = mode;
  r.phase = phase;
  r.n_tokens = n;
  r.n_layer = n_layer;
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> compiled;  // kind, m, k, n
  for (size_t i = 0; i < weights.size(); ++i) {
    const WeightShape& w = weights[i];
    const OpDecision& d = ops[i];
    for (MatmulRole role : w.roles) {
      Placement p = d.placement;
      p.gpu_rows /= static_cast<int64_t>(w.roles.size());  // fused weights split each part alike
      r.plan.at(role) = p;
    }
    if (w.kind == OpKind::Logits)
      r.total_us += d.chosen_us;
    else
      r.layer_us += d.chosen_us;
    if (d.compile_us > 0 && compiled.insert({static_cast<int>(d.kind), d.m, d.k, d.n}).second)
      r.compile_us += d.compile_us;
  }
  r.total_us += r.layer_us * n_layer + r.compile_us;
  r.ops = std::move(ops);
  return r;
}

int64_t tokens_for(const WeightShape& w, int64_t n) {
  return w.kind == OpKind::Logits ? 1 : n;
}

void check_request(const std::vector<WeightShape>& weights, int n_layer, Phase phase, int64_t n) {
  if (weights.empty()) throw Error(Errc::invalid_argument, "solver: no weights to place");
  if (n_layer < 1) throw Error(Errc::invalid_argument, "solver: n_layer must be >= 1");
  if (n < 1) throw Error(Errc::invalid_argument, "solver: token count must be >= 1");
  if (phase == Phase::decode && n != 1)
    throw Error(Errc::invalid_argument,
                "solver: decode is one token per step, not " + std::to_string(n));
}

}  // namespace

PlanResult solve_plan(const std::vector<WeightShape>& weights, int n_layer, Phase phase, int64_t n,
                      const LatencySource& src, const SolverOptions& o) {
  check_request(weights, n_layer, phase, n);
  PlanResult best;
  bool have = false;
  if (o.modes.empty()) throw Error(Errc::invalid_argument, "solver: no NPU graph modes to try");
  for (NpuGraphMode mode : o.modes) {
    std::vector<OpDecision> ops;
    for (const WeightShape& w : weights) ops.push_back(solve_op(w, tokens_for(w, n), mode, src, o));
    PlanResult r = assemble("tensor", mode, phase, n, n_layer, weights, std::move(ops));
    if (!have || r.total_us < best.total_us * (1 - 1e-9)) {
      best = std::move(r);
      have = true;
    }
  }
  return best;
}

std::vector<std::string> baseline_names() {
  return {"gpu-only", "npu-only", "online-prepare", "npu-pipe", "layer"};
}

PlanResult baseline_plan(std::string_view name, const std::vector<WeightShape>& weights,
                         int n_layer, Phase phase, int64_t n, const LatencySource& src,
                         const SolverOptions& o) {
  check_request(weights, n_layer, phase, n);
  bool on_gpu = false;
  NpuGraphMode mode = NpuGraphMode::padding;
  if (name == "gpu-only")
    on_gpu = true;
  else if (name == "npu-only")
    mode = NpuGraphMode::padding;
  else if (name == "online-prepare")
    mode = NpuGraphMode::online_prepare;
  else if (name == "npu-pipe")
    mode = NpuGraphMode::pipe;
  else if (name == "layer")
    on_gpu = phase == Phase::decode;
  else
    throw Error(Errc::invalid_argument, "unknown baseline '" + std::string(name) + "'");
  std::vector<OpDecision> ops;
  for (const WeightShape& w : weights) {
    const int64_t t = tokens_for(w, n);
    const Placement p = on_gpu ? Placement{Strategy::gpu_only, 0, 0} : whole_npu(t, mode, o);
    OpDecision d = evaluate_placement(w, t, p, 0, 0, mode, src, o);
    d.why = "baseline " + std::string(name);
    ops.push_back(std::move(d));
  }
  return assemble(std::string(name), mode, phase, n, n_layer, weights, std::move(ops));
}

nlohmann::json plan_to_json(const PlanResult& r) {
  nlohmann::json matmul = nlohmann::json::object();
  for (int i = 0; i < kMatmulRoles; ++i) {
    const Placement& p = r.plan.matmul[i];
    matmul[std::string(matmul_role_name(static_cast<MatmulRole>(i)))] = {
        {"strategy", strategy_name(p.strategy)},
        {"gpu_rows", p.gpu_rows},
        {"npu_tokens", p.npu_tokens}};
  }
  nlohmann::json rows = nlohmann::json::array();
  for (const OpDecision& d : r.ops)
    rows.push_back({{"weight", d.name},
                    {"kind", op_kind_name(d.kind)},
                    {"wtype", dtype_name(d.wtype)},
                    {"weight_shape", {d.m, d.k}},
                    {"activation_shape", {d.k, d.n}},
                    {"t_gpu_us", d.t_gpu},
                    {"t_npu_us", d.t_npu},
                    {"strategy", strategy_name(d.placement.strategy)},
                    {"ratio", d.ratio},
                    {"gpu_rows", d.placement.gpu_rows},
                    {"npu_tokens", d.placement.npu_tokens},
                    {"gpu_part_us", d.gpu_part_us},
                    {"npu_part_us", d.npu_part_us},
                    {"sync_us", d.sync_us},
                    {"copy_us", d.copy_us},
                    {"shared_bw_us", d.shared_bw_us},
                    {"contention_us", d.contention_us},
                    {"compile_us", d.compile_us},
                    {"chosen_us", d.chosen_us},
                    {"why", d.why}});
  return {{"name", r.plan.name},
          {"npu_mode", npu_graph_mode_name(r.plan.npu_mode)},
          {"phase", phase_name(r.phase)},
          {"n_tokens", r.n_tokens},
          {"n_layer", r.n_layer},
          {"layer_us", r.layer_us},
          {"compile_us", r.compile_us},
          {"total_us", r.total_us},
          {"matmul", matmul},
          {"rows", rows}};
}

Plan plan_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error(Errc::bad_format, "plan JSON: not an object");
  Plan plan;
  try {
    plan.name = j.at("name").get<std::string>();
    const std::string mode = j.at("npu_mode").get<std::string>();
    bool found = false;
    for (NpuGraphMode m : {NpuGraphMode::exact, NpuGraphMode::padding, NpuGraphMode::online_prepare,
                           NpuGraphMode::pipe})
      if (npu_graph_mode_name(m) == mode) {
        plan.npu_mode = m;
        found = true;
      }
    if (!found) throw Error(Errc::bad_format, "plan JSON: unknown npu_mode '" + mode + "'");
    const nlohmann::json& mm = j.at("matmul");
    for (int i = 0; i < kMatmulRoles; ++i) {
      const std::string role(matmul_role_name(static_cast<MatmulRole>(i)));
      if (!mm.contains(role))
        throw Error(Errc::bad_format, "plan JSON: matmul." + role + " is missing");
      const nlohmann::json& pj = mm.at(role);
      Placement& p = plan.matmul[i];
      try {
        p.strategy = strategy_from_name(pj.at("strategy").get<std::string>());
      } catch (const Error& e) {
        throw Error(Errc::bad_format, "plan JSON: matmul." + role + ": " + e.what());
      }
      p.gpu_rows = pj.at("gpu_rows").get<int64_t>();
      p.npu_tokens = pj.at("npu_tokens").get<int64_t>();
      if (p.gpu_rows < 0 || p.npu_tokens < 0)
        throw Error(Errc::bad_format,
                    "plan JSON: matmul." + role + " has a negative gpu_rows or npu_tokens");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::bad_format, std::string("plan JSON: ") + e.what());
  }
  return plan;
}

}  // namespace duet
