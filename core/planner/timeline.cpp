#include "core/planner/timeline.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "core/base/error.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"

namespace duet {
namespace {

constexpr double kActivationBytes = 2;  // fp16 activations (A16)

// The arena slots and KV of core/program/program_builder.cpp, as hazard keys.
enum Tensor : uint64_t { tokens = 0, page_tables, x, xn, q, k, v, attn, tmp, gate, up, logits };
constexpr uint64_t kKvKey = 1000;

// The builder's hazard rule: an op waits for the other device's last writers of what it reads
// or writes, and for the other device's readers (since those writers) of what it writes.
class ShapeScheduleBuilder {
 public:
  ShapeScheduleBuilder(const ModelShape& s, const ShapeTypes& t, const Plan& p)
      : shape_(s), types_(t), plan_(p) {}

  Schedule build();

 private:
  struct Pending {
    ScheduleOp op;
    std::vector<uint32_t> waits;  // global ids
  };
  struct Access {
    Device device;
    uint32_t id;
  };

  void emit(std::vector<ScheduleOp> group, const std::vector<uint64_t>& reads,
            const std::vector<uint64_t>& writes) {
    std::vector<Access> writers;
    for (ScheduleOp& op : group) {
      std::vector<uint32_t> waits;
      auto add_other = [&](const std::vector<Access>& list) {
        for (const Access& a : list)
          if (a.device != op.device) waits.push_back(a.id);
      };
      for (uint64_t t : reads)
        if (auto it = writers_.find(t); it != writers_.end()) add_other(it->second);
      for (uint64_t t : writes) {
        if (auto it = writers_.find(t); it != writers_.end()) add_other(it->second);
        if (auto it = readers_.find(t); it != readers_.end()) add_other(it->second);
      }
      std::sort(waits.begin(), waits.end());
      waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
      const uint32_t id = static_cast<uint32_t>(ops_.size());
      writers.push_back({op.device, id});
      ops_.push_back({std::move(op), std::move(waits)});
    }
    for (const Access& w : writers)
      for (uint64_t t : reads) readers_[t].push_back(w);
    for (uint64_t t : writes) {
      writers_[t] = writers;
      readers_[t].clear();
    }
  }

  ScheduleOp base(OpKind kind, int layer, int64_t width) const {
    ScheduleOp op;
    op.kind = kind;
    op.layer = layer;
    op.width = width;
    return op;
  }
  void heads(ScheduleOp& op) const {
    op.n_heads = shape_.n_head;
    op.n_kv_heads = shape_.n_head_kv;
    op.head_dim = shape_.n_embd / shape_.n_head;
  }
  void simple(ScheduleOp op, const std::vector<uint64_t>& reads,
              const std::vector<uint64_t>& writes) {
    emit({std::move(op)}, reads, writes);
  }
  void matmul(MatmulRole role, int layer, DType wtype, int64_t rows, int64_t cols, uint64_t in,
              uint64_t out);

