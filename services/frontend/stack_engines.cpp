#include "services/frontend/stack_engines.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <thread>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/model/model.h"
#include "core/planner/soc_profile.h"
#include "core/planner/solver.h"
#include "puzzle/subgraph_program.h"
#include "services/frontend/program_engine.h"
#include "services/frontend/reference_engine.h"

namespace duet::frontend {
namespace {

// Where each bucket's plan came from, for status.
struct PlanSources {
  std::mutex mu;
  nlohmann::json buckets = nlohmann::json::object();  // executed plans
  bool fallback = false;
  nlohmann::json modeled_buckets = nlohmann::json::object();  // the SoC's, when not the executed
  bool modeled_fallback = false;
  std::string executed, modeled;  // names for stats (Engine::executed_plan/modeled_plan)
};

// Forwards to the engine it wraps, keeps alive the model that engine reads (when it does not own
// it), and adds how its plans were chosen to status().
class AnnotatedEngine : public Engine {
 public:
  AnnotatedEngine(std::unique_ptr<LlamaModel> model, std::unique_ptr<Engine> inner,
                  std::shared_ptr<PlanSources> sources)
      : model_(std::move(model)), inner_(std::move(inner)), sources_(std::move(sources)) {}
  const LlamaModel& model() const override { return inner_->model(); }
  std::string plan_name() const override { return inner_->plan_name(); }
  std::string executed_plan() const override {
    std::lock_guard lock(sources_->mu);
    if (sources_->executed.empty()) return inner_->executed_plan();
    return sources_->executed + (sources_->fallback ? " (gpu-only fallback in some buckets)" : "");
  }
  std::string modeled_plan() const override {
    std::lock_guard lock(sources_->mu);
    if (sources_->modeled.empty()) return inner_->modeled_plan();
    // Without a plan of its own the SoC is modelled running the executed plan.
    const bool fallback =
        sources_->modeled_buckets.empty() ? sources_->fallback : sources_->modeled_fallback;
    return sources_->modeled + (fallback ? " (gpu-only fallback in some buckets)" : "");
  }
  nlohmann::json trace_step(const StepDetail& d) const override { return inner_->trace_step(d); }
  void open_seq(uint64_t id, int n) override { inner_->open_seq(id, n); }
  void close_seq(uint64_t id) override { inner_->close_seq(id); }
  void reserve_seq(uint64_t id, int n) override { inner_->reserve_seq(id, n); }
  void truncate_seq(uint64_t id, int n) override { inner_->truncate_seq(id, n); }
  int share_prefix(uint64_t id, std::span<const int32_t> p) override {
    return inner_->share_prefix(id, p);
  }
  void adopt_seq(uint64_t id, int max, int n) override { inner_->adopt_seq(id, max, n); }
  uint32_t reclaim_unadopted() override { return inner_->reclaim_unadopted(); }
  std::vector<float> step(const std::vector<SeqStep>& b, StepStats* s) override {
    return inner_->step(b, s);
  }
  int max_step_tokens() const override { return inner_->max_step_tokens(); }
  const KvShare* kv_share() const override { return inner_->kv_share(); }
  bool preemptible() const override { return inner_->preemptible(); }
  std::optional<std::vector<float>> step_preemptible(const std::vector<SeqStep>& b,
                                                     StepStats* s) override {
    return inner_->step_preemptible(b, s);
  }
  std::optional<std::vector<float>> resume(StepStats* s) override { return inner_->resume(s); }
  bool parked() const override { return inner_->parked(); }
  void request_preempt() override { inner_->request_preempt(); }
  nlohmann::json status() const override {
    nlohmann::json j = inner_->status();
    std::lock_guard lock(sources_->mu);
    j["plan_sources"] = sources_->buckets;
    j["solver_fallback"] = sources_->fallback;
    if (!sources_->modeled_buckets.empty()) j["soc_plan_sources"] = sources_->modeled_buckets;
    if (!sources_->executed.empty()) j["executed_plan"] = sources_->executed;
    if (!sources_->modeled.empty()) j["modeled_plan"] = sources_->modeled;
    if (sources_->fallback)
      j["note"] =
          "solver_svc was unreachable (or, measured timing, still profiling this host): some "
          "buckets run the gpu-only plan until the engine is rebuilt, once idle (see "
          "plan_sources)";
    return j;
  }

