// Frontend: the warm-up (schemas/client.fbs Warmup), llama-server's warm-up at load for a stack.
// The first request on a fresh stack otherwise pays for what only happens once: building the
// engine (its programs registered with the device services, the weights' tiled copies made and
// first touched, the solver asked for plans) and the devices' first launches of each kernel
// (PoCL compiles a kernel again per work-group size and caches it on disk, so on a fresh machine
// that is seconds). Here the engines run one step of each token bucket on a scratch sequence;
// nothing of it reaches the request metrics or the trace ring.
//
// The warm-up is a job the pump advances one unit at a time (an engine's build, then one step),
// as it steps requests, so the control socket's heartbeats are answered between units. A request
// that arrives ends it at the next unit (the reply says what ran): requests come first.
#include <algorithm>
#include <string>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

// The main engine's prefill steps: one per token bucket of a stack's engines (1, 4, 16, 64:
// make_stack_engine), largest first, then a decode step. The proactive engine shares gpu_svc's
// kernels and weights with it, so a short prefill and a decode build and touch what is its own.
const std::vector<int> kMainSteps = {64, 16, 4};
const std::vector<int> kProactiveSteps = {4};

}  // namespace

void Frontend::on_warmup(const std::vector<std::string>& routing, uint64_t id,
                         const fbc::Warmup& w) {
  check_model(w.model());
  std::string skipped;
  if (!requests_.empty() || !sessions_.empty())
    skipped = "requests are running";  // they warm it, and a scratch step must not delay them
  else if (warmup_)
    skipped = "a warm-up is running";
  if (!skipped.empty()) {
    reply_warmup(routing, id, {{"model", options_.model_name}, {"skipped", skipped}, {"ms", 0.0}});
    return;
  }
  WarmupJob job;
  job.routing = routing;
  job.id = id;
  job.started_ms = now_ms();
  // Ordinary tokens of the model's own vocabulary, cycled to each step's length.
  job.text = tokenizer_.encode("The quick brown fox jumps over the lazy dog.", true);
  if (job.text.empty()) job.text.push_back(0);
  job.lanes.push_back({engine_.get(), "main", kMainSteps});
  if (proactive_engine_)
    job.lanes.push_back({proactive_engine_.get(), "proactive", kProactiveSteps});
  warmup_ = std::move(job);
}

void Frontend::warm_up_next() {
  WarmupJob& job = *warmup_;
  if (!requests_.empty()) {  // a request came: it goes first
    end_warmup({{"interrupted", "a request arrived"}});
    return;
  }
  WarmupJob::Lane& lane = job.lanes[job.lane];
  Engine& engine = *lane.engine;
  try {
    if (!job.open) {
      // The steps that fit the context, then the sequence that holds them (the first use builds
      // the engine).
      const LlamaModel& model = engine.model();
      const int n_ctx = options_.max_context > 0 ? std::min(options_.max_context, model.hp().n_ctx)
                                                 : model.hp().n_ctx;
      job.sizes.clear();
      int positions = 0;
      for (int n : lane.prefill_steps) {
        n = std::min(n, engine.max_step_tokens());
        if (positions + n + 1 > n_ctx) continue;
        job.sizes.push_back(n);
        positions += n;
      }
      job.sizes.push_back(1);  // the decode
      job.lane_started_ms = now_ms();
      job.seq = next_seq_id_++;
      job.pos = 0;
      job.steps = nlohmann::json::array();
      engine.open_seq(job.seq, positions + 1);
      job.open = true;
      engine.reserve_seq(job.seq, positions + 1);
      job.open_ms = now_ms() - job.lane_started_ms;
      return;
    }
    const size_t k = job.steps.size();
    const int n = job.sizes[k];
    const bool decode = k + 1 == job.sizes.size();
    SeqStep s;
    s.seq_id = job.seq;
    s.pos0 = job.pos;
    s.decode = decode;
    for (int i = 0; i < n; ++i)
      s.tokens.push_back(job.text[static_cast<size_t>(job.pos + i) % job.text.size()] %
                         engine.model().hp().n_vocab);
    StepStats stats;
    const double t = now_ms();
    (void)engine.step({s}, &stats);
    job.steps.push_back({{"tokens", n}, {"decode", decode}, {"ms", now_ms() - t}});
    job.pos += n;
    if (job.steps.size() < job.sizes.size()) return;
    // Its complete blocks stay cached for prefix sharing, as any finished request's do:
    // evictable, so they count as free for admission.
    engine.close_seq(job.seq);
    job.open = false;
    job.engines.push_back({{"engine", lane.name},
                           {"plan", engine.executed_plan()},
                           {"open_ms", job.open_ms},
                           {"steps", job.steps},
                           {"ms", now_ms() - job.lane_started_ms}});
    if (++job.lane == job.lanes.size()) end_warmup({});
  } catch (const Error& e) {
    fail_warmup(e.code(), e.what());
  } catch (const std::exception& e) {  // a bug: the job must still end, or every pump retries it
    fail_warmup(Errc::internal, e.what());
  }
}

void Frontend::fail_warmup(Errc code, const std::string& message) {
  const WarmupJob ended = take_warmup();
  reply_error(ended.routing, ended.id, code, "warm-up of " + options_.model_name + ": " + message);
  last_warmup_ = {{"model", options_.model_name}, {"error", message}};
}

Frontend::WarmupJob Frontend::take_warmup() {
  WarmupJob job = std::move(*warmup_);
  warmup_.reset();
  try {
    if (job.open) job.lanes[job.lane].engine->close_seq(job.seq);
  } catch (const std::exception&) {
    // The engine is failing already (the reply says why); its next build starts afresh.
  }
  return job;
}

void Frontend::end_warmup(nlohmann::json j) {
  const WarmupJob job = take_warmup();
  j["model"] = options_.model_name;
  j["engines"] = job.engines;
  j["ms"] = now_ms() - job.started_ms;
  reply_warmup(job.routing, job.id, j);
}

void Frontend::reply_warmup(const std::vector<std::string>& routing, uint64_t id,
                            const nlohmann::json& j) {
  last_warmup_ = j;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateWarmupReplyDirect(fbb, j.dump().c_str());
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::WarmupReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

}  // namespace duet::frontend