  const ModelShape& shape_;
  const ShapeTypes& types_;
  const Plan& plan_;
  std::vector<Pending> ops_;
  std::map<uint64_t, std::vector<Access>> writers_, readers_;
};

void ShapeScheduleBuilder::matmul(MatmulRole role, int layer, DType wtype, int64_t rows_i,
                                  int64_t cols, uint64_t in, uint64_t out) {
  const Placement& p = plan_.at(role);
  const uint32_t rows = static_cast<uint32_t>(rows_i);
  auto make = [&](Device d, uint32_t rb, uint32_t re, uint32_t sb, uint32_t se) {
    ScheduleOp op = base(role == MatmulRole::logits ? OpKind::Logits : OpKind::MatMul, layer, cols);
    op.device = d;
    op.role = role;
    op.wtype = wtype;
    op.m = rows_i;
    op.k = cols;
    op.row_begin = rb;
    op.row_end = re;
    op.seq_begin = sb;
    op.seq_end = se;
    op.npu_mode = p.strategy == Strategy::padding ? NpuGraphMode::padding : plan_.npu_mode;
    return op;
  };
  const uint32_t gpu_rows = static_cast<uint32_t>(std::clamp<int64_t>(p.gpu_rows, 0, rows));
  const uint32_t npu_tokens = static_cast<uint32_t>(std::max<int64_t>(p.npu_tokens, 0));
  std::vector<ScheduleOp> g;
  switch (p.strategy) {
    case Strategy::gpu_only:
      g.push_back(make(Device::gpu, 0, rows, 0, 0));
      break;
    case Strategy::npu_only:
    case Strategy::padding:
      g.push_back(make(Device::npu, 0, rows, 0, 0));
      break;
    case Strategy::weight_split:
      if (gpu_rows > 0) g.push_back(make(Device::gpu, 0, gpu_rows, 0, 0));
      if (gpu_rows < rows) g.push_back(make(Device::npu, gpu_rows, rows, 0, 0));
      break;
    case Strategy::activation_split:
      if (npu_tokens == 0) {
        g.push_back(make(Device::gpu, 0, rows, 0, 0));
      } else {
        g.push_back(make(Device::npu, 0, rows, 0, npu_tokens));
        g.push_back(make(Device::gpu, 0, rows, npu_tokens, 0));
      }
      break;
    case Strategy::hybrid:
      if (gpu_rows > 0) g.push_back(make(Device::gpu, 0, gpu_rows, 0, npu_tokens));
      if (gpu_rows < rows) g.push_back(make(Device::npu, gpu_rows, rows, 0, npu_tokens));
      g.push_back(make(Device::gpu, 0, rows, npu_tokens, 0));
      break;
  }
  emit(std::move(g), {in}, {out});
}

Schedule ShapeScheduleBuilder::build() {
  const int64_t embd = shape_.n_embd, head_dim = shape_.n_embd / shape_.n_head;
  const int64_t qdim = shape_.n_head * head_dim, kv_dim = shape_.n_head_kv * head_dim;
  const int64_t ff = shape_.n_ff;
  {
    ScheduleOp op = base(OpKind::Embed, -1, embd);
    op.wtype = types_.embed;
    op.m = shape_.n_vocab;
    op.k = embd;
    simple(std::move(op), {tokens}, {x});
  }
  auto rmsnorm = [&](int layer, uint64_t in, uint64_t dst) {
    ScheduleOp op = base(OpKind::RmsNorm, layer, embd);
    heads(op);
    simple(std::move(op), {in}, {dst});
  };
  auto add = [&](int layer) { simple(base(OpKind::Add, layer, embd), {x, tmp}, {x}); };
  for (int l = 0; l < shape_.n_layer; ++l) {
    const uint64_t kv = kKvKey + static_cast<uint64_t>(l);
    rmsnorm(l, x, xn);
    matmul(MatmulRole::q, l, types_.matmul, qdim, embd, xn, q);
    matmul(MatmulRole::k, l, types_.matmul, kv_dim, embd, xn, k);
    matmul(MatmulRole::v, l, types_.matmul, kv_dim, embd, xn, v);
    for (uint64_t t : {uint64_t{q}, uint64_t{k}}) {
      ScheduleOp op = base(OpKind::Rope, l, t == q ? qdim : kv_dim);
      heads(op);
      if (t == k) op.n_heads = shape_.n_head_kv;
      simple(std::move(op), {t, tokens}, {t});
    }
    {
      ScheduleOp op = base(OpKind::KvWrite, l, kv_dim);
      heads(op);
      simple(std::move(op), {k, v, tokens, page_tables}, {kv});
    }
    {
      ScheduleOp op = base(OpKind::Attention, l, qdim);
      heads(op);
      simple(std::move(op), {q, kv, tokens, page_tables}, {attn});
    }
    matmul(MatmulRole::o, l, types_.matmul, embd, qdim, attn, tmp);
    add(l);
    rmsnorm(l, x, xn);
    matmul(MatmulRole::gate, l, types_.matmul, ff, embd, xn, gate);
    matmul(MatmulRole::up, l, types_.matmul, ff, embd, xn, up);
    simple(base(OpKind::SwiGlu, l, ff), {gate, up}, {gate});
    matmul(MatmulRole::down, l, types_.matmul, embd, ff, gate, tmp);
    add(l);
  }
  rmsnorm(-1, x, xn);
  matmul(MatmulRole::logits, -1, shape_.tied_embeddings ? types_.embed : types_.output,
         shape_.n_vocab, embd, xn, logits);

  Schedule s;
  s.npu_mode = plan_.npu_mode;
  std::vector<OpRef> ref_of;
  for (Pending& p : ops_) {
    std::vector<ScheduleOp>& list = p.op.device == Device::gpu ? s.gpu : s.npu;
    ref_of.push_back({p.op.device, static_cast<uint32_t>(list.size())});
    for (uint32_t w : p.waits) p.op.waits.push_back(ref_of[w]);
    list.push_back(std::move(p.op));
  }
  return s;
}

double bytes_per_weight(DType t) {
  return static_cast<double>(dtype_block_bytes(t)) / static_cast<double>(dtype_block_elems(t));
}

// What one op costs this step, before it is placed.
struct OpCost {
  int64_t tokens = 0;
  double compute_us = 0, copy_us = 0, compile_us = 0;
  double demand_gbps = 0;  // DRAM bandwidth the op draws while it runs
};

class OpCoster {
 public:
  // Each op carries its own NPU graph mode (a padding placement pads under any plan mode), so
  // the coster needs no schedule-wide state.
  OpCoster(const SocProfile& soc, const SolverOptions& o, const TimelineOptions& t)
      : soc_(soc), o_(o), t_(t) {
    graph_sizes_.insert(o.npu_graph_tokens.begin(), o.npu_graph_tokens.end());
  }