 private:
  std::unique_ptr<LlamaModel> model_;  // first: outlives the engine that reads it
  std::unique_ptr<Engine> inner_;
  std::shared_ptr<PlanSources> sources_;
};

Plan ask_solver_once(const StackEngineConfig& c, uint32_t bucket, const std::string& timing);

// Builds the engine on first use, so the frontend is up (and healthy) before the device services
// are, and a device that is down fails requests with a clear error instead of the frontend's
// start. A failed build is retried by the next request.
class LazyEngine : public Engine {
 public:
  LazyEngine(const std::string& model_path, std::string plan,
             std::function<std::unique_ptr<Engine>()> build, int replan_after_ms,
             std::shared_ptr<KvShare> kv_share, int max_step_tokens)
      : model_(LlamaModel::load(model_path)),
        plan_(std::move(plan)),
        build_(std::move(build)),
        replan_after_(replan_after_ms),
        kv_share_(std::move(kv_share)),
        max_step_tokens_(max_step_tokens) {}
  const LlamaModel& model() const override { return inner_ ? inner_->model() : *model_; }
  std::string plan_name() const override { return plan_; }
  std::string executed_plan() const override { return inner_ ? inner_->executed_plan() : plan_; }
  std::string modeled_plan() const override { return inner_ ? inner_->modeled_plan() : plan_; }
  nlohmann::json trace_step(const StepDetail& d) const override {
    return inner_ ? inner_->trace_step(d) : nlohmann::json{};
  }
  void open_seq(uint64_t id, int n) override {
    replan_if_solver_returned();
    ready().open_seq(id, n);
    ++open_;
  }
  void close_seq(uint64_t id) override {
    if (inner_) inner_->close_seq(id);
    if (open_ > 0) --open_;
  }
  void truncate_seq(uint64_t id, int n) override {
    if (inner_) inner_->truncate_seq(id, n);
  }
  int share_prefix(uint64_t id, std::span<const int32_t> p) override {
    return ready().share_prefix(id, p);
  }
  void reserve_seq(uint64_t id, int n) override { ready().reserve_seq(id, n); }
  void adopt_seq(uint64_t id, int max, int n) override {
    ready().adopt_seq(id, max, n);
    ++open_;
  }
  uint32_t reclaim_unadopted() override { return inner_ ? inner_->reclaim_unadopted() : 0; }
  std::vector<float> step(const std::vector<SeqStep>& b, StepStats* s) override {
    return ready().step(b, s);
  }
  int max_step_tokens() const override {
    return inner_ ? inner_->max_step_tokens() : max_step_tokens_;
  }
  // Known before the engine is built: the build joins this share.
  const KvShare* kv_share() const override { return kv_share_.get(); }
  // Before the first request builds it, the engine parks nothing and cannot say whether it could.
  bool preemptible() const override { return inner_ && inner_->preemptible(); }
  std::optional<std::vector<float>> step_preemptible(const std::vector<SeqStep>& b,
                                                     StepStats* s) override {
    return ready().step_preemptible(b, s);
  }
  std::optional<std::vector<float>> resume(StepStats* s) override { return ready().resume(s); }
  bool parked() const override { return inner_ && inner_->parked(); }
  void request_preempt() override {
    if (inner_) inner_->request_preempt();
  }
  nlohmann::json status() const override {
    if (inner_) return inner_->status();
    return {{"engine", "not built yet (built by the first request)"},
            {"plan", plan_},
            {"last_error", last_error_}};
  }

  static constexpr int kMaxStepTokens = 64;  // the largest token bucket (make_stack_engine)

 private:
  // An engine built while solver_svc was unreachable runs gpu-only fallbacks. Once it is idle
  // (no open sequence) and a while has passed, drop it: the next build asks the solver again, so
  // a returning solver's plans are used again.
  void replan_if_solver_returned() {
    if (!inner_ || open_ > 0 || shared_kv_in_use()) return;
    if (std::chrono::steady_clock::now() - built_at_ < replan_after_) return;
    if (!inner_->status().value("solver_fallback", false)) return;
    inner_.reset();
  }

