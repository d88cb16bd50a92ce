#include "services/solver_svc/solver_service.h"
#include "core/ipc/model_access.h"

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/service.h"

namespace duet::solver {

SolverService::SolverService(std::string default_soc, std::string default_model,
                             std::string run_dir)
    : default_soc_(std::move(default_soc)),
      default_model_(std::move(default_model)),
      run_dir_(std::move(run_dir)) {}

SolverService::~SolverService() {
  if (profiler_.joinable()) profiler_.join();
}

PlanQuery SolverService::query_of(const fb::PlanRequest& r) const {
  PlanQuery q;
  q.model_path = r.model_path() ? r.model_path()->str() : "";
  if (!q.model_path.empty()) check_model_path(q.model_path);  // only configured dirs
  q.shape = r.shape() ? r.shape()->str() : "";
  if (q.model_path.empty() && q.shape.empty()) {
    if (default_model_.empty())
      throw Error(Errc::invalid_argument,
                  "PlanRequest names no shape and no model, and the stack serves none");
    q.model_path = default_model_;
  }
  q.soc = r.soc() && r.soc()->size() > 0 ? r.soc()->str() : default_soc_;
  q.timing = r.timing() && r.timing()->size() > 0 ? r.timing()->str() : "modeled";
  q.phase =
      phase_from_name(r.phase() && r.phase()->size() > 0 ? r.phase()->string_view() : "prefill");
  q.n_tokens = r.n_tokens() > 0 ? r.n_tokens() : 1;
  if (q.phase == Phase::decode && r.n_tokens() > 1)
    throw Error(Errc::invalid_argument,
                "PlanRequest: decode is one token per step, not " + std::to_string(r.n_tokens()));
  q.run_dir = run_dir_;
  // Measured profiles run on the stack's own devices while it serves: profile the token counts
  // its frontend steps in (buckets up to 256), not the whole 1..1024 sweep.
  if (q.timing == "measured") q.profile_lengths = {1, 16, 32, 64, 128, 256};
  q.validate();
  return q;
}

void SolverService::start_profiling(const PlanQuery& q, const QueryModel& model) {
  std::lock_guard lock(mutex_);
  const std::string key = model.key + "/" + q.soc;
  if (profiling_)
    throw Error(Errc::busy, "profiling " + profiling_key_ + " on the stack's devices since " +
                                std::to_string((monotonic_ms() - profiling_started_ms_) / 1000) +
                                " s; ask again");
  if (!profiling_error_.empty()) {
    const std::string error = profiling_error_;
    profiling_error_.clear();  // the next request tries again
    throw Error(Errc::unavailable, "measured profiling of " + profiling_key_ + " failed: " + error);
  }
  if (profiler_.joinable()) profiler_.join();
  profiling_ = true;
  profiling_key_ = key;
  profiling_started_ms_ = monotonic_ms();
  profiler_ = std::thread([this, q, model] {
    std::string error;
    nlohmann::json summary = nullptr;
    try {
      const Profile p = profile_for(q, model);
      summary = {
          {"key", profiling_key_}, {"ops", p.entries.size()}, {"profiling_s", p.profiling_s}};
    } catch (const std::exception& e) {
      error = e.what();
    }
    std::lock_guard done(mutex_);
    profiling_error_ = error;
    if (!summary.is_null()) last_profile_ = summary;
    profiling_ = false;
  });
  throw Error(Errc::busy, "measured timing: profiling " + key +
                              " on the stack's gpu_svc and npu_svc; ask again");
}

msg::Bytes SolverService::plan(const fb::Message& request) {
  const auto* body = request.body_as_PlanRequest();
  if (!body) throw Error(Errc::invalid_argument, "PlanRequest without a body");
  const PlanQuery q = query_of(*body);
  if (q.timing == "measured") {
    const QueryModel model = query_model(q);
    if (!profile_cached(q, model)) start_profiling(q, model);
  }
  const nlohmann::json j = plan_json_for(q);
  ++plans_served_;
  if (j.value("cached", false)) ++plans_cached_;
  last_ = {{"key", j.at("key")}, {"version", j.at("version")}, {"total_us", j.at("total_us")}};
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(
      fbb, request.request_id(),
      fb::CreatePlanReplyDirect(fbb, j.at("version").get<uint32_t>(), j.dump().c_str()));
}

nlohmann::json SolverService::status_json() const {
  std::lock_guard lock(mutex_);
  return {{"solver_version", kSolverVersion},
          {"plans_served", plans_served_},
          {"plans_from_cache", plans_cached_},
          {"last_plan", last_},
          {"default_soc", default_soc_},
          {"plan_cache", duet_cache_dir() + "/plans"},
          {"profiling", profiling_ ? nlohmann::json(profiling_key_) : nlohmann::json(nullptr)},
          {"last_profile", last_profile_},
          {"profiling_error", profiling_error_}};
}

void install_solver_handlers(ServiceLoop& loop, SolverService& service) {
  loop.on(fb::Body::PlanRequest, [&service](const fb::Message& m) { return service.plan(m); });
  loop.set_status([&service] { return service.status_json(); });
}

}  // namespace duet::solver