  int64_t tokens(const ScheduleOp& op) const {
    const int64_t total = op.kind == OpKind::Logits ? t_.logits_rows : t_.n_tokens;
    const int64_t end = op.seq_end ? std::min<int64_t>(op.seq_end, total) : total;
    return std::max<int64_t>(0, end - static_cast<int64_t>(op.seq_begin));
  }

  OpCost cost(const ScheduleOp& op) {
    OpCost c;
    c.tokens = tokens(op);
    if (c.tokens == 0) return c;
    const bool matmul = op.kind == OpKind::MatMul || op.kind == OpKind::Logits;
    const int64_t rows = matmul ? static_cast<int64_t>(op.row_end) - op.row_begin : 0;
    if (matmul && rows <= 0) return c;
    if (op.device == Device::npu) {
      if (!matmul)
        throw Error(Errc::unsupported, "timeline: " + op_kind_name(op.kind) + " on the NPU");
      npu(op, rows, c);
      return c;
    }
    OpShape shape{op.kind, op.wtype, rows, op.k, c.tokens, true};
    const double t = static_cast<double>(c.tokens);
    double bytes = 0;  // DRAM traffic, for the shared-bandwidth demand
    switch (op.kind) {
      case OpKind::MatMul:
      case OpKind::Logits:
        bytes = rows * op.k * bytes_per_weight(op.wtype) + t * (op.k + rows) * kActivationBytes;
        break;
      case OpKind::Attention: {
        // A causal kernel: query i of the step sees the cached context plus i + 1 positions.
        const double keys = static_cast<double>(t_.context) + (t + 1) / 2.0;
        shape = {op.kind,  DType::F16, op.width, static_cast<int64_t>(std::ceil(keys)),
                 c.tokens, true};
        bytes = 2.0 * keys * op.width * kActivationBytes + 2.0 * t * op.width * kActivationBytes;
        break;
      }
      case OpKind::Embed:
        shape = {op.kind, op.wtype, op.k, op.k, c.tokens, true};
        bytes = t * op.k * (bytes_per_weight(op.wtype) + kActivationBytes);
        break;
      default: {
        shape = {op.kind, DType::F16, op.width, op.width, c.tokens, true};
        const double arrays = (op.kind == OpKind::SwiGlu || op.kind == OpKind::Add) ? 3.0
                              : op.kind == OpKind::KvWrite                          ? 4.0
                                                                                    : 2.0;
        bytes = arrays * t * op.width * kActivationBytes;
        break;
      }
    }
    const bool matmul_op = op.kind == OpKind::MatMul || op.kind == OpKind::Logits;
    c.compute_us = matmul_op && t_.matmul_latency ? t_.matmul_latency->gpu_us(shape)
                   : t_.sync == SyncMode::fast    ? gpu_pipelined_us(soc_, shape)
                                                  : gpu_modeled_us(soc_, shape);
    c.demand_gbps = c.compute_us > 0 ? bytes / c.compute_us / 1e3 : 0;
    return c;
  }

