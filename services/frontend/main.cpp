// frontend: the client API, scheduler and step executor. Two sockets: the control socket every
// service has (answered by core/ipc/service.h), and the client socket frontend.sock that `duet
// generate/chat/eval/status` talk to (schemas/client.fbs), served by frontend::Frontend: one per
// model the stack serves (DUET_MODELS, else --model; issue 25), behind one ModelRouter.
//
// The plan (DUET_PLAN, passed through by the supervisor; `duet stack up --plan`): auto (the
// default: the solver's plan fastest on this host, executed, beside the solver's plan for the
// SoC, modelled; stack_engines.h), tensor, gpu-only, npu-only (NPU graphs padded),
// npu-only:online-prepare, npu-only:pipe, layer, or reference (core ReferenceForward in this
// process). Eval requests may name any other plan; its engine is made on first use
// (services/frontend/stack_engines.h). Every model runs the stack's plan.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/service.h"
#include "core/ipc/stack_models.h"
#include "core/model/kv_budget.h"
#include "core/model/model.h"
#include "services/frontend/frontend.h"
#include "services/frontend/model_router.h"
#include "services/frontend/stack_engines.h"

namespace {

using namespace duet;

// Engine instances keep engines' shm segments and program ids apart (stack_engines.h). Model i's
// start at i * kInstancesPerModel: its main engine's (+0), its eval engines' (+1, +2, ...) and
// its proactive engine's (+99); model 0's are the one-model stack's numbers.
constexpr uint32_t kInstancesPerModel = 200;
constexpr uint32_t kProactiveInstance = 99;

// Every DUET_* value below comes through the settings registry (core/base/settings.h): its
// default, range and the error naming a bad value are in that one table.
using duet::setting_int;
using duet::setting_number;
using duet::setting_text;

struct StackServing {
  std::string plan;       // DUET_PLAN: every model's unless DUET_MODEL_PLANS names its own
  bool agent_on = false;  // DUET_AGENT: the proactive lane (for a model not on the reference)
  int max_ctx = 0;
  int max_seqs = 0;
  DType kv_type = DType::F16;
};

// The KV pools of every model from the stack's one budget (core/model/kv_budget.h plan_kv_pools):
// `duet stack up` planned them already and passes the budget in bytes, so a restarted frontend
// makes the same pools; run on its own the frontend takes the default share of the memory
// available now. A context a model's share cannot hold one sequence of is refused here too: no
// request would ever run.
std::vector<KvPoolPlan> plan_pools(const std::vector<ServedModel>& models, const StackServing& s) {
  const std::string budget_text = setting_text("DUET_KV_MEMORY");
  const uint64_t budget =
      budget_text.empty() ? default_kv_memory_bytes() : parse_memory_size(budget_text);
  std::vector<KvPoolRequest> requests;
  for (const ServedModel& m : models) {
    KvPoolRequest request = kv_pool_request(
        LlamaModel::load(m.path)->hp(), s.max_ctx, s.max_seqs,
        s.agent_on ? static_cast<int>(frontend::StackEngineConfig::kKvSharers) : 1, budget);
    request.bytes_per_value = static_cast<uint32_t>(dtype_block_bytes(s.kv_type));
    request.values_per_block = static_cast<uint32_t>(dtype_block_elems(s.kv_type));
    requests.push_back(request);
  }
  return plan_kv_pools(std::move(requests), budget);
}

// Model `index`'s frontend: its engines (its plan, the Agent's proactive lane, eval engines for
// other plans), its KV pool (`kv`; null for the reference plan) and its journal.
std::unique_ptr<frontend::Frontend> build_model_frontend(
    ServiceLoop& loop, frontend::ModelRouter& router, const ServedModel& model, uint32_t index,
    const std::string& plan, const StackServing& serving, const KvPoolPlan* kv) {
  const bool two_lanes = serving.agent_on && plan != "reference";
  const uint32_t instance = index * kInstancesPerModel;
  frontend::StackEngineConfig config;
  config.stack_id = loop.options().stack_id;
  config.run_dir = loop.run_dir();
  config.model_path = model.path;
  config.soc = loop.options().soc;
  // Empty: the plan's own default (auto executes the measured plan, tensor the modelled).
  config.timing = setting_text("DUET_TIMING");
  config.max_ctx = serving.max_ctx;
  frontend::FrontendOptions options;
  config.max_seqs = options.max_running;
  config.kv_type = serving.kv_type;
  config.kv_prefix_sharing = duet::setting_on("DUET_KV_PREFIX");
  // An engine for another plan (`eval --plan`) serves checks, not the stack's traffic: a
  // pool of two full sequences, not a second copy of the whole budget, which /dev/shm (the
  // default budget's cap) could not hold.
  uint32_t other_plan_kv_pages = 0;
  if (kv) {
    config.max_ctx = static_cast<int>(kv->ctx);
    config.kv_pages = kv->n_pages;
    other_plan_kv_pages = std::min(kv->n_pages, 2 * kv->pages_per_seq);
    options.max_context = static_cast<int>(kv->ctx);
    loop.log().info("{}: KV pool: {} of {} from a budget of {}", model.name, kv->summary(),
                    dtype_name(config.kv_type), format_bytes(kv->budget_bytes));
  }
  // Requests waiting beyond the running batch; one more is refused (Errc::busy) rather
  // than queued without bound. A long offered trace (agent_bench --max-queue) needs more.
  options.max_queue = static_cast<int>(setting_int("DUET_MAX_QUEUE"));
  // Steps kept for `duet trace` (a few words each; the devices keep their own 512).
  options.trace_steps = static_cast<size_t>(setting_int("DUET_TRACE_STEPS"));
  options.make_engine = [config, other_plan_kv_pages,
                         next = instance + 1](const std::string& p) mutable {
    frontend::StackEngineConfig other = config;
    other.kv_pages = other_plan_kv_pages;
    return frontend::make_stack_engine(other, p, next++);
  };
  // Agent.xpu (issue 9): proactive requests run on an engine of their own whose steps a
  // reactive arrival preempts. DUET_AGENT=off serves every request on the one engine.
  // Algorithm 2's cap and the aging threshold (agent_bench --cap in stack mode).
  options.agent.decode_cap = static_cast<int>(setting_int("DUET_AGENT_DECODE_CAP"));
  options.agent.aging_ms = setting_number("DUET_AGENT_AGING_MS");
  // Slack-aware piggybacking (agent_policy.h): a proactive decoder rides in a step with
  // reactive work only while the step's predicted time stays within (1 + slack) of the
  // step without it; inf: the cap alone. The default is measured (bench/agent/RESULTS.md).
  options.agent.rider_slack = setting_number("DUET_AGENT_RIDER_SLACK");
  // Carrying (scheduler.h): proactive decoders in the proactive prefill step while no
  // reactive work runs; off (the default, measured): they decode in steps of their own.
  options.agent.carry_decoders = duet::setting_on("DUET_AGENT_PROACTIVE_CARRY");
  // Proactive steps preemptible (the default) or plain (agent_policy.h).
  options.agent.preempt_proactive = duet::setting_on("DUET_AGENT_PREEMPT");
  // Overlap (agent_policy.h): the proactive prefill step beside the main engine's steps:
  // off (they take turns), proactive (beside proactive-only main steps), all (beside
  // reactive decode too; a reactive prefill parks it).
  const std::string overlap = setting_text("DUET_AGENT_OVERLAP");
  if (overlap == "off")
    options.agent.overlap = frontend::agent::AgentConfig::Overlap::off;
  else if (overlap == "proactive")
    options.agent.overlap = frontend::agent::AgentConfig::Overlap::proactive;
  else  // "all": the registry takes nothing else
    options.agent.overlap = frontend::agent::AgentConfig::Overlap::all;
  if (overlap != "off" && options.agent.carry_decoders)
    throw Error(Errc::invalid_argument,
                "frontend: DUET_AGENT_PROACTIVE_CARRY=on and DUET_AGENT_OVERLAP=" + overlap +
                    " exclude each other (carried decoders would be in both lanes' steps)");
  // The proactive engine's plan. The paper puts proactive prefill mainly on the NPU
  // (§4.3 ①) so that it overlaps decode on the GPU; here both devices share the host's
  // cores and, measured, proactive prefill runs fastest on gpu_svc alone (tiny-fortune,
  // 451 tokens: gpu-only 65-101 ms, the solver's tensor split 85-133, npu-only 137-165) and
  // the overlap loses (bench/agent/RESULTS.md, 2026-11-22 18:50-19:43 section). So when the
  // stack splits prefill across both devices (auto, tensor), the proactive engine runs
  // gpu-only; a stack pinned to one placement keeps it for both engines.
  const std::string proactive_plan =
      duet::setting_override("DUET_AGENT_PROACTIVE_PLAN")
          .value_or(plan == "auto" || plan == "tensor" ? "gpu-only" : plan);
  // The request journal (issue 22): a killed frontend's requests are adopted from it. The
  // engines are built over the KV pool as it was when a recovered request holds KV. Each model
  // has its own, so a request resumes on the model it ran on.
  if (plan != "reference") {
    frontend::RequestJournal::Geometry g;
    g.n_slots = static_cast<uint32_t>(std::min<int64_t>(
        frontend::RequestJournal::kMaxSlots, int64_t{options.max_running} + options.max_queue));
    g.max_ids = static_cast<uint32_t>(options.max_context);
    g.static_bytes = frontend::RequestJournal::static_bytes_for(options.max_stop_strings,
                                                                options.max_stop_bytes);
    options.journal = frontend::RequestJournal::open_or_create(config.stack_id, g, index);
    options.recovered = options.journal->recover();
    bool holds_kv = false;
    for (const auto& r : options.recovered)
      holds_kv = holds_kv || (r.state == frontend::JournalRecord::State::live && r.pos > 0);
    options.adopt_kv = std::make_shared<std::atomic<bool>>(holds_kv);
    config.adopt_kv = options.adopt_kv;
    if (!options.recovered.empty())
      loop.log().info("{}: request journal: {} records to adopt ({} with KV)", model.name,
                      options.recovered.size(), holds_kv ? "some" : "none");
  }
  // The two share one KV pool: a proactive request's decode rides in the main engine's
  // steps (Algorithm 2) with no KV byte copied.
  frontend::StackEngineConfig lanes = config;
  if (two_lanes) {
    if (!frontend::is_stack_plan(proactive_plan) || proactive_plan == "reference")
      throw Error(Errc::invalid_argument, "frontend: DUET_AGENT_PROACTIVE_PLAN='" + proactive_plan +
                                              "' is not one of " + frontend::stack_plan_list() +
                                              " (but reference)");
    lanes.kv_share = std::make_shared<frontend::KvShare>();
    if (index > 0) lanes.kv_share->tag = "shared_m" + std::to_string(index);
    // The proactive engine's steps (prefill only, preemptible) carry more tokens than the
    // main engine's 64: fewer, larger steps, so fewer fixed step costs. FCFS cannot take
    // them (a decoder waits a whole step per token); the Agent can, because a reactive
    // arrival stops the step at its next op boundary. 256 measured best (proactive
    // throughput vs FCFS +0.17 at compress 240, 10 of 10 seeds; 512 adds little and
    // doubles the longest op; bench/agent/RESULTS.md, 2026-11-23 section).
    frontend::StackEngineConfig proactive = lanes;
    proactive.max_step_tokens = static_cast<int>(setting_int("DUET_AGENT_PROACTIVE_STEP_TOKENS"));
    options.make_proactive_engine = [proactive, proactive_plan, instance] {
      return frontend::make_stack_engine(proactive, proactive_plan, instance + kProactiveInstance);
    };
  }
  auto fe =
      std::make_unique<frontend::Frontend>(frontend::make_stack_engine(lanes, plan, instance),
                                           loop.run_dir(), router.options_for(options, model.name));
  loop.log().info("serving {} ({}) with plan {} on {}", model.name, model.path, plan,
                  router.socket_path());
  if (options.journal)
    loop.log().info("{}: request journal: {}", model.name, fe->status()["journal"].dump());
  return fe;
}

}  // namespace

