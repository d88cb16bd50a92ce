// One generation (prompt of N synthetic ids, then greedy decode of up to T tokens) through either
// a running stack (frontend + gpu_svc + npu_svc + solver_svc: ZeroMQ and shared memory) or all
// roles in this process (ProgramEngine over in-process GpuService/NpuService objects, the same
// control messages), printing prefill and decode tokens/s, measured and modelled, as JSON.
// The two modes run the same step shapes: prompt chunks of the frontend's largest bucket (64),
// then one-token decode steps, programs built for the frontend's 16 sequences.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/model/model.h"
#include "core/planner/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/frontend/program_engine.h"
#include "services/gpu_svc/gpu_service.h"
#include "services/npu_svc/npu_service.h"

namespace {

using duet::frontend::SeqStep;
using duet::frontend::StepStats;

// The frontend's token buckets (make_stack_engine): prompts go in chunks of the largest.
uint32_t g_max_step = 64;                  // --max-step
constexpr uint32_t kFrontendMaxSeqs = 16;  // FrontendOptions::max_running

// Deterministic prompt: BOS then ids cycling over the vocabulary (past the special tokens) from
// `salt`. Prompts of one salt are prefixes of each other, so a stack's prefix cache serves a
// prompt after a longer one: warm-up requests take another salt than the timed ones.
std::vector<int32_t> synthetic_prompt(int n, int n_vocab, int32_t bos, int salt) {
  std::vector<int32_t> ids{bos};
  for (int i = 1; i < n; ++i) ids.push_back(3 + (i * 37 + salt) % std::max(1, n_vocab - 3));
  return ids;
}

struct Result {
  int prompt_tokens = 0, generated = 0;
  double ttft_ms = 0, tpot_ms = 0, modeled_ttft_ms = 0, modeled_tpot_ms = 0;
};

nlohmann::json to_json(const Result& r) {
  auto rate = [](double tokens, double ms) { return ms > 0 ? tokens * 1000.0 / ms : 0.0; };
  return {{"prompt_tokens", r.prompt_tokens},
          {"generated_tokens", r.generated},
          {"ttft_ms", r.ttft_ms},
          {"tpot_ms", r.tpot_ms},
          {"prefill_tok_s", rate(r.prompt_tokens, r.ttft_ms)},
          {"decode_tok_s", rate(1, r.tpot_ms)},
          {"modeled_prefill_tok_s", rate(r.prompt_tokens, r.modeled_ttft_ms)},
          {"modeled_decode_tok_s", rate(1, r.modeled_tpot_ms)}};
}

Result run_stack(const std::string& stack, const std::string& plan,
                 const std::vector<int32_t>& prompt, int max_tokens, bool ignore_eos) {
  duet::client::Client client(duet::client::stack_endpoint(stack));
  duet::client::GenerateRequest req;
  req.prompt_ids = prompt;
  req.max_tokens = max_tokens;
  req.ignore_eos = ignore_eos;
  req.plan = plan;
  req.stream = false;
  const auto got = client.generate(req);
  const auto& s = got.stats;
  return {static_cast<int>(s.prompt_tokens),
          static_cast<int>(s.generated_tokens),
          s.ttft_ms,
          s.tpot_ms,
          s.modeled_ttft_ms,
          s.modeled_tpot_ms};
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Result run_in_process(const std::string& model_path, const std::string& plan, int max_ctx,
                      const std::vector<int32_t>& prompt, int max_tokens, bool ignore_eos) {
  using namespace duet;
  const SocProfile soc = load_soc_profile("sd8gen3");
  gpu::GpuService gpu(gpu::shared_device(), soc, ShmMemoryResolver("gpu_svc"));
  npu::NpuService npu(soc, 0, ShmMemoryResolver("npu_svc"));
  frontend::ProgramEngineOptions o;
  o.model_path = model_path;
  o.stack_id = "benchinproc" + std::to_string(getpid());
  o.plan_name = plan;
  o.buckets = {1, 16, g_max_step};
  o.max_seqs = kFrontendMaxSeqs;
  o.max_ctx = static_cast<uint32_t>(max_ctx);
  frontend::ProgramEngine e(o, LlamaModel::load(model_path),
                            frontend::make_local_service_link("gpu", gpu),
                            frontend::make_local_service_link("npu", npu));
  const int32_t eos = e.model().vocab().eos;
  const int ctx = max_ctx > 0 ? max_ctx : e.model().hp().n_ctx;
  // Warm-up (as the stack's warm-up request): the first steps of each bucket pay one-time costs.
  e.open_seq(2, ctx);
  for (const size_t n : {size_t{g_max_step}, size_t{8}}) {
    const size_t k = std::min(n, prompt.size());
    e.step({{2, {prompt.begin(), prompt.begin() + k}, 0, true}}, nullptr);
    e.truncate_seq(2, 0);
  }
  e.step({{2, {prompt[0]}, 0, true}}, nullptr);
  e.close_seq(2);
  e.open_seq(1, ctx);
  Result r;
  r.prompt_tokens = static_cast<int>(prompt.size());
  using clock = std::chrono::steady_clock;
  auto ms_since = [](clock::time_point t) {
    return std::chrono::duration<double, std::milli>(clock::now() - t).count();
  };
  const auto t0 = clock::now();
  std::vector<float> logits;
  double modeled_us = 0;
  for (size_t at = 0; at < prompt.size(); at += g_max_step) {
    const size_t n = std::min<size_t>(g_max_step, prompt.size() - at);
    StepStats st;
    const bool last = at + n == prompt.size();
    logits = e.step(
        {{1, {prompt.begin() + at, prompt.begin() + at + n}, static_cast<int32_t>(at), last}}, &st);
    modeled_us += st.modeled_us;
  }
  r.ttft_ms = ms_since(t0);
  r.modeled_ttft_ms = modeled_us / 1000.0;
  int32_t tok = argmax(logits);
  r.generated = 1;
  int pos = r.prompt_tokens;
  const auto t1 = clock::now();
  modeled_us = 0;
  while (r.generated < max_tokens && (ignore_eos || tok != eos) && pos + 1 < ctx) {
    StepStats st;
    tok = argmax(e.step({{1, {tok}, pos++, true}}, &st));
    modeled_us += st.modeled_us;
    ++r.generated;
  }
  if (r.generated > 1) {
    r.tpot_ms = ms_since(t1) / (r.generated - 1);
    r.modeled_tpot_ms = modeled_us / 1000.0 / (r.generated - 1);
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"duet stack benchmark: one generation, full stack or in-process, as JSON"};
  std::string model = "models/fortune-q8_0.gguf", plan = "gpu-only", stack;
  int prompt_len = 54, max_tokens = 64, max_ctx = 0, salt = 0;
  bool in_process = false;
  app.add_option("--model", model, "GGUF model")->capture_default_str();
  app.add_option("--plan", plan, "gpu-only, npu-only, layer (in-process); any plan (stack)")
      ->capture_default_str();
  app.add_option("--prompt", prompt_len, "prompt tokens (BOS included)")->capture_default_str();
  app.add_option("--prompt-salt", salt,
                 "shifts the synthetic prompt's ids (another salt: no prefix shared with salt 0)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--gen", max_tokens, "tokens to generate (stops early at EOS)")
      ->capture_default_str();
  bool ignore_eos = false;
  app.add_flag("--ignore-eos", ignore_eos, "EOS does not end the generation: exactly --gen tokens");
  app.add_option("--max-ctx", max_ctx, "positions per sequence (DUET_MAX_CTX; 0 = the model's)")
      ->capture_default_str();
  app.add_option("--stack", stack, "run through this running stack");
  app.add_flag("--in-process", in_process, "run all roles in this process");
  app.add_option("--max-step", g_max_step,
                 "in-process: the largest token bucket (prompt chunk), as the stack's")
      ->capture_default_str()
      ->check(CLI::Range(16, 4096));
  CLI11_PARSE(app, argc, argv);
  try {
    if (stack.empty() == !in_process)
      throw duet::Error(duet::Errc::invalid_argument, "give exactly one of --stack, --in-process");
    auto m = duet::LlamaModel::load(model);
    const auto prompt = synthetic_prompt(prompt_len, m->hp().n_vocab, m->vocab().bos, salt);
    m.reset();
    const Result r = in_process
                         ? run_in_process(model, plan, max_ctx, prompt, max_tokens, ignore_eos)
                         : run_stack(stack, plan, prompt, max_tokens, ignore_eos);
    nlohmann::json j = to_json(r);
    j["mode"] = in_process ? "in-process" : "stack";
    j["plan"] = plan;
    j["model"] = model;
    std::cout << j.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "stack_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