 private:
  void npu(const ScheduleOp& op, int64_t rows, OpCost& c) {
    int64_t padded = 0;
    double bytes = 0;
    for (int64_t g : npu_graphs_for(c.tokens, op.npu_mode, o_)) {
      const OpShape graph{op.kind, op.wtype, rows, op.k, g, true};
      const NpuTiming nt = npu_timing(soc_, graph);
      const int64_t real = std::clamp<int64_t>(c.tokens - padded, 0, g);  // rows with data
      c.compute_us += t_.matmul_latency           ? t_.matmul_latency->npu_us(graph)
                      : t_.sync == SyncMode::fast ? npu_pipelined_us(soc_, graph)
                                                  : nt.total_us;  // blocking: isolated
      if (!t_.matmul_latency)  // in a step the activations cross between the devices
        c.compute_us +=
            npu_activation_io_us(soc_, {graph.kind, graph.wtype, rows, op.k, real, true});
      bytes += nt.dma_bytes;
      padded += g;
    }
    c.demand_gbps = c.compute_us > 0 ? bytes / c.compute_us / 1e3 : 0;
    if (padded > c.tokens)
      c.copy_us =
          static_cast<double>((padded - c.tokens) * op.k) * kActivationBytes / (o_.copy_gbps * 1e3);
    if (op.npu_mode == NpuGraphMode::online_prepare && !graph_sizes_.count(c.tokens) &&
        compiled_.insert({static_cast<int>(op.kind), rows, op.k, c.tokens}).second) {
      if (!o_.soc)
        throw Error(Errc::invalid_argument, "timeline: online-prepare needs a SoC profile");
      c.compile_us =
          npu_graph_compile_us(*o_.soc, OpShape{op.kind, op.wtype, rows, op.k, c.tokens, true});
    }
  }

