// Builds the per-device programs of a model under a plan (core/program/program.h).
#include <algorithm>
#include <array>
#include <limits>
#include <map>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/program/program.h"

namespace duet {
namespace {

// An activation: until the slots are planned `slot` names the tensor (Builder::tensor), then
// its slot; its offset in the slot is 0.
fb::TensorRef arena_ref(uint64_t tensor, uint32_t rows, uint32_t cols) {
  return fb::TensorRef(fb::SegmentKind::Arena, fb::DTypeCode::F32, 0, rows, cols,
                       static_cast<uint16_t>(tensor));
}

// Tracks, per tensor (an arena slot or a layer's KV), which ops of which device last wrote it
// and which have read it since, so each new op waits for exactly the cross-device hazards.
class HazardTracker {
 public:
  struct Access {
    Device device;
    uint32_t op_id;  // global op id; becomes a flag if someone waits on it
  };

  // Waits an op on `device` needs before reading `reads` and writing `writes`.
  std::vector<uint32_t> hazards(Device device, const std::vector<uint64_t>& reads,
                                const std::vector<uint64_t>& writes) const {
    std::vector<uint32_t> waits;
    auto add_other = [&](const std::vector<Access>& list) {
      for (const Access& a : list)
        if (a.device != device) waits.push_back(a.op_id);
    };
    for (uint64_t t : reads) {
      if (auto it = writers_.find(t); it != writers_.end()) add_other(it->second);
    }
    for (uint64_t t : writes) {
      if (auto it = writers_.find(t); it != writers_.end()) add_other(it->second);
      if (auto it = readers_.find(t); it != readers_.end()) add_other(it->second);
    }
    std::sort(waits.begin(), waits.end());
    waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
    return waits;
  }

  void record_read(uint64_t t, Access a) { readers_[t].push_back(a); }
  // A group of writers (the two halves of a split op) replaces the previous writers together.
  void record_writes(uint64_t t, const std::vector<Access>& group) {
    writers_[t] = group;
    readers_[t].clear();
  }

 private:
  std::map<uint64_t, std::vector<Access>> writers_;
  std::map<uint64_t, std::vector<Access>> readers_;
};

class Builder {
 public:
  explicit Builder(const ProgramSpec& spec) : spec_(spec), model_(*spec.model) {}

  BuiltPrograms build();

 private:
  struct PendingOp {
    Device device;
    std::unique_ptr<fb::OpT> op;
    std::vector<uint64_t> reads, writes;  // tensor ids (kKvKey + layer: a layer's KV)
    uint32_t group = 0;                   // ops emitted together (a split matmul) share one
    std::vector<uint32_t> waits;          // global op ids
  };

  fb::TensorRef weight_ref(const ops::Matrix& m) const {
    return fb::TensorRef(fb::SegmentKind::Weights, static_cast<fb::DTypeCode>(m.type),
                         model_.offset_of(m.data), static_cast<uint32_t>(m.rows),
                         static_cast<uint32_t>(m.cols), 0);
  }
  fb::TensorRef norm_ref(const float* w, int n) const {
    return fb::TensorRef(fb::SegmentKind::Weights, fb::DTypeCode::F32, model_.offset_of(w), 1,
                         static_cast<uint32_t>(n), 0);
  }

  // Adds one op, or a group of ops that together produce one output (a split matmul).
  // `reads`/`writes` name tensors (Builder::tensor ids, or kKvKey + layer); the cross-device waits
  // are found once the tensors have their slots (finish_ops).
  void emit(std::vector<std::pair<Device, std::unique_ptr<fb::OpT>>> group,
            const std::vector<uint64_t>& reads, const std::vector<uint64_t>& writes) {
    for (auto& [device, op] : group)
      ops_.push_back(PendingOp{device, std::move(op), reads, writes, groups_, {}});
    ++groups_;
  }

  // A new tensor of the step: `rows` rows (N for activations) of `cols` f32 values.
  uint64_t tensor(const SymExpr& rows, uint32_t cols) {
    if (tensor_bytes_.size() >= std::numeric_limits<uint16_t>::max())
      throw Error(Errc::out_of_range, "program: too many tensors for the slot planner");
    tensor_bytes_.push_back(rows * (uint64_t{cols} * 4));
    return tensor_bytes_.size() - 1;
  }
  // Plans the slots from the tensors' accesses, then records the hazards between the ops by slot
  // (a slot's tenants are one tensor to the hazard tracker) and rewrites the refs to name slots.
  SlotPlan finish_ops(const SymExpr& base, const SymValues& largest);

