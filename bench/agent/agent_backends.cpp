#include "bench/agent/agent_backends.h"

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "core/base/error.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"

namespace duet::bench {
namespace {

using Clock = std::chrono::steady_clock;
using frontend::ProgramEngine;
using frontend::SeqStep;

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Calls request_preempt() on `engine` after_us from now unless cancelled first.
class PreemptTimer {
 public:
  PreemptTimer(ProgramEngine& engine, double after_us) {
    if (after_us == kNever) return;
    const auto at =
        Clock::now() + std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, after_us)));
    thread_ = std::thread([this, &engine, at] {
      std::unique_lock lock(mu_);
      if (!cv_.wait_until(lock, at, [&] { return cancelled_; })) engine.request_preempt();
    });
  }
  ~PreemptTimer() {
    {
      std::lock_guard lock(mu_);
      cancelled_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;
  std::thread thread_;
};

class MeasuredBackend : public Backend {
 public:
  static constexpr int kMaxSeqs = 32;
  MeasuredBackend(const std::string& model_path, bool two_engines) {
    const std::string stack = "agentbench" + std::to_string(getpid());
    // The two engines share one KV pool (kv_share.h), as the serving loop's do: proactive
    // decoders ride in the reactive engine's steps.
    auto share = two_engines ? std::make_shared<frontend::KvShare>() : nullptr;
    reactive_ = make(model_path, stack, "re", 0, share);
    if (two_engines) proactive_ = make(model_path, stack, "pro", 100, share);
  }

  void open(Flow e, uint64_t seq, int max_positions) override {
    engine(e).open_seq(seq, max_positions);
  }
  void close(Flow e, uint64_t seq) override { engine(e).close_seq(seq); }
  int max_step_tokens() const override { return reactive_->max_step_tokens(); }
  int max_seqs() const override { return kMaxSeqs; }
  bool parked() const override { return proactive_ && proactive_->parked(); }
  bool co_batches() const override { return proactive_ != nullptr; }

  StepOutcome step(Flow e, const std::vector<SeqWork>& batch, bool,
                   double preempt_after_us) override {
    std::vector<SeqStep> steps;
    for (const SeqWork& w : batch) steps.push_back({w.seq, w.tokens, w.pos0, true});
    ProgramEngine& eng = engine(e);
    const auto t0 = Clock::now();
    if (&eng != proactive_.get()) return finish(eng, eng.step(steps, nullptr), t0);
    const uint64_t before = eng.preempt_stats().preemptions;
    std::optional<std::vector<float>> logits;
    {
      PreemptTimer timer(eng, preempt_after_us);
      logits = eng.step_preemptible(steps, nullptr);
    }
    return outcome(eng, logits, t0, before);
  }

  StepOutcome resume(double preempt_after_us) override {
    ProgramEngine& eng = *proactive_;
    const auto t0 = Clock::now();
    const uint64_t before = eng.preempt_stats().preemptions;
    std::optional<std::vector<float>> logits;
    {
      PreemptTimer timer(eng, preempt_after_us);
      logits = eng.resume(nullptr);
    }
    return outcome(eng, logits, t0, before);
  }

 private:
  static std::unique_ptr<ProgramEngine> make(const std::string& path, const std::string& stack,
                                             const std::string& tag, uint32_t id_base,
                                             std::shared_ptr<frontend::KvShare> share) {
    frontend::ProgramEngineOptions o;
    o.model_path = path;
    o.stack_id = stack;
    o.segment_tag = tag;
    o.program_id_base = id_base;
    o.plan_name = "elastic";
    // Decode-size buckets on the GPU; the prefill bucket splits its tokens, one standard chunk of
    // 32 on the NPU (Algorithm 1's binding for a busy decode pipeline).
    o.plan_for = [](uint32_t bucket) {
      if (bucket < 64) return Plan::gpu_only();
      Plan p;
      p.name = "activation_split";
      for (Placement& pl : p.matmul) pl = {Strategy::activation_split, 0, 32};
      return p;
    };
    o.buckets = {16, 64};
    o.max_seqs = kMaxSeqs;
    o.max_ctx = 512;
    if (share) {
      o.kv_share = std::move(share);
      o.kv_pages = 2 * o.max_seqs * (o.max_ctx / o.page_tokens);
    }
    return std::make_unique<ProgramEngine>(o, LlamaModel::load(path),
                                           frontend::make_interpreter_link("gpu"),
                                           frontend::make_interpreter_link("npu"));
  }
  ProgramEngine& engine(Flow e) {
    return e == Flow::proactive && proactive_ ? *proactive_ : *reactive_;
  }

  StepOutcome finish(ProgramEngine& eng, const std::vector<float>& logits, Clock::time_point t0) {
    StepOutcome o;
    o.us = us_since(t0);
    const int V = eng.model().hp().n_vocab;
    for (size_t i = 0; i + 1 <= logits.size() / V; ++i)
      o.next_tokens.push_back(static_cast<int32_t>(
          std::max_element(logits.begin() + i * V, logits.begin() + (i + 1) * V) -
          (logits.begin() + i * V)));
    return o;
  }
  StepOutcome outcome(ProgramEngine& eng, const std::optional<std::vector<float>>& logits,
                      Clock::time_point t0, uint64_t preemptions_before) {
    if (logits) return finish(eng, *logits, t0);
    StepOutcome o;
    o.us = us_since(t0);
    o.preempted = true;
    if (eng.preempt_stats().preemptions > preemptions_before)
      o.preempt_latency_us = eng.preempt_stats().last_latency_us;
    return o;
  }

  std::unique_ptr<ProgramEngine> reactive_, proactive_;
};

// Modelled: a step is a list of op times; preemption ends it at the boundary after the request.
class ModeledBackend : public Backend {
 public:
  ModeledBackend(const SocProfile& soc, const ModelShape& shape, int chunk_tokens,
                 int max_step_tokens)
      : soc_(soc), shape_(shape), chunk_(chunk_tokens), max_step_(max_step_tokens) {}

  void open(Flow, uint64_t, int) override {}
  void close(Flow, uint64_t) override {}
  int max_step_tokens() const override { return max_step_; }
  int max_seqs() const override { return 64; }
  bool parked() const override { return !parked_ops_.empty(); }
  bool co_batches() const override { return true; }

  StepOutcome step(Flow, const std::vector<SeqWork>& batch, bool decode_busy,
                   double preempt_after_us) override {
    int n = 0;
    for (const SeqWork& w : batch) n += static_cast<int>(w.tokens.size());
    std::vector<double> ops = op_times(n, static_cast<int>(batch.size()), decode_busy);
    StepOutcome o = run(ops, preempt_after_us);
    o.next_tokens.assign(batch.size(), 0);
    return o;
  }
  StepOutcome resume(double preempt_after_us) override {
    std::vector<double> ops = std::move(parked_ops_);
    parked_ops_.clear();
    current_entries_ = parked_entries_;
    StepOutcome o = run(ops, preempt_after_us);
    o.next_tokens.assign(current_entries_, 0);
    return o;
  }

 private:
  // The layer's matmuls and the logits. A prefill (more tokens than entries) binds each
  // token-wise op by Algorithm 1; decode runs on the GPU.
  std::vector<double> op_times(int n, int entries, bool decode_busy) {
    current_entries_ = static_cast<size_t>(entries);
    const int64_t d = shape_.n_embd, kv = int64_t{shape_.n_embd} / shape_.n_head * shape_.n_head_kv,
                  ff = shape_.n_ff;
    const std::pair<int64_t, int64_t> mk[] = {{d, d},  {kv, d}, {kv, d}, {d, d},
                                              {ff, d}, {ff, d}, {d, ff}};
    std::vector<double> ops;
    for (int l = 0; l < shape_.n_layer; ++l)
      for (const auto& [m, k] : mk) ops.push_back(matmul_us(m, k, n, entries, decode_busy));
    ops.push_back(gpu_modeled_us(
        soc_, OpShape{OpKind::Logits, DType::Q4_0, shape_.n_vocab, d, entries, true}));
    return ops;
  }
  double matmul_us(int64_t m, int64_t k, int n, int entries, bool decode_busy) {
    auto cost = [&](int tokens, Device dev) {
      const OpShape s{OpKind::MatMul, DType::Q4_0, m, k, tokens, true};
      return dev == Device::npu ? npu_modeled_us(soc_, s) : gpu_modeled_us(soc_, s);
    };
    if (n <= entries || n < chunk_) return cost(n, Device::gpu);
    const frontend::agent::ElasticBinding b =
        frontend::agent::elastic_binding(n, decode_busy, chunk_, cost);
    return std::max(b.npu_us, b.gpu_us + b.defer_us);
  }
  StepOutcome run(std::vector<double>& ops, double preempt_after_us) {
    StepOutcome o;
    double t = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
      t += ops[i];
      if (t > preempt_after_us && i + 1 < ops.size()) {
        o.preempted = true;
        o.preempt_latency_us = t - preempt_after_us;
        parked_ops_.assign(ops.begin() + static_cast<long>(i) + 1, ops.end());
        parked_entries_ = current_entries_;
        break;
      }
    }
    o.us = t;
    return o;
  }

  SocProfile soc_;
  ModelShape shape_;
  int chunk_, max_step_;
  std::vector<double> parked_ops_;
  size_t parked_entries_ = 0, current_entries_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_measured_backend(const std::string& model_path, bool two_engines) {
  return std::make_unique<MeasuredBackend>(model_path, two_engines);
}

std::unique_ptr<Backend> make_modeled_backend(const SocProfile& soc, const ModelShape& shape,
                                              int chunk_tokens, int max_step_tokens) {
  return std::make_unique<ModeledBackend>(soc, shape, chunk_tokens, max_step_tokens);
}

}  // namespace duet::bench
