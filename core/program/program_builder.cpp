// Builds the per-device programs of a model under a plan (core/program/program.h).
#include <algorithm>
#include <map>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/program/program.h"

namespace duet {
namespace {

constexpr uint64_t kAlign = 64;
uint64_t align_up(uint64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}

fb::TensorRef arena_ref(uint64_t offset, uint32_t rows, uint32_t cols) {
  return fb::TensorRef(fb::SegmentKind::Arena, fb::DTypeCode::F32, offset, rows, cols);
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
    std::vector<uint32_t> waits;  // global op ids
  };

  fb::TensorRef weight_ref(const ops::Matrix& m) const {
    return fb::TensorRef(fb::SegmentKind::Weights, static_cast<fb::DTypeCode>(m.type),
                         model_.offset_of(m.data), static_cast<uint32_t>(m.rows),
                         static_cast<uint32_t>(m.cols));
  }
  fb::TensorRef norm_ref(const float* w, int n) const {
    return fb::TensorRef(fb::SegmentKind::Weights, fb::DTypeCode::F32, model_.offset_of(w), 1,
                         static_cast<uint32_t>(n));
  }

  // Adds one op, or a group of ops that together produce one output (a split matmul).
  // `reads`/`writes` name tensors by a key (arena offset, or kKvKey + layer).
  void emit(std::vector<std::pair<Device, std::unique_ptr<fb::OpT>>> group,
            const std::vector<uint64_t>& reads, const std::vector<uint64_t>& writes) {
    std::vector<HazardTracker::Access> writers;
    for (auto& [device, op] : group) {
      const uint32_t id = static_cast<uint32_t>(ops_.size());
      PendingOp p{device, std::move(op), tracker_.hazards(device, reads, writes)};
      ops_.push_back(std::move(p));
      writers.push_back({device, id});
    }
    for (const auto& w : writers)
      for (uint64_t t : reads) tracker_.record_read(t, w);
    for (uint64_t t : writes) tracker_.record_writes(t, writers);
  }

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

  const ProgramSpec& spec_;
  const LlamaModel& model_;
  ArenaPlan arena_;
  HazardTracker tracker_;
  std::vector<PendingOp> ops_;
};

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

  uint64_t at = 0;
  auto slot = [&](uint64_t bytes) {
    const uint64_t off = at;
    at = align_up(at + bytes);
    return off;
  };
  arena_.tokens = slot(uint64_t{nt} * 4 * 4);
  arena_.page_tables = slot(uint64_t{spec_.max_seqs} * out.max_pages_per_seq * 4);
  arena_.x = slot(uint64_t{nt} * embd * 4);
  arena_.xn = slot(uint64_t{nt} * embd * 4);
  arena_.q = slot(uint64_t{nt} * qdim * 4);
  arena_.k = slot(uint64_t{nt} * kv_dim * 4);
  arena_.v = slot(uint64_t{nt} * kv_dim * 4);
  arena_.attn = slot(uint64_t{nt} * qdim * 4);
  arena_.tmp = slot(uint64_t{nt} * embd * 4);
  arena_.gate = slot(uint64_t{nt} * ff * 4);
  arena_.up = slot(uint64_t{nt} * ff * 4);
  arena_.logits = slot(uint64_t{spec_.max_logit_rows} * vocab * 4);
  arena_.bytes = at;

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
    op->out = std::make_unique<fb::TensorRef>(arena_ref(arena_.x, nt, embd));
    op->scale = hp.embd_scale;
    simple(Device::gpu, std::move(op), {arena_.tokens}, {arena_.x});
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
    rmsnorm(l, L.attn_norm, arena_.x, arena_.xn);
    matmul(MatmulRole::q, l, L.wq, arena_.xn, embd, arena_.q, nt);
    matmul(MatmulRole::k, l, L.wk, arena_.xn, embd, arena_.k, nt);
    matmul(MatmulRole::v, l, L.wv, arena_.xn, embd, arena_.v, nt);
    if (L.bq) {
      add_bias(l, L.bq, arena_.q, qdim);
      add_bias(l, L.bk, arena_.k, kv_dim);
      add_bias(l, L.bv, arena_.v, kv_dim);
    }
    for (uint64_t t : {arena_.q, arena_.k}) {
      auto op = new_op(fb::OpKind::Rope, l);
      fill_heads(*op);
      op->rope_mode = static_cast<uint8_t>(hp.rope_mode);
      op->freq_scale = hp.rope_freq_scale;
      if (model_.rope_freqs)
        op->freq_factors =
            std::make_unique<fb::TensorRef>(norm_ref(model_.rope_freqs, hp.head_dim / 2));
      if (t == arena_.k) op->n_heads = static_cast<uint16_t>(hp.n_head_kv);
      const uint32_t cols = t == arena_.q ? qdim : kv_dim;
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(t, nt, cols));
      simple(Device::gpu, std::move(op), {t, arena_.tokens}, {t});
    }
    {
      auto op = new_op(fb::OpKind::KvWrite, l);
      fill_heads(*op);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(arena_.k, nt, kv_dim));
      op->in1 = std::make_unique<fb::TensorRef>(arena_ref(arena_.v, nt, kv_dim));
      simple(Device::gpu, std::move(op), {arena_.k, arena_.v, arena_.tokens, arena_.page_tables},
             {kv_key});
    }
    {
      auto op = new_op(fb::OpKind::Attention, l);
      fill_heads(*op);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(arena_.q, nt, qdim));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(arena_.attn, nt, qdim));
      simple(Device::gpu, std::move(op), {arena_.q, kv_key, arena_.tokens, arena_.page_tables},
             {arena_.attn});
    }
    matmul(MatmulRole::o, l, L.wo, arena_.attn, qdim, arena_.tmp, nt);
    add(l, arena_.x, arena_.tmp);
    rmsnorm(l, L.ffn_norm, arena_.x, arena_.xn);
    matmul(MatmulRole::gate, l, L.w_gate, arena_.xn, embd, arena_.gate, nt);
    matmul(MatmulRole::up, l, L.w_up, arena_.xn, embd, arena_.up, nt);
    {
      auto op = new_op(fb::OpKind::SwiGlu, l);
      op->ffn_act = static_cast<uint8_t>(hp.ffn_act);
      op->in0 = std::make_unique<fb::TensorRef>(arena_ref(arena_.gate, nt, ff));
      op->in1 = std::make_unique<fb::TensorRef>(arena_ref(arena_.up, nt, ff));
      op->out = std::make_unique<fb::TensorRef>(arena_ref(arena_.gate, nt, ff));
      simple(Device::gpu, std::move(op), {arena_.gate, arena_.up}, {arena_.gate});
    }
    matmul(MatmulRole::down, l, L.w_down, arena_.gate, ff, arena_.tmp, nt);
    add(l, arena_.x, arena_.tmp);
  }
  rmsnorm(-1, model_.output_norm, arena_.x, arena_.xn);
  matmul(MatmulRole::logits, -1, model_.output, arena_.xn, embd, arena_.logits,
         spec_.max_logit_rows);

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
