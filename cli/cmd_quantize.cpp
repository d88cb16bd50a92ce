// duet quantize IN.gguf OUT.gguf --type T [--threads N] [--pure] [--json]: rewrite a GGUF of
// F32/F16/BF16 matrices in a quantisation preset with llama.cpp's per-tensor mixing rules
// (core/model/quant_mix.h, core/model/quantize_file.h).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "core/model/quant_mix.h"
#include "core/model/quantize_file.h"

namespace {

struct QuantizeArgs {
  std::string in, out, type;
  int threads = 2;
  bool pure = false;
  bool json = false;
};

// A one-line bar redrawn in place on a terminal; nothing when stderr is a file or pipe.
void draw_progress(uint64_t done, uint64_t total, const std::string& tensor) {
  constexpr int kWidth = 30;
  const double f = total ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const int filled = static_cast<int>(f * kWidth);
  std::string bar(static_cast<size_t>(filled), '=');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "\r[%s] %3.0f%% %-40.40s", bar.c_str(), 100.0 * f, tensor.c_str());
  if (done >= total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

void run_quantize(const QuantizeArgs& args) {
  duet::QuantizeOptions o;
  o.type = args.type;
  o.pure = args.pure;
  o.n_threads = args.threads;
  if (::isatty(STDERR_FILENO)) o.progress = draw_progress;
  const auto start = std::chrono::steady_clock::now();
  const duet::QuantizeReport r = duet::quantize_file(args.in, args.out, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (args.json) {
    nlohmann::json j;
    j["in"] = args.in;
    j["out"] = args.out;
    j["type"] = duet::quant_preset(args.type).name;
    j["pure"] = args.pure;
    j["file_type"] = r.file_type;
    j["in_bytes"] = r.in_bytes;
    j["out_bytes"] = r.out_bytes;
    j["seconds"] = seconds;
    j["tensors"] = nlohmann::json::array();
    for (const auto& t : r.tensors)
      j["tensors"].push_back({{"name", t.name},
                              {"dims", t.dims},
                              {"from", std::string(duet::dtype_name(t.from))},
                              {"to", std::string(duet::dtype_name(t.to))},
                              {"rmse", t.rmse},
                              {"bytes", t.bytes}});
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  std::printf("wrote %s: %s, %zu tensors, %.1f MB -> %.1f MB in %.2f s\n", args.out.c_str(),
              std::string(duet::quant_preset(args.type).name).c_str(), r.tensors.size(),
              static_cast<double>(r.in_bytes) / 1e6, static_cast<double>(r.out_bytes) / 1e6,
              seconds);
}

duet::cli::RegisterCommand register_quantize([](CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  std::string types;
  for (const auto& n : duet::quant_preset_names()) types += (types.empty() ? "" : ", ") + n;
  auto* cmd = app.add_subcommand(
      "quantize",
      "Quantise a GGUF of F32/F16/BF16 matrices (metadata copied, general.file_type set); "
      "q4_k_m/q5_k_m mix types per tensor as llama.cpp does (core/model/quant_mix.h)");
  cmd->add_option("in", args->in, "Input GGUF (F32/F16/BF16 matrices)")->required();
  cmd->add_option("out", args->out, "Output GGUF")->required();
  cmd->add_option("--type", args->type, "Preset: " + types)->required();
  cmd->add_option("--threads", args->threads, "Quantiser threads")->capture_default_str();
  cmd->add_flag("--pure", args->pure,
                "Every matrix the preset's base type (no per-tensor rules; fallbacks stay)");
  cmd->add_flag("--json", args->json,
                "Print a JSON report (per-tensor types and RMSE against the source) to stdout");
  cmd->callback([args] { run_quantize(*args); });
});

}  // namespace