  // Sequences another engine opened in the shared KV pool may be riding in this engine's steps
  // (Algorithm 2): the engine is not swapped under them.
  bool shared_kv_in_use() const {
    if (!kv_share_) return false;
    std::shared_ptr<KvPool> pool;
    {
      std::lock_guard lock(kv_share_->mu);
      pool = kv_share_->pool.lock();
    }
    if (!pool) return false;
    std::lock_guard lock(pool->mu);
    return !pool->seqs.empty();
  }

  Engine& ready() {
    if (!inner_) {
      try {
        inner_ = build_();
        built_at_ = std::chrono::steady_clock::now();
        last_error_.clear();
      } catch (const Error& e) {
        last_error_ = e.what();
        // Never busy: busy tells the scheduler to keep a request queued until KV frees up, and an
        // engine that cannot be built (its KV segment does not fit /dev/shm, say) frees nothing.
        const bool retry_later = e.code() == Errc::timeout || e.code() == Errc::busy;
        throw Error(retry_later ? Errc::unavailable : e.code(),
                    "the '" + plan_ + "' engine could not start: " + e.what());
      }
    }
    return *inner_;
  }

  std::unique_ptr<LlamaModel> model_;  // answers model() until the engine exists
  std::string plan_;
  int open_ = 0;  // sequences open on inner_
  std::chrono::steady_clock::time_point built_at_;
  std::function<std::unique_ptr<Engine>()> build_;
  std::chrono::milliseconds replan_after_;
  std::unique_ptr<Engine> inner_;
  std::string last_error_;
  std::shared_ptr<KvShare> kv_share_;
  int max_step_tokens_;
};

// Asks solver_svc for the plan of one token bucket, retrying while it starts (the stack starts
// its services together) until the timeout.
Plan ask_solver(const StackEngineConfig& c, uint32_t bucket, const std::string& timing) {
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(c.solver_timeout_ms);
  for (;;) {
    try {
      return ask_solver_once(c, bucket, timing);
    } catch (const Error& e) {
      // busy: the solver is profiling (measured timing), which takes far longer than a request
      // should wait; fall back now and re-plan later.
      if (e.code() == Errc::invalid_argument || e.code() == Errc::busy ||
          std::chrono::steady_clock::now() >= give_up)
        throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

Plan ask_solver_once(const StackEngineConfig& c, uint32_t bucket, const std::string& timing) {
  msg::RequestClient client(ipc_endpoint(control_socket_path(c.run_dir, ServiceId::solver)));
  const msg::Reply reply = client.call(
      [&](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        auto body =
            fb::CreatePlanRequestDirect(fbb, c.model_path.c_str(), "", c.soc.c_str(),
                                        timing.c_str(), bucket <= 1 ? "decode" : "prefill", bucket);
        return msg::finish_message(fbb, id, body);
      },
      std::chrono::milliseconds(1000));
  const auto* plan = reply.message().body_as_PlanReply();
  if (!plan || !plan->json()) throw Error(Errc::bad_format, "solver_svc: not a PlanReply");
  Plan p = plan_from_json(nlohmann::json::parse(plan->json()->str()));
  p.name = "tensor";
  return p;
}

std::unique_ptr<Engine> build_engine(const StackEngineConfig& c, const std::string& plan,
                                     uint32_t instance);

// The subgraph plan in `path`, validated for the stack. A subgraph on `both` would need the
// solver's tensor plan per bucket, which this path does not ask for: refused.
puzzle::SubgraphPlan read_stack_subgraph_plan(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(Errc::not_found, "subgraph plan '" + path + "': cannot open it");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::bad_format, "subgraph plan '" + path + "': " + e.what());
  }
  const puzzle::SubgraphPlan p = puzzle::subgraph_plan_from_json(j);
  for (const Phase phase : {Phase::prefill, Phase::decode})
    for (const puzzle::Subgraph& s : p.of(phase))
      if (s.device == puzzle::Proc::both)
        throw Error(Errc::unsupported, "subgraph plan '" + path +
                                           "': a subgraph on \"both\" is not served yet (gpu "
                                           "and npu are)");
  return p;
}

std::string tag_of(const std::string& plan, uint32_t instance) {
  std::string tag;
  for (char ch : plan) tag += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  // A segment part holds at most 64 characters: a long plan name (subgraph:<path>) keeps its
  // start and a hash of the whole.
  if (tag.size() > 40) {
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(std::hash<std::string>{}(plan)));
    tag = tag.substr(0, 22) + "_" + hash;
  }
  return tag + "_" + std::to_string(instance);
}

}  // namespace

const std::vector<std::string>& stack_plan_names() {
  static const std::vector<std::string> names = {
      "reference",     "gpu-only", "npu-only", "npu-only:online-prepare",
      "npu-only:pipe", "layer",    "tensor",   "auto"};
  return names;
}

bool is_stack_plan(std::string_view plan) {
  if (plan.starts_with(kSubgraphPlanPrefix) && plan.size() > kSubgraphPlanPrefix.size())
    return true;
  const auto& names = stack_plan_names();
  return std::find(names.begin(), names.end(), plan) != names.end();
}

std::string stack_plan_list() {
  std::string list;
  for (const std::string& n : stack_plan_names()) list += (list.empty() ? "" : ", ") + n;
  return list + ", " + std::string(kSubgraphPlanPrefix) + "<plan.json>";
}

std::unique_ptr<Engine> make_stack_engine(const StackEngineConfig& c, const std::string& plan,
                                          uint32_t instance) {
  if (!is_stack_plan(plan))
    throw Error(Errc::invalid_argument,
                "unknown plan '" + plan + "' (plans: " + stack_plan_list() + ")");
  if (plan != "reference")
    return std::make_unique<LazyEngine>(
        c.model_path, plan, [c, plan, instance] { return build_engine(c, plan, instance); },
        c.replan_after_ms, c.kv_share, std::max(c.max_step_tokens, LazyEngine::kMaxStepTokens));
  return build_engine(c, plan, instance);
}

namespace {

std::unique_ptr<Engine> build_engine(const StackEngineConfig& c, const std::string& plan,
                                     uint32_t instance) {
  auto model = LlamaModel::load(c.model_path);
  auto sources = std::make_shared<PlanSources>();
  if (plan == "reference") {
    ReferenceEngineOptions ro;
    ro.kv_type = c.kv_type;
    auto engine = std::make_unique<ReferenceEngine>(*model, ro);
    return std::make_unique<AnnotatedEngine>(std::move(model), std::move(engine),
                                             std::move(sources));
  }

  ProgramEngineOptions o;
  o.model_path = c.model_path;
  o.stack_id = c.stack_id;
  o.plan_name = plan;
  // 4: a reactive-first decode step (Algorithm 2: one reactive decoder and up to 3 proactive
  // riders) runs a program sized for it, not the 16-token one.
  o.buckets = {1, 4, 16, static_cast<uint32_t>(LazyEngine::kMaxStepTokens)};
  if (c.max_step_tokens > LazyEngine::kMaxStepTokens)
    o.buckets.push_back(static_cast<uint32_t>(c.max_step_tokens));
  o.max_seqs = static_cast<uint32_t>(std::max(1, c.max_seqs));
  o.max_ctx = static_cast<uint32_t>(c.max_ctx);
  o.segment_tag = tag_of(plan, instance);
  o.per_bucket_programs = setting_text("DUET_PROGRAMS") == "per-bucket";
  const uint32_t ctx =
      c.max_ctx > 0 ? static_cast<uint32_t>(c.max_ctx) : static_cast<uint32_t>(model->hp().n_ctx);
  const int n_layer = model->hp().n_layer;
  const uint32_t sharers = c.kv_share ? StackEngineConfig::kKvSharers : 1;
  o.kv_share = c.kv_share;
  o.adopt_kv = c.adopt_kv;
  o.kv_type = c.kv_type;
  o.prefix_sharing = c.kv_prefix_sharing;
  o.kv_pages =
      c.kv_pages ? c.kv_pages : sharers * o.max_seqs * ((ctx + o.page_tokens - 1) / o.page_tokens);
  o.program_id_base =
      1000 * (instance + 1) + 100 * static_cast<uint32_t>(std::hash<std::string>{}(plan) % 10);
  o.soc = c.soc;
  // By its name (the services are given the profile's .toml path).
  const std::string soc = load_soc_profile(c.soc).name;
  if (plan.starts_with(kSubgraphPlanPrefix)) {
    // A subgraph placement (puzzle/subgraph_plan.h) from a file: every bucket's programs place
    // each layer's matmuls as the plan's units say; a plan per phase has the decode steps run
    // its decode placement (ProgramEngineOptions::decode_layer_plans_for).
    const puzzle::SubgraphPlan sp =
        read_stack_subgraph_plan(plan.substr(kSubgraphPlanPrefix.size()));
    const std::vector<Plan> layers = puzzle::subgraph_layer_plans(sp, n_layer);
    o.plan_for = [plan](uint32_t) {
      Plan p = Plan::gpu_only();
      p.name = plan;
      return p;
    };
    o.layer_plans_for = [layers](uint32_t) { return layers; };
    if (sp.per_phase()) {
      const std::vector<Plan> decode =
          puzzle::subgraph_layer_plans(sp, n_layer, Plan::gpu_only(), Phase::decode);
      o.decode_layer_plans_for = [decode](uint32_t) { return decode; };
    }
    sources->modeled = plan + " on " + soc;
  } else if (plan == "tensor" || plan == "auto") {
    const std::string timing = !c.timing.empty() ? c.timing
                               : plan == "auto"  ? "measured"
                                                 : "modeled";
    // The solver's plan of a bucket for `timing`, or gpu-only (noted in `where`) when it gives
    // none. One unanswered bucket is enough: the engine's other buckets fall back at once
    // instead of each waiting out the solver deadline.
    auto solve = [c, sources](uint32_t bucket, const std::string& timing, nlohmann::json& where,
                              bool& fallback) {
      std::lock_guard lock(sources->mu);
      if (fallback) {
        where[std::to_string(bucket)] =
            "gpu-only fallback: solver_svc did not answer for an earlier bucket";
        return Plan::gpu_only();
      }
      try {
        Plan p = ask_solver(c, bucket, timing);
        where[std::to_string(bucket)] = "solver_svc (" + timing + ")";
        return p;
      } catch (const Error& e) {
        fallback = true;
        where[std::to_string(bucket)] = std::string("gpu-only fallback: ") + e.what();
        return Plan::gpu_only();
      }
    };
    o.plan_for = [solve, sources, timing](uint32_t bucket) {
      return solve(bucket, timing, sources->buckets, sources->fallback);
    };
    sources->executed = plan + ": the solver's plan for " +
                        (timing == "measured" ? "this host (measured)" : soc + " (modeled)");
    sources->modeled = "tensor: the solver's plan for " + soc + " (modeled)";
    // The SoC is modelled running the solver's modelled plan; when that is not the plan
    // executed, it is asked for separately.
    if (timing != "modeled")
      o.soc_plan_for = [solve, sources](uint32_t bucket) {
        return solve(bucket, "modeled", sources->modeled_buckets, sources->modeled_fallback);
      };
  } else {
    sources->modeled = plan + " on " + soc;
  }
  auto gpu =
      make_service_link("gpu_svc", ipc_endpoint(control_socket_path(c.run_dir, ServiceId::gpu)));
  auto npu =
      make_service_link("npu_svc", ipc_endpoint(control_socket_path(c.run_dir, ServiceId::npu)));
  auto engine =
      std::make_unique<ProgramEngine>(o, std::move(model), std::move(gpu), std::move(npu));
  return std::make_unique<AnnotatedEngine>(nullptr, std::move(engine), std::move(sources));
}

}  // namespace

}  // namespace duet::frontend
