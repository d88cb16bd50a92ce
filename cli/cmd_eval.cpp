// duet eval --model M --ids "1 703 1975 ..." --logits-out F: the logits of every input position,
// little-endian float32, one row of n_vocab per position. Runs the reference forward pass
// in-process; a later backend (--stack/--plan) only has to provide another EvalBackend.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/ops.h"

namespace {

struct EvalArgs {
  std::string model = "models/fortune-q8_0.gguf";
  std::string ids;
  std::string logits_out;
  int threads = 0;
  // --stack: through a running stack's frontend (core/ipc/client.h); --model, when given, must be
  // the stack's model.
  std::string stack;
  std::string plan;
  std::string model_name;  // which of the stack's models ("" = its first)
  bool model_given = false;
};

// All logits [n_ids][n_vocab] of one sequence evaluated from an empty context.
using EvalBackend = std::function<std::vector<float>(const std::vector<int32_t>& ids)>;

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > INT32_MAX) {
      throw duet::Error(duet::Errc::invalid_argument, "--ids: \"" + word + "\" is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw duet::Error(duet::Errc::invalid_argument, "--ids: no token ids given");
  return ids;
}

void write_logits(const std::string& path, const std::vector<float>& logits) {
  static_assert(std::endian::native == std::endian::little,
                "logits files are little-endian float32");
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
  out.close();
  if (!out) throw duet::Error(duet::Errc::io, path + ": cannot write the logits file");
}

void run_eval(const EvalArgs& args) {
  if (args.threads > 0) duet::ops::set_num_threads(args.threads);
  const std::vector<int32_t> ids = parse_ids(args.ids);
  if (!args.stack.empty()) {
    duet::client::StackEvalArgs a;
    a.stack_id = args.stack;
    a.ids = ids;
    a.plan = args.plan;
    a.model_path = args.model_given ? args.model : "";
    a.model_name = args.model_name;
    a.logits_out = args.logits_out;
    duet::client::run_eval_on_stack(a);
    return;
  }
  if (!args.plan.empty())
    throw duet::Error(duet::Errc::invalid_argument,
                      "--plan needs --stack (the local eval runs the reference)");
  const auto model = duet::LlamaModel::load(args.model);
  const int n_vocab = model->hp().n_vocab;
  EvalBackend backend = [&](const std::vector<int32_t>& seq) {
    duet::ReferenceForward fwd(*model);
    return fwd.forward(seq, true);
  };
  const auto start = std::chrono::steady_clock::now();
  const std::vector<float> logits = backend(ids);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_logits(args.logits_out, logits);
  std::fprintf(stderr, "eval: %zu positions x %d logits -> %s (%.1f tok/s)\n", ids.size(), n_vocab,
               args.logits_out.c_str(), static_cast<double>(ids.size()) / seconds);
}

duet::cli::RegisterCommand register_eval([](CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  auto* cmd = app.add_subcommand(
      "eval",
      "Write the logits of every input position (little-endian float32, one row of "
      "n_vocab per position)");
  auto* model_opt = cmd->add_option("--model", args->model, "GGUF model")->capture_default_str();
  cmd->add_option("--stack", args->stack, "Run through this running stack's frontend");
  cmd->add_option("--model-name", args->model_name,
                  "With --stack: which of the stack's models (default: its first)");
  cmd->add_option("--plan", args->plan,
                  "With --stack: the plan to run (default: the stack's own): gpu-only, npu-only, "
                  "npu-only:online-prepare, npu-only:pipe, layer, tensor, auto or reference");
  cmd->add_option("--ids", args->ids, "Token ids, space separated (BOS is not added)")->required();
  cmd->add_option("--logits-out", args->logits_out, "Output file")->required();
  cmd->add_option("--threads", args->threads, "Compute threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([args, model_opt] {
    args->model_given = model_opt->count() > 0;
    run_eval(*args);
  });
});

}  // namespace
