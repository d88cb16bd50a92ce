// duet mkmodel --shape S [--arch A] [--vocab N|FILE.gguf] --type T --out F: a synthetic GGUF with a
// real model's shape and random weights, for benchmarks and tests (core/model/shapes.h).
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/model/arch.h"
#include "core/model/quant_mix.h"
#include "core/model/shapes.h"

namespace {

constexpr const char* kTypeNames =
    "f16, q8_0, q4_0, f32, q4_k_m, q5_k_m, q6_k, q4_k, q5_k, q4_1, q5_0, q5_1, bf16";

struct MkmodelArgs {
  std::string arch = "llama";
  std::string shape;
  std::string type = "q4_0";
  std::string out;
  std::string vocab = "0";  // a size (all digits) or a GGUF to copy the tokenizer from
  int layers = 0;
  int ctx = 0;
  uint64_t seed = 1;
  int threads = 2;
  float weight_std = 0.02f;
  float rope_scale_linear = 0.0f;
};

// f32, f16, q8_0, q4_0: every matrix that type (the files these names always made). Any other
// name is a core/model/quant_mix.h preset: q4_k_m, q5_k_m, q6_k with llama.cpp's per-tensor rules;
// q4_k, q5_k, q4_1, q5_0, q5_1, bf16 pure (every matrix that type, with llama.cpp's fallback
// for rows that are not whole 256-weight super-blocks).
void set_type(std::string name, duet::SyntheticModelOptions& o) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (name == "f32")
    o.type = duet::DType::F32;
  else if (name == "f16")
    o.type = duet::DType::F16;
  else if (name == "q8_0")
    o.type = duet::DType::Q8_0;
  else if (name == "q4_0")
    o.type = duet::DType::Q4_0;
  else if (name == "q4_k_m" || name == "q5_k_m" || name == "q6_k")
    o.preset = name;
  else if (name == "q4_k" || name == "q5_k" || name == "q4_1" || name == "q5_0" || name == "q5_1" ||
           name == "bf16") {
    o.preset = name;
    o.preset_rules = false;
  } else
    throw duet::Error(duet::Errc::invalid_argument,
                      "unknown type '" + name + "' (" + std::string(kTypeNames) + ")");
}

void run_mkmodel(const MkmodelArgs& args) {
  const duet::ModelShape& shape = duet::model_shape(args.shape);
  duet::SyntheticModelOptions options;
  options.arch = duet::parse_arch(args.arch);
  set_type(args.type, options);
  const bool is_size =
      !args.vocab.empty() && std::all_of(args.vocab.begin(), args.vocab.end(),
                                         [](unsigned char c) { return std::isdigit(c); });
  if (is_size) {
    if (args.vocab.size() > 9)
      throw duet::Error(duet::Errc::invalid_argument, "--vocab " + args.vocab + " is too large");
    options.n_vocab = std::stoi(args.vocab);
  } else {
    options.vocab_gguf = args.vocab;
  }
  options.n_layer = args.layers;
  options.n_ctx = args.ctx;
  options.seed = args.seed;
  options.n_threads = args.threads;
  options.weight_std = args.weight_std;
  options.rope_scale_linear = args.rope_scale_linear;
  const auto start = std::chrono::steady_clock::now();
  duet::write_synthetic_model(shape, options, args.out);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  struct stat st {};
  const double mb =
      ::stat(args.out.c_str(), &st) == 0 ? static_cast<double>(st.st_size) / 1e6 : 0.0;
  std::printf("wrote %s: %s %s %s, %.1f MB in %.2f s (%.0f MB/s)\n", args.out.c_str(),
              args.arch.c_str(), shape.name.c_str(),
              options.preset.empty() ? std::string(duet::dtype_name(options.type)).c_str()
                                     : options.preset.c_str(),
              mb, seconds, seconds > 0 ? mb / seconds : 0.0);
}

duet::cli::RegisterCommand register_mkmodel([](CLI::App& app) {
  auto args = std::make_shared<MkmodelArgs>();
  std::string shapes;
  for (const auto& name : duet::model_shape_names()) shapes += (shapes.empty() ? "" : ", ") + name;
  auto* cmd = app.add_subcommand("mkmodel",
                                 "Write a synthetic Llama GGUF with a real model's shape and "
                                 "random weights (std 0.02, norms 1).\n"
                                 "The vocabulary is synthetic and by default SMALL (" +
                                     std::to_string(duet::kDefaultSyntheticVocab) +
                                     " pieces, or the shape's own if smaller): token_embd/output "
                                     "are that small unless --vocab "
                                     "gives the real size.");
  cmd->add_option("--shape", args->shape, "Model shape: " + shapes)->required();
  cmd->add_option(
         "--arch", args->arch,
         "Architecture: llama, qwen2 (q/k/v biases, NEOX rope), internlm2 or gemma (GeGLU, "
         "embeddings x sqrt(n_embd), output tied, NEOX rope)")
      ->capture_default_str();
  cmd->add_option("--type", args->type,
                  std::string("Matrix type: ") + kTypeNames +
                      " (norms are always f32). q4_k_m, q5_k_m and q6_k mix types per tensor as "
                      "llama.cpp's quantiser does (core/model/quant_mix.h); the others are pure")
      ->capture_default_str();
  cmd->add_option("--out", args->out, "Output GGUF path")->required();
  cmd->add_option("--vocab", args->vocab,
                  "Vocab size of the synthetic SentencePiece vocabulary (0: min(4096, the "
                  "shape's)), or a GGUF whose tokenizer (every tokenizer.* key, chat template "
                  "included) is copied")
      ->capture_default_str();
  cmd->add_option("--layers", args->layers, "Number of layers (0: the shape's)")
      ->capture_default_str();
  cmd->add_option("--ctx", args->ctx,
                  "Context length written to the file (0: min(8192, the shape's))")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "PRNG seed (same seed, same file)")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Generator threads")->capture_default_str();
  cmd->add_option("--rope-scale-linear", args->rope_scale_linear,
                  "Linear RoPE scaling factor written as <arch>.rope.scaling.type/factor (0: none)")
      ->capture_default_str();
  cmd->add_option("--std", args->weight_std,
                  "Standard deviation of the random matrices (biases get 5x; larger values make "
                  "attention, rope and biases move the logits more)")
      ->capture_default_str();
  cmd->callback([args] { run_mkmodel(*args); });
});

}  // namespace