  std::unique_ptr<fb::OpT> new_op(fb::OpKind kind, int layer) const {
    auto op = std::make_unique<fb::OpT>();
    op->kind = kind;
    op->layer = static_cast<int16_t>(layer);
    return op;
  }

  void matmul(MatmulRole role, int layer, const ops::Matrix& w, uint64_t in, uint32_t in_cols,
              uint64_t out, uint32_t out_rows_max);
  void simple(Device device, std::unique_ptr<fb::OpT> op, const std::vector<uint64_t>& reads,
              const std::vector<uint64_t>& writes) {
    std::vector<std::pair<Device, std::unique_ptr<fb::OpT>>> g;
    g.emplace_back(device, std::move(op));
    emit(std::move(g), reads, writes);
  }

  static constexpr uint64_t kKvKey = uint64_t{1} << 62;
  // The step's interface tensors: made first, so they are tensors (and slots) 0, 1 and 2.
  static constexpr uint64_t kTokens = 0, kPageTables = 1, kLogits = 2;

  const ProgramSpec& spec_;
  const LlamaModel& model_;
  ArenaPlan arena_;
  std::vector<SymExpr> tensor_bytes_;  // per tensor id
  std::vector<PendingOp> ops_;
  uint32_t groups_ = 0;
};

SlotPlan Builder::finish_ops(const SymExpr& base, const SymValues& largest) {
  // A tensor lives from its group's first access to its last: ops of one group run side by side.
  std::vector<SymTensor> tensors(tensor_bytes_.size());
  std::vector<bool> seen(tensor_bytes_.size(), false);
  for (size_t t = 0; t < tensors.size(); ++t) tensors[t].bytes = tensor_bytes_[t];
  for (const PendingOp& p : ops_)
    for (const auto* list : {&p.reads, &p.writes})
      for (uint64_t t : *list) {
        if (t >= kKvKey) continue;
        if (!seen[t]) tensors[t].first = p.group;
        seen[t] = true;
        tensors[t].last = p.group;
      }
  // The step's interface (token table, page tables, logits) keeps its slot for the whole step:
  // the frontend writes and reads it around the ops.
  for (uint64_t t : {kTokens, kPageTables, kLogits}) {
    tensors[t].first = 0;
    tensors[t].last = groups_;
  }
  SlotPlan plan = plan_slots(tensors, base, largest, spec_.reuse_slots);
  if (plan.size.size() > ArenaOffsets::kMaxSlots)
    throw Error(Errc::out_of_range, "program: " + std::to_string(plan.size.size()) +
                                        " arena slots (at most " +
                                        std::to_string(ArenaOffsets::kMaxSlots) + ")");
  auto key = [&](uint64_t t) { return t >= kKvKey ? t : uint64_t{plan.slot_of[t]}; };
  HazardTracker tracker;
  for (size_t i = 0; i < ops_.size();) {
    size_t end = i;
    while (end < ops_.size() && ops_[end].group == ops_[i].group) ++end;
    std::vector<uint64_t> reads, writes;
    for (uint64_t t : ops_[i].reads) reads.push_back(key(t));
    for (uint64_t t : ops_[i].writes) writes.push_back(key(t));
    std::vector<HazardTracker::Access> writers;
    for (size_t j = i; j < end; ++j) {
      ops_[j].waits = tracker.hazards(ops_[j].device, reads, writes);
      writers.push_back({ops_[j].device, static_cast<uint32_t>(j)});
    }
    for (const auto& w : writers)
      for (uint64_t t : reads) tracker.record_read(t, w);
    for (uint64_t t : writes) tracker.record_writes(t, writers);
    i = end;
  }
  for (PendingOp& p : ops_)
    for (std::unique_ptr<fb::TensorRef>* r : {&p.op->in0, &p.op->in1, &p.op->out})
      if (*r && (*r)->segment() == fb::SegmentKind::Arena)
        **r = fb::TensorRef((*r)->segment(), (*r)->dtype(), (*r)->offset(), (*r)->rows(),
                            (*r)->cols(), plan.slot_of[(*r)->slot()]);
  return plan;
}

void Builder::matmul(MatmulRole role, int layer, const ops::Matrix& w, uint64_t in,
                     uint32_t in_cols, uint64_t out, uint32_t out_rows_max) {
  // Per-layer plans (a subgraph placement) place each layer's matmuls, and the logits by the last.
  const Plan& plan =
      spec_.layer_plans.empty()
          ? spec_.plan
          : spec_
                .layer_plans[layer < 0 ? spec_.layer_plans.size() - 1 : static_cast<size_t>(layer)];
  const Placement& p = plan.at(role);
  const bool logits = role == MatmulRole::logits;
  const uint32_t rows = static_cast<uint32_t>(w.rows);
  auto make = [&](uint32_t row_begin, uint32_t row_end, uint32_t seq_begin, uint32_t seq_end) {
    auto op = new_op(logits ? fb::OpKind::Logits : fb::OpKind::MatMul, layer);
    op->in0 = std::make_unique<fb::TensorRef>(arena_ref(in, spec_.max_tokens, in_cols));
    op->weight = std::make_unique<fb::TensorRef>(weight_ref(w));
    op->out = std::make_unique<fb::TensorRef>(arena_ref(out, out_rows_max, rows));
    op->row_begin = row_begin;
    op->row_end = row_end;
    op->seq_begin = seq_begin;
    op->seq_end = seq_end;
    op->role = static_cast<uint8_t>(role);
    // A padding placement is one graph padded up, whatever the plan's mode (core/program/plan.h).
    op->npu_mode = static_cast<uint8_t>(p.strategy == Strategy::padding ? NpuGraphMode::padding
                                                                        : plan.npu_mode);
    return op;
  };
  std::vector<std::pair<Device, std::unique_ptr<fb::OpT>>> g;
  const uint32_t gpu_rows = static_cast<uint32_t>(std::clamp<int64_t>(p.gpu_rows, 0, rows));
  const uint32_t npu_tokens = static_cast<uint32_t>(std::max<int64_t>(p.npu_tokens, 0));
  switch (p.strategy) {
    case Strategy::gpu_only:
      g.emplace_back(Device::gpu, make(0, rows, 0, 0));
      break;
    case Strategy::npu_only:
    case Strategy::padding:
      g.emplace_back(Device::npu, make(0, rows, 0, 0));
      break;
    case Strategy::weight_split:
      if (gpu_rows > 0) g.emplace_back(Device::gpu, make(0, gpu_rows, 0, 0));
      if (gpu_rows < rows) g.emplace_back(Device::npu, make(gpu_rows, rows, 0, 0));
      break;
    case Strategy::activation_split:
      // NPU takes the standard-size chunks [0, npu_tokens); the GPU the ragged rest.
      if (npu_tokens == 0) {
        g.emplace_back(Device::gpu, make(0, rows, 0, 0));
      } else {
        g.emplace_back(Device::npu, make(0, rows, 0, npu_tokens));
        g.emplace_back(Device::gpu, make(0, rows, npu_tokens, 0));
      }
      break;
    case Strategy::hybrid:
      // Activation split; the NPU's chunk is weight-split with the GPU as well.
      if (gpu_rows > 0) g.emplace_back(Device::gpu, make(0, gpu_rows, 0, npu_tokens));
      if (gpu_rows < rows) g.emplace_back(Device::npu, make(gpu_rows, rows, 0, npu_tokens));
      g.emplace_back(Device::gpu, make(0, rows, npu_tokens, 0));
      break;
  }
  emit(std::move(g), {in}, {out});
}

BuiltPrograms Builder::build() {
  const LlamaHparams& hp = model_.hp();
  if (spec_.max_tokens == 0 || spec_.max_seqs == 0 || spec_.max_logit_rows == 0)
    throw Error(Errc::invalid_argument,
                "program spec: max_tokens, max_seqs and max_logit_rows must be > 0");
  const uint32_t nt = spec_.max_tokens;
  const uint32_t embd = static_cast<uint32_t>(hp.n_embd);
  const uint32_t qdim = static_cast<uint32_t>(hp.n_head * hp.head_dim);
  const uint32_t kv_dim = static_cast<uint32_t>(hp.n_head_kv * hp.head_dim);
  const uint32_t ff = static_cast<uint32_t>(hp.n_ff);
  const uint32_t vocab = static_cast<uint32_t>(hp.n_vocab);
  const uint32_t max_ctx = spec_.max_ctx ? spec_.max_ctx : static_cast<uint32_t>(hp.n_ctx);

  BuiltPrograms out;
  out.kv.page_tokens = spec_.page_tokens;
  out.kv.n_layers = static_cast<uint32_t>(hp.n_layer);
  out.kv.kv_dim = kv_dim;
  out.kv.pages_offset = spec_.kv_pages_offset;
  if (spec_.kv_type != DType::F32 && spec_.kv_type != DType::F16 && spec_.kv_type != DType::Q8_0)
    throw Error(Errc::unsupported, "program spec: KV values of type " +
                                       std::string(dtype_name(spec_.kv_type)) +
                                       " (F32, F16 or Q8_0)");
  if (spec_.kv_type == DType::Q8_0 && hp.head_dim % kQK != 0)
    throw Error(Errc::unsupported, "program spec: Q8_0 KV needs head_dim a multiple of 32, not " +
                                       std::to_string(hp.head_dim));
  out.kv.row_bytes = kv_row_bytes(spec_.kv_type, kv_dim);
  out.max_pages_per_seq = (max_ctx + spec_.page_tokens - 1) / spec_.page_tokens;
  out.kv.n_pages = spec_.kv_pages ? spec_.kv_pages : out.max_pages_per_seq * spec_.max_seqs;

  // The tensors, by id: the step's interface first (kTokens, kPageTables, kLogits: constant
  // sizes at their largest, so their offsets are constants the frontend can use), then the
  // activations as they are made, one per value (each layer's q is a tensor of its own).
  const SymExpr n_rows = SymExpr::symbol(Sym::tokens);
  tensor(SymExpr::constant(nt), 4);
  tensor(SymExpr::constant(uint64_t{spec_.max_seqs} * out.max_pages_per_seq), 1);
  tensor(SymExpr::constant(spec_.max_logit_rows), vocab);
  auto activation = [&](uint32_t cols) { return tensor(n_rows, cols); };
  // Where the NPU computes matmuls, a value shares its slot with the same value of every layer
  // (named slots: xn, q, k, v, attn, tmp, gate, up): reusing across values would add cross-device
  // write-after-read waits on GPU ops (norms, ropes) that then publish flags and fuse no more
  // (gpu_svc's op_fusion). GPU-only programs reuse by the symbolic rule alone.
  bool npu = spec_.plan.uses_npu();
  for (const Plan& p : spec_.layer_plans) npu = npu || p.uses_npu();
  enum Named { kXn, kQ, kK, kV, kAttn, kTmp, kGate, kUp, kNamed };
  std::array<uint64_t, kNamed> named{};
  std::array<bool, kNamed> made{};
  auto value = [&](Named n, uint32_t cols) {
    if (!npu) return activation(cols);
    if (!made[n]) named[n] = activation(cols);
    made[n] = true;
    return named[n];
  };
  const uint64_t x = activation(embd);  // the residual stream, the whole step

  auto fill_heads = [&](fb::OpT& op) {
    op.n_heads = static_cast<uint16_t>(hp.n_head);
    op.n_kv_heads = static_cast<uint16_t>(hp.n_head_kv);
    op.head_dim = static_cast<uint16_t>(hp.head_dim);
    op.freq_base = hp.rope_freq_base;
    op.eps = hp.rms_eps;
  };
  // A biased projection: out[t] += bias, on the GPU once every part of the matmul is done (the
  // NPU runs matmuls only).
  auto add_bias = [&](int layer, const float* bias, uint64_t t, uint32_t cols) {
    auto op = new_op(fb::OpKind::AddBias, layer);
    op->in0 = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
    op->weight = std::make_unique<fb::TensorRef>(norm_ref(bias, static_cast<int>(cols)));
    op->out = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
    simple(Device::gpu, std::move(op), {t}, {t});
  };

  {  // Embedding lookup: tokens -> x.
    auto op = new_op(fb::OpKind::Embed, -1);
    op->weight = std::make_unique<fb::TensorRef>(weight_ref(model_.tok_embd));
    op->out = std::make_unique<fb::TensorRef>(arena_ref(x, nt, embd));
    op->scale = hp.embd_scale;
    simple(Device::gpu, std::move(op), {kTokens}, {x});
  }
  auto rmsnorm = [&](int layer, const float* w, uint64_t in, uint64_t dst) {
    auto op = new_op(fb::OpKind::RmsNorm, layer);
    fill_heads(*op);
    op->in0 = std::make_unique<fb::TensorRef>(arena_ref(in, nt, embd));
    op->weight = std::make_unique<fb::TensorRef>(norm_ref(w, hp.n_embd));
    op->out = std::make_unique<fb::TensorRef>(arena_ref(dst, nt, embd));
    simple(Device::gpu, std::move(op), {in}, {dst});
  };
  auto add = [&](int layer, uint64_t acc, uint64_t other) {
    auto op = new_op(fb::OpKind::Add, layer);
    op->in0 = std::make_unique<fb::TensorRef>(arena_ref(acc, nt, embd));
    op->in1 = std::make_unique<fb::TensorRef>(arena_ref(other, nt, embd));
    op->out = std::make_unique<fb::TensorRef>(arena_ref(acc, nt, embd));
    simple(Device::gpu, std::move(op), {acc, other}, {acc});
  };

  for (int l = 0; l < hp.n_layer; ++l) {
    const LlamaLayer& L = model_.layers[l];
    const uint64_t kv_key = kKvKey + static_cast<uint64_t>(l);
    const uint64_t xn = value(kXn, embd), q = value(kQ, qdim), k = value(kK, kv_dim),
                   v = value(kV, kv_dim);
    rmsnorm(l, L.attn_norm, x, xn);
    matmul(MatmulRole::q, l, L.wq, xn, embd, q, nt);
    matmul(MatmulRole::k, l, L.wk, xn, embd, k, nt);
    matmul(MatmulRole::v, l, L.wv, xn, embd, v, nt);
    if (L.bq) {
      add_bias(l, L.bq, q, qdim);
      add_bias(l, L.bk, k, kv_dim);
      add_bias(l, L.bv, v, kv_dim);
    }
    for (uint64_t t : {q, k}) {
      auto op = new_op(fb::OpKind::Rope, l);
      fill_heads(*op);
      op->rope_mode = static_cast<uint8_t>(hp.rope_mode);
      op->freq_scale = hp.rope_freq_scale;
      if (model_.rope_freqs)
        op->freq_factors =
            std::make_unique<fb::TensorRef>(norm_ref(model_.rope_freqs, hp.head_dim / 2));
      if (t == k) op->n_heads = static_cast<uint16_t>(hp.n_head_kv);
      const uint32_t cols = t == q ? qdim : kv_dim;
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
      simple(Device::gpu, std::move(op), {t, kTokens}, {t});
    }
    {
      auto op = new_op(fb::OpKind::KvWrite, l);
      fill_heads(*op);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(k, nt, kv_dim));
      op->in1 = std::make_unique<fb::TensorRef>(arena_ref(v, nt, kv_dim));
      simple(Device::gpu, std::move(op), {k, v, kTokens, kPageTables}, {kv_key});
    }
    const uint64_t attn = value(kAttn, qdim);
    {
      auto op = new_op(fb::OpKind::Attention, l);
      fill_heads(*op);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(q, nt, qdim));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(attn, nt, qdim));
      simple(Device::gpu, std::move(op), {q, kv_key, kTokens, kPageTables}, {attn});
    }
    const uint64_t attn_out = value(kTmp, embd);
    matmul(MatmulRole::o, l, L.wo, attn, qdim, attn_out, nt);
    add(l, x, attn_out);
    const uint64_t xn2 = value(kXn, embd), gate = value(kGate, ff), up = value(kUp, ff);
    rmsnorm(l, L.ffn_norm, x, xn2);
    matmul(MatmulRole::gate, l, L.w_gate, xn2, embd, gate, nt);
    matmul(MatmulRole::up, l, L.w_up, xn2, embd, up, nt);
    {
      auto op = new_op(fb::OpKind::SwiGlu, l);
      op->ffn_act = static_cast<uint8_t>(hp.ffn_act);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(gate, nt, ff));
      op->in1 = std::make_unique<fb::TensorRef>(arena_ref(up, nt, ff));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(gate, nt, ff));
      simple(Device::gpu, std::move(op), {gate, up}, {gate});
    }
    const uint64_t ffn_out = value(kTmp, embd);
    matmul(MatmulRole::down, l, L.w_down, gate, ff, ffn_out, nt);
    add(l, x, ffn_out);
  }
  const uint64_t x_final = value(kXn, embd);
  rmsnorm(-1, model_.output_norm, x, x_final);
  matmul(MatmulRole::logits, -1, model_.output, x_final, embd, kLogits, spec_.max_logit_rows);

  const SymValues largest{nt, spec_.max_seqs, out.max_pages_per_seq};
  const SlotPlan slots = finish_ops(SymExpr{}, largest);
  arena_.tokens = slots.offset[kTokens].eval(largest);
  arena_.page_tables = slots.offset[kPageTables].eval(largest);
  arena_.logits = slots.offset[kLogits].eval(largest);
  arena_.slot_offset = slots.offset;
  arena_.slot_size = slots.size;
  arena_.end = slots.end;
  arena_.bytes = slots.end.eval(largest);
  arena_.tensors = static_cast<uint32_t>(tensor_bytes_.size());

  // Flags: one per op that another device waits on, plus each device's last op (step done).
  std::vector<int64_t> flag_of(ops_.size(), -1);
  uint32_t next_flag = spec_.flag_base;
  auto flag_for = [&](uint32_t id) {
    if (flag_of[id] < 0) flag_of[id] = next_flag++;
    return static_cast<uint32_t>(flag_of[id]);
  };
  for (Device d : {Device::gpu, Device::npu}) {
    for (size_t i = ops_.size(); i-- > 0;) {
      if (ops_[i].device == d) {
        out.done_flags.push_back(flag_for(static_cast<uint32_t>(i)));
        break;
      }
    }
  }
  for (PendingOp& p : ops_)
    for (uint32_t w : p.waits) p.op->wait_flags.push_back(flag_for(w));
  for (size_t i = 0; i < ops_.size(); ++i) {
    PendingOp& p = ops_[i];
    p.op->publish_flag = static_cast<int32_t>(flag_of[i]);
    fb::ProgramT& prog = p.device == Device::gpu ? out.gpu : out.npu;
    prog.ops.push_back(std::move(p.op));
  }
  out.n_flags = next_flag - spec_.flag_base;

  for (Device d : {Device::gpu, Device::npu}) {
    fb::ProgramT& prog = d == Device::gpu ? out.gpu : out.npu;
    prog.name = spec_.name + (d == Device::gpu ? "/gpu" : "/npu");
    prog.model_path = model_.file().path();
    prog.max_tokens = nt;
    prog.arena_segment = spec_.arena_segment;
    prog.kv_segment = spec_.kv_segment;
    prog.flags_segment = spec_.flags_segment;
    prog.kv = std::make_unique<fb::KvLayoutT>();
    prog.kv->page_tokens = out.kv.page_tokens;
    prog.kv->n_layers = out.kv.n_layers;
    prog.kv->kv_dim = out.kv.kv_dim;
    prog.kv->page_bytes = out.kv.page_bytes();
    prog.kv->n_pages = out.kv.n_pages;
    prog.kv->pages_offset = out.kv.pages_offset;
    prog.kv->dtype = static_cast<fb::DTypeCode>(spec_.kv_type);
    prog.max_seqs = spec_.max_seqs;
    prog.max_pages = out.max_pages_per_seq;
    for (size_t k = 0; k < arena_.slot_offset.size(); ++k) {
      const auto& off = arena_.slot_offset[k].coefs();
      const auto& size = arena_.slot_size[k].coefs();
      prog.slot_offsets.insert(prog.slot_offsets.end(), off.begin(), off.end());
      prog.slot_sizes.insert(prog.slot_sizes.end(), size.begin(), size.end());
    }
  }
  out.arena = arena_;
  return out;
}

}  // namespace

BuiltPrograms build_programs(const ProgramSpec& spec) {
  if (!spec.model) throw Error(Errc::invalid_argument, "program spec: no model");
  const size_t layers = static_cast<size_t>(spec.model->hp().n_layer);
  if (!spec.layer_plans.empty() && spec.layer_plans.size() != layers + 1)
    throw Error(Errc::invalid_argument, "program spec: " + std::to_string(spec.layer_plans.size()) +
                                            " layer plans for a model of " +
                                            std::to_string(layers) +
                                            " layers (one per layer and one for the logits)");
  return Builder(spec).build();
}

std::vector<uint8_t> serialize_program(const fb::ProgramT& program) {
  flatbuffers::FlatBufferBuilder fbb(1 << 16);
  fbb.Finish(fb::Program::Pack(fbb, &program));
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

}  // namespace duet
