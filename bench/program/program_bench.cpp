// Program registration before and after symbolic shapes (issue 24 item 2, Transformer-Lite):
// for each plan and each program mode (per-bucket: one program per token bucket, as before;
// symbolic: one per model and distinct plan, offsets evaluated per step), builds a ProgramEngine
// over in-process GpuService/NpuService objects (the same control messages as the stack, the
// stack's buckets 1, 4, 16, 64 and 16 sequences) and reports programs registered, registration
// time, arena bytes, NPU graphs compiled and, given --kcache (PoCL's cache dir, fresh per run),
// the PoCL kernel binaries compiled; then one greedy generation, whose ids are printed so the
// modes can be compared token for token. One JSON line per (plan, mode).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "core/base/error.h"
#include "core/model/model.h"
#include "core/planner/plan_store.h"
#include "core/planner/soc_profile.h"
#include "services/device/program_memory.h"
#include "services/frontend/program_engine.h"
#include "services/gpu_svc/gpu_service.h"
#include "services/npu_svc/npu_service.h"

namespace {

using namespace duet;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// PoCL's compiled kernel binaries (one per kernel and work-group specialisation) under `dir`.
size_t kcache_binaries(const std::string& dir) {
  if (dir.empty() || !std::filesystem::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".so") ++n;
  return n;
}

int32_t argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

nlohmann::json run(const std::string& model, const std::string& plan, bool per_bucket,
                   const std::string& kcache, int prompt_tokens, int decode_tokens, int max_ctx) {
  const SocProfile soc = load_soc_profile("sd8gen3");
  const size_t kcache_before = kcache_binaries(kcache);
  gpu::GpuService gpu(gpu::shared_device(), soc, ShmMemoryResolver("gpu_svc"));
  npu::NpuService npu(soc, 0, ShmMemoryResolver("npu_svc"));
  frontend::ProgramEngineOptions o;
  o.model_path = model;
  o.stack_id = "progbench" + std::to_string(getpid());
  o.plan_name = plan;
  o.segment_tag =
      std::string(per_bucket ? "b" : "s") + std::to_string(std::hash<std::string>{}(plan) % 1000);
  o.buckets = {1, 4, 16, 64};  // the stack's (make_stack_engine)
  o.max_seqs = 16;
  o.max_ctx = static_cast<uint32_t>(max_ctx);
  o.per_bucket_programs = per_bucket;
  if (plan == "tensor") o.plan_for = [model](uint32_t b) { return modeled_plan_for(model, b); };
  const auto t0 = Clock::now();
  frontend::ProgramEngine e(o, LlamaModel::load(model),
                            frontend::make_local_service_link("gpu", gpu),
                            frontend::make_local_service_link("npu", npu));
  const double engine_ms = ms_since(t0);
  // The arena before symbolic programs (main 54cb9de's ArenaPlan): twelve named slots at the
  // largest bucket, each 64-aligned, reused layer after layer by the same tensor of each layer.
  const LlamaHparams& hp = e.model().hp();
  const uint64_t n = o.buckets.back(), seqs = o.max_seqs;
  const uint64_t pages = (static_cast<uint64_t>(max_ctx) + 15) / 16;
  auto aligned = [](uint64_t b) { return (b + 63) / 64 * 64; };
  const uint64_t e_ = hp.n_embd, q = uint64_t(hp.n_head) * hp.head_dim,
                 kv = uint64_t(hp.n_head_kv) * hp.head_dim, ff = hp.n_ff;
  const uint64_t named_slots = aligned(n * 16) + aligned(seqs * pages * 4) +
                               3 * aligned(n * e_ * 4) + 2 * aligned(n * q * 4) +
                               2 * aligned(n * kv * 4) + 2 * aligned(n * ff * 4) +
                               aligned(seqs * uint64_t(hp.n_vocab) * 4);
  const auto reg = e.registration();
  const nlohmann::json npu_status = npu.status_json();

  // One greedy generation: the prompt in chunks of the largest bucket, then one token a step.
  const int n_vocab = e.model().hp().n_vocab;
  std::vector<int32_t> prompt{e.model().vocab().bos};
  for (int i = 1; i < prompt_tokens; ++i) prompt.push_back(3 + (i * 37) % (n_vocab - 3));
  e.open_seq(1, max_ctx);
  std::vector<float> logits;
  const auto p0 = Clock::now();
  for (size_t at = 0; at < prompt.size(); at += 64) {
    const size_t n = std::min<size_t>(64, prompt.size() - at);
    const bool last = at + n == prompt.size();
    logits = e.step(
        {{1, {prompt.begin() + at, prompt.begin() + at + n}, static_cast<int>(at), last}}, nullptr);
  }
  const double prefill_ms = ms_since(p0);
  std::vector<int32_t> ids{argmax(logits)};
  const auto d0 = Clock::now();
  for (int i = 1; i < decode_tokens; ++i) {
    logits = e.step({{1, {ids.back()}, static_cast<int>(prompt.size()) + i - 1, true}}, nullptr);
    ids.push_back(argmax(logits));
  }
  const double decode_ms = ms_since(d0);
  e.close_seq(1);
  nlohmann::json j = {{"model", std::filesystem::path(model).filename().string()},
                      {"plan", plan},
                      {"mode", per_bucket ? "per-bucket" : "symbolic"},
                      {"programs", reg.programs},
                      {"register_calls", reg.registered},
                      {"build_ms", reg.build_ms},
                      {"register_ms", reg.register_ms},
                      {"engine_ms", engine_ms},
                      {"arena_bytes", reg.arena_bytes},
                      {"arena_bytes_named_slots", named_slots},
                      {"npu_graphs", npu_status["graphs_cached"]},
                      {"prefill_tokens", prompt.size()},
                      {"prefill_ms", prefill_ms},
                      {"decode_ms_per_token", decode_ms / std::max(1, decode_tokens - 1)},
                      {"ids", ids},
                      {"status_programs", e.status()["programs"]}};
  if (!kcache.empty()) j["pocl_binaries_compiled"] = kcache_binaries(kcache) - kcache_before;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Program registration: per-bucket against symbolic programs"};
  std::string model, kcache;
  std::vector<std::string> plans = {"gpu-only", "npu-only", "layer", "tensor"};
  std::vector<std::string> modes = {"per-bucket", "symbolic"};
  int prompt = 40, decode = 16, max_ctx = 512;
  app.add_option("--model", model, "GGUF file")->required();
  app.add_option("--plans", plans, "plans")->delimiter(',');
  app.add_option("--modes", modes, "per-bucket, symbolic")->delimiter(',');
  app.add_option("--kcache", kcache, "PoCL's cache dir, to count the kernel binaries compiled");
  app.add_option("--prompt", prompt, "prompt tokens");
  app.add_option("--decode", decode, "generated tokens");
  app.add_option("--max-ctx", max_ctx, "positions per sequence");
  CLI11_PARSE(app, argc, argv);
  try {
    for (const std::string& plan : plans)
      for (const std::string& mode : modes) {
        if (mode != "per-bucket" && mode != "symbolic")
          throw Error(Errc::invalid_argument, "mode '" + mode + "' (per-bucket or symbolic)");
        std::cout << run(model, plan, mode == "per-bucket", kcache, prompt, decode, max_ctx).dump()
                  << std::endl;
      }
  } catch (const std::exception& e) {
    std::cerr << "program_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