int main(int argc, char** argv) {
  std::unique_ptr<duet::frontend::ModelRouter> router;
  const int rc =
      duet::service_main(argc, argv, duet::ServiceId::frontend, [&](duet::ServiceLoop& loop) {
        using namespace duet;
        const std::vector<ServedModel> models = stack_models(loop.options().model_path);
        if (models.empty()) throw Error(Errc::invalid_argument, "frontend: --model is required");
        StackServing serving;
        serving.plan = setting_text("DUET_PLAN");
        serving.agent_on = setting_text("DUET_AGENT") != "off";
        const std::vector<std::string> plans =
            model_plans(models, setting_text("DUET_MODEL_PLANS"), serving.plan);
        serving.max_ctx = static_cast<int>(setting_int("DUET_MAX_CTX"));
        serving.max_seqs = frontend::FrontendOptions{}.max_running;
        serving.kv_type = parse_kv_type(setting_text("DUET_KV_TYPE"));
        // The pools as `stack up` planned them: for the stack's plan (none for the reference).
        std::vector<KvPoolPlan> pools;
        if (serving.plan != "reference") pools = plan_pools(models, serving);
        router = std::make_unique<frontend::ModelRouter>(loop.run_dir());
        for (uint32_t i = 0; i < models.size(); ++i)
          router->add(
              build_model_frontend(loop, *router, models[i], i, plans[i], serving,
                                   pools.empty() || plans[i] == "reference" ? nullptr : &pools[i]));
        router->set_priorities(model_priorities(models, setting_text("DUET_MODEL_PRIORITIES")),
                               static_cast<int>(setting_int("DUET_MODEL_PRIORITY_AGING")));
        // Steps run from the loop's hooks with a short time budget, so the control socket
        // (heartbeats) is answered between them. While the last pump made progress the loop does
        // not sleep between budgets (set_busy): a decode step of ~1 ms must not wait for a tick.
        // A pump that stepped nothing (work blocked on KV, say) lets the loop sleep a tick.
        auto stepped = std::make_shared<bool>(false);
        auto pump = [&loop, &router, stepped] {
          try {
            const uint64_t steps_before = router->steps();
            router->pump_for(std::chrono::milliseconds(5));
            *stepped = router->steps() != steps_before;
          } catch (const std::exception& e) {
            *stepped = false;
            loop.log().error("frontend: {}", e.what());  // a bug: log it, keep serving the rest
          }
        };
        loop.add_socket(router->socket(), pump);
        loop.set_idle(pump, 2);
        loop.set_busy([&router, stepped] { return *stepped && router->has_work(); });
        loop.set_status([&] { return router->status(); });
      });
  router.reset();
  return rc;
}
