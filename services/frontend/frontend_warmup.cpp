// Frontend: the warm-up (schemas/client.fbs Warmup), llama-server's warm-up at load for a stack.
// The first request on a fresh stack otherwise pays for what only happens once: building the
// engine (its programs registered with the device services, the weights' tiled copies made and
// first touched, the solver asked for plans) and the devices' first launches of each kernel
// (PoCL compiles a kernel again per work-group size and caches it on disk, so on a fresh machine
// that is seconds). Here the engines run one step of each token bucket on a scratch sequence;
// nothing of it reaches the request metrics or the trace ring.
#include <algorithm>
#include <chrono>
#include <span>
#include <string>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

// The main engine's prefill steps: one per token bucket of a stack's engines (1, 4, 16, 64:
// make_stack_engine), largest first, then a decode step. The proactive engine shares gpu_svc's
// kernels and weights with it, so a short prefill and a decode build and touch what is its own.
constexpr int kMainSteps[] = {64, 16, 4};
constexpr int kProactiveSteps[] = {4};

double elapsed_ms(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - since)
      .count();
}

}  // namespace

nlohmann::json Frontend::warm_up_engine(Engine& engine, const char* lane,
                                        std::span<const int> prefill_steps) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaModel& model = engine.model();
  // Ordinary tokens of the model's own vocabulary, as many as the steps need; a context too short
  // for all of them gets smaller steps.
  const int max_step = engine.max_step_tokens();
  const int n_ctx = options_.max_context > 0 ? std::min(options_.max_context, model.hp().n_ctx)
                                             : model.hp().n_ctx;
  std::vector<int> sizes;
  int positions = 0;
  for (int n : prefill_steps) {
    n = std::min(n, max_step);
    if (positions + n + 1 > n_ctx) continue;
    sizes.push_back(n);
    positions += n;
  }
  std::vector<int32_t> text =
      tokenizer_.encode("The quick brown fox jumps over the lazy dog.", true);
  if (text.empty()) text.push_back(0);
  const uint64_t seq = next_seq_id_++;
  engine.open_seq(seq, positions + 1);  // builds the engine on its first use
  const double open_ms = elapsed_ms(t0);
  nlohmann::json steps = nlohmann::json::array();
  try {
    engine.reserve_seq(seq, positions + 1);
    int32_t pos = 0;
    auto run = [&](int n, bool decode) {
      SeqStep s;
      s.seq_id = seq;
      s.pos0 = pos;
      s.decode = decode;
      for (int i = 0; i < n; ++i)
        s.tokens.push_back(text[static_cast<size_t>(pos + i) % text.size()] % model.hp().n_vocab);
      StepStats stats;
      const auto t = std::chrono::steady_clock::now();
      (void)engine.step({s}, &stats);
      steps.push_back({{"tokens", n}, {"decode", decode}, {"ms", elapsed_ms(t)}});
      pos += n;
    };
    for (int n : sizes) run(n, false);
    run(1, true);
  } catch (...) {
    engine.close_seq(seq);
    throw;
  }
  // Its complete blocks stay cached for prefix sharing, as any finished request's do: evictable,
  // so they count as free for admission.
  engine.close_seq(seq);
  return {{"engine", lane},
          {"plan", engine.executed_plan()},
          {"open_ms", open_ms},
          {"steps", steps},
          {"ms", elapsed_ms(t0)}};
}

void Frontend::on_warmup(const std::vector<std::string>& routing, uint64_t id,
                         const fbc::Warmup& w) {
  check_model(w.model());
  nlohmann::json j = {{"model", options_.model_name}};
  const auto t0 = std::chrono::steady_clock::now();
  if (has_work() || !requests_.empty() || !sessions_.empty()) {
    // Requests are already warming it, and a scratch step must not delay theirs.
    j["skipped"] = "requests are running";
  } else {
    try {
      nlohmann::json engines = nlohmann::json::array();
      engines.push_back(warm_up_engine(*engine_, "main", kMainSteps));
      if (proactive_engine_)
        engines.push_back(warm_up_engine(*proactive_engine_, "proactive", kProactiveSteps));
      j["engines"] = engines;
    } catch (const Error& e) {
      reply_error(routing, id, e.code(), "warm-up of " + options_.model_name + ": " + e.what());
      return;
    }
  }
  j["ms"] = elapsed_ms(t0);
  last_warmup_ = j;
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateWarmupReplyDirect(fbb, j.dump().c_str());
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::WarmupReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

}  // namespace duet::frontend