  const SocProfile& soc_;
  const SolverOptions& o_;
  const TimelineOptions& t_;
  std::set<int64_t> graph_sizes_;
  std::set<std::tuple<int, int64_t, int64_t, int64_t>> compiled_;
};

}  // namespace

Schedule schedule_from_shape(const ModelShape& shape, const ShapeTypes& types, const Plan& plan) {
  if (shape.n_layer < 1 || shape.n_embd < 1 || shape.n_head < 1 || shape.n_head_kv < 1 ||
      shape.n_ff < 1 || shape.n_vocab < 1 || shape.n_embd % shape.n_head != 0)
    throw Error(Errc::invalid_argument, "schedule_from_shape: shape '" + shape.name +
                                            "' has a non-positive or inconsistent dimension");
  return ShapeScheduleBuilder(shape, types, plan).build();
}

Schedule schedule_from_programs(const BuiltPrograms& built, NpuGraphMode npu_mode) {
  Schedule s;
  s.npu_mode = npu_mode;
  std::map<uint32_t, OpRef> publisher;
  for (Device d : {Device::gpu, Device::npu}) {
    const fb::ProgramT& prog = d == Device::gpu ? built.gpu : built.npu;
    for (size_t i = 0; i < prog.ops.size(); ++i)
      if (prog.ops[i]->publish_flag >= 0)
        publisher[static_cast<uint32_t>(prog.ops[i]->publish_flag)] = {d, static_cast<uint32_t>(i)};
  }
  for (Device d : {Device::gpu, Device::npu}) {
    const fb::ProgramT& prog = d == Device::gpu ? built.gpu : built.npu;
    std::vector<ScheduleOp>& list = d == Device::gpu ? s.gpu : s.npu;
    for (const auto& p : prog.ops) {
      ScheduleOp op;
      op.kind = static_cast<OpKind>(p->kind);
      op.device = d;
      op.layer = p->layer;
      const bool weighted =
          op.kind == OpKind::MatMul || op.kind == OpKind::Logits || op.kind == OpKind::Embed;
      if (op.kind == OpKind::MatMul || op.kind == OpKind::Logits)
        op.role = static_cast<MatmulRole>(p->role);
      if (weighted && p->weight) {
        op.wtype = static_cast<DType>(p->weight->dtype());
        op.m = p->weight->rows();
        op.k = p->weight->cols();
      }
      if (p->in0)
        op.width = p->in0->cols();
      else if (p->out)
        op.width = p->out->cols();
      op.row_begin = p->row_begin;
      op.row_end = p->row_end;
      op.seq_begin = p->seq_begin;
      op.seq_end = p->seq_end;
      op.npu_mode = static_cast<NpuGraphMode>(p->npu_mode);
      op.n_heads = p->n_heads;
      op.n_kv_heads = p->n_kv_heads;
      op.head_dim = p->head_dim;
      for (uint32_t f : p->wait_flags) {
        auto it = publisher.find(f);
        if (it == publisher.end() || it->second.device == d)
          throw Error(Errc::invalid_argument, prog.name + ": op waits on flag " +
                                                  std::to_string(f) +
                                                  " that no op of the other device publishes");
        op.waits.push_back(it->second);
      }
      list.push_back(std::move(op));
    }
  }
  return s;
}

double handoff_us(const SocProfile& soc, const SolverOptions& o, const TimelineOptions& t) {
  return t.sync == SyncMode::fast ? o.sync_us : gpu_sync_us(soc);
}

Timeline compose_timeline(const Schedule& s, const SocProfile& soc, const SolverOptions& o,
                          const TimelineOptions& t) {
  if (t.n_tokens < 1 || t.context < 0 || t.logits_rows < 1)
    throw Error(Errc::invalid_argument,
                "timeline: n_tokens and logits_rows must be >= 1 and context >= 0");
  Timeline tl;
  OpCoster coster(soc, o, t);
  const bool contend = t.contention && (soc.mem.dual_gbps > 0 || soc.mem.shared_cores > 0);
  const double sync_us = handoff_us(soc, o, t);
  // A host profile's idle time between two ops of a device's stream (0 on the SoC files).
  const double beyond_first = static_cast<double>(t.n_tokens - 1);
  const double gap_us[2] = {soc.gpu.param_or("op_gap_us", 0.0) +
                                soc.gpu.param_or("op_gap_us_per_token", 0.0) * beyond_first,
                            soc.npu.op_gap_us + soc.npu.op_gap_us_per_token * beyond_first};
  // Blocking sync: the host waits in clFinish after a GPU op the NPU needs, and submits nothing
  // meanwhile, so the GPU's next op waits for that too.
  std::set<uint32_t> gpu_published;
  for (Device d : {Device::gpu, Device::npu})
    for (const ScheduleOp& op : s.on(d)) {
      tl.cross_edges += static_cast<int>(op.waits.size());
      for (const OpRef& w : op.waits)
        if (w.device == Device::gpu) gpu_published.insert(w.index);
    }
  size_t next[2] = {0, 0};
  auto placed = [&](Device d) -> std::vector<TimedOp>& {
    return d == Device::gpu ? tl.gpu : tl.npu;
  };
  auto ready_at = [&](Device d, double* at, OpRef* pred, bool* cross) {
    const ScheduleOp& op = s.on(d)[next[static_cast<int>(d)]];
    std::vector<TimedOp>& mine = placed(d);
    *at = 0;
    *pred = {d, static_cast<uint32_t>(mine.size())};
    *cross = false;
    if (!mine.empty()) {
      *at = mine.back().end_us;
      if (t.sync == SyncMode::blocking && d == Device::gpu &&
          gpu_published.count(mine.back().ref.index))
        *at += sync_us;
      *pred = mine.back().ref;
    }
    for (const OpRef& w : op.waits) {
      const std::vector<TimedOp>& other = placed(w.device);
      if (w.device == d)
        throw Error(Errc::invalid_argument, "timeline: an op waits on its own device");
      if (w.index >= other.size()) return false;
      const double ready = other[w.index].end_us + sync_us;
      if (ready > *at) {
        *at = ready;
        *pred = w;
        *cross = true;
      }
    }
    return true;
  };

  while (next[0] < s.gpu.size() || next[1] < s.npu.size()) {
    bool have = false;
    Device pick = Device::gpu;
    double start = 0;
    OpRef pred;
    bool cross = false;
    for (Device d : {Device::gpu, Device::npu}) {
      if (next[static_cast<int>(d)] >= s.on(d).size()) continue;
      double at;
      OpRef p;
      bool c;
      if (!ready_at(d, &at, &p, &c)) continue;
      if (!have || at < start) {
        have = true;
        pick = d;
        start = at;
        pred = p;
        cross = c;
      }
    }
    if (!have)
      throw Error(Errc::invalid_argument, "timeline: the schedule deadlocks (circular waits)");
    const ScheduleOp& op = s.on(pick)[next[static_cast<int>(pick)]];
    const OpCost c = coster.cost(op);
    TimedOp timed;
    timed.ref = {pick, static_cast<uint32_t>(next[static_cast<int>(pick)])};
    timed.kind = op.kind;
    timed.role = op.role;
    timed.layer = op.layer;
    timed.tokens = c.tokens;
    timed.compute_us = c.compute_us;
    timed.copy_us = c.copy_us;
    timed.compile_us = c.compile_us;
    timed.demand_gbps = c.demand_gbps;
    timed.waited_cross = cross;
    timed.pred = pred;
    timed.start_us = start;
    timed.gap_us = c.tokens > 0 ? gap_us[static_cast<int>(pick)] : 0.0;
    double dur = c.compute_us + c.copy_us + c.compile_us + timed.gap_us;
    if (contend && (timed.demand_gbps > 0 || soc.mem.shared_cores > 0)) {
      // Where the other device's ops overlap this one and the two draw more than dual_gbps,
      // both run at dual / (sum of demands); on a host whose devices share the CPU cores they
      // take turns on them (mem.shared_cores); this op absorbs the time lost.
      const std::vector<TimedOp>& other = placed(pick == Device::gpu ? Device::npu : Device::gpu);
      for (size_t i = other.size(); i-- > 0 && other[i].end_us > start;) {
        const double demand = timed.demand_gbps + other[i].demand_gbps;
        const double bandwidth = soc.mem.dual_gbps > 0 && demand > soc.mem.dual_gbps
                                     ? 1.0 - soc.mem.dual_gbps / demand
                                     : 0.0;
        const double lost = std::max(bandwidth, soc.mem.shared_cores);
        const double overlap =
            std::min(other[i].end_us, start + dur) - std::max(other[i].start_us, start);
        if (overlap > 0 && lost > 0) timed.contention_us += overlap * lost;
      }
      dur += timed.contention_us;
    }
    timed.end_us = start + dur;
    if (cross) tl.sync_us += sync_us;
    tl.copy_us += c.copy_us;
    tl.compile_us += c.compile_us;
    tl.gap_us += timed.gap_us;
    tl.contention_us += timed.contention_us;
    (pick == Device::gpu ? tl.gpu_busy_us : tl.npu_busy_us) += dur;
    tl.step_us = std::max(tl.step_us, timed.end_us);
    placed(pick).push_back(timed);
    ++next[static_cast<int>(pick)];
  }

  // Walk back from the op that ends last along what set each start.
  const TimedOp* last = nullptr;
  for (const std::vector<TimedOp>* list : {&tl.gpu, &tl.npu})
    for (const TimedOp& op : *list)
      if (!last || op.end_us > last->end_us) last = &op;
  for (const TimedOp* at = last; at;) {
    tl.critical_path.push_back(at->ref);
    at = at->pred == at->ref ? nullptr : &tl.at(at->pred);
  }
  std::reverse(tl.critical_path.begin(), tl.critical_path.end());
  return tl;
}

nlohmann::json timeline_trace_json(const Timeline& t) {
  nlohmann::json events = nlohmann::json::array();
  for (const std::vector<TimedOp>* list : {&t.gpu, &t.npu})
    for (const TimedOp& op : *list) {
      if (op.end_us <= op.start_us) continue;
      const bool matmul = op.kind == OpKind::MatMul || op.kind == OpKind::Logits;
      events.push_back(
          {{"name", matmul ? op_kind_name(op.kind) + " " + std::string(matmul_role_name(op.role))
                           : op_kind_name(op.kind)},
           {"ph", "X"},
           {"pid", 1},
           {"tid", op.ref.device == Device::gpu ? "gpu" : "npu"},
           {"ts", op.start_us},
           {"dur", op.end_us - op.start_us},
           {"args",
            {{"layer", op.layer},
             {"index", op.ref.index},
             {"tokens", op.tokens},
             {"copy_us", op.copy_us},
             {"compile_us", op.compile_us},
             {"contention_us", op.contention_us}}}});
    }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

nlohmann::json timeline_summary_json(const Timeline& t) {
  // Where the critical path spends its time: on each device, and waiting between them.
  double crit_gpu = 0, crit_npu = 0;
  for (const OpRef& r : t.critical_path)
    (r.device == Device::gpu ? crit_gpu : crit_npu) += t.at(r).end_us - t.at(r).start_us;
  return {{"step_us", t.step_us},
          {"gpu_busy_us", t.gpu_busy_us},
          {"npu_busy_us", t.npu_busy_us},
          {"sync_us", t.sync_us},
          {"copy_us", t.copy_us},
          {"compile_us", t.compile_us},
          {"gap_us", t.gap_us},
          {"contention_us", t.contention_us},
          {"cross_edges", t.cross_edges},
          {"gpu_ops", t.gpu.size()},
          {"npu_ops", t.npu.size()},
          {"critical_path_ops", t.critical_path.size()},
          {"critical_path_gpu_us", crit_gpu},
          {"critical_path_npu_us", crit_npu},
          {"critical_path_wait_us", t.step_us - crit_gpu - crit_npu}};
}

double SocModeledLatency::gpu_us(const OpShape& s) const {
  return gpu_modeled_us(soc_, s);
}
double SocModeledLatency::npu_us(const OpShape& s) const {
  return npu_modeled_us(soc_, s);
}

namespace {
double modeled_step_us(const ModelShape& shape, const ShapeTypes& types, const Plan& plan,
                       const SocProfile& soc, int64_t n, int64_t context, bool contention,
                       SyncMode sync) {
  const SolverOptions o = solver_options_for(soc);
  TimelineOptions t;
  t.n_tokens = n;
  t.context = context;
  t.contention = contention;
  t.sync = sync;
  return compose_timeline(schedule_from_shape(shape, types, plan), soc, o, t).step_us;
}
}  // namespace

double modeled_ttft_us(const ModelShape& shape, const ShapeTypes& types, const Plan& plan,
                       const SocProfile& soc, int64_t n_prompt, bool contention, SyncMode sync) {
  return modeled_step_us(shape, types, plan, soc, n_prompt, 0, contention, sync);
}

double modeled_tpot_us(const ModelShape& shape, const ShapeTypes& types, const Plan& plan,
                       const SocProfile& soc, int64_t context, bool contention, SyncMode sync) {
  return modeled_step_us(shape, types, plan, soc, 1, context, contention, sync);
}

}  // namespace duet
