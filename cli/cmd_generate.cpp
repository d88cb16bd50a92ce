// duet generate --model M --local --max-tokens N [sampling options] "prompt": streams the
// continuation to stdout. The decoding loop only sees a GenerateBackend (prefill a prompt, then
// one token at a time), so running through the service stack (--stack) is another backend.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cli/command.h"
#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/model/chat_template.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/ops.h"
#include "core/model/sampling.h"
#include "core/model/tokenizer.h"

namespace {

struct GenerateArgs {
  std::string model = "models/fortune-q8_0.gguf";
  bool local = false;
  int max_tokens = 64;
  duet::SamplingParams sampling;
  int threads = 0;
  std::string prompt;
  // --stack: through a running stack's frontend (core/ipc/client.h), instead of --local.
  std::string stack;
  std::string priority = "reactive";
  std::string plan;
  std::string model_name;  // which of the stack's models ("" = its first)
  bool json = false;
  bool ignore_eos = false;  // fixed-length runs: EOS is kept, only --max-tokens ends it
  // --chat: the prompt is one user message, formatted with the model's chat template (or
  // --chat-template NAME), after --system's message when given.
  bool chat = false;
  std::string chat_template;
  std::string system;
  bool special = false;  // the prompt's special token texts become their ids (not with --chat)
  int logprobs = -1;     // --stack --json: the tokens' log-probabilities, and N likeliest
};

std::vector<duet::ChatMessage> chat_messages(const GenerateArgs& args) {
  std::vector<duet::ChatMessage> msgs;
  if (!args.system.empty()) msgs.push_back({"system", args.system});
  msgs.push_back({"user", args.prompt});
  return msgs;
}

void check_chat_flags(const GenerateArgs& args) {
  if (!args.chat && (!args.chat_template.empty() || !args.system.empty()))
    throw duet::Error(duet::Errc::invalid_argument, "--chat-template and --system need --chat");
  if (args.chat && args.special)
    throw duet::Error(duet::Errc::invalid_argument,
                      "--special reads special tokens in prompt text; with --chat only the "
                      "template's markers are special");
}

// The prompt's ids as the stack's frontend makes them: BOS as the vocab says; with --chat the
// formatted conversation, special tokens read in the template's markers only.
std::vector<int32_t> prompt_ids(const GenerateArgs& args, const duet::Tokenizer& tok,
                                const std::string& model_template) {
  if (!args.chat) {
    if (!args.special) return tok.encode(args.prompt, true);
    const duet::TextSpan whole{0, args.prompt.size()};
    return tok.encode_with_special_spans(args.prompt, true, {&whole, 1});
  }
  const std::string family = duet::resolve_chat_template(args.chat_template, model_template);
  const auto msgs = chat_messages(args);
  const duet::FormattedChat f = duet::apply_chat_template(family, msgs, true);
  return tok.encode_with_special_spans(f.text, true, f.special_spans);
}

// Appends tokens to the sequence and returns the logits after the last one.
using GenerateBackend = std::function<std::vector<float>(std::span<const int32_t> tokens)>;

struct GenerateStats {
  int prompt_tokens = 0, generated = 0;
  double prompt_s = 0, generate_s = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Decodes until an end-of-generation id (EOS, EOT; unless ignore_eos), max_tokens or a full
// context; each token's text goes to `emit` as soon as it is a whole UTF-8 character.
GenerateStats generate(const duet::Tokenizer& tok, const GenerateBackend& backend, int n_ctx,
                       const std::vector<int32_t>& prompt_ids, int max_tokens,
                       duet::SamplingParams sampling, bool ignore_eos,
                       const std::function<void(const std::string&)>& emit) {
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int>(prompt_ids.size());
  if (stats.prompt_tokens >= n_ctx) {
    throw duet::Error(duet::Errc::out_of_range, "prompt of " + std::to_string(stats.prompt_tokens) +
                                                    " tokens does not fit the context of " +
                                                    std::to_string(n_ctx));
  }
  duet::Sampler sampler(sampling);
  duet::Tokenizer::StreamDecoder stream(tok, tok.ends_in_text(prompt_ids));
  auto start = std::chrono::steady_clock::now();
  std::vector<float> logits = backend(prompt_ids);
  stats.prompt_s = seconds_since(start);
  start = std::chrono::steady_clock::now();
  int position = stats.prompt_tokens;
  while (stats.generated < max_tokens) {
    const int32_t id = sampler.sample(logits);
    if (tok.is_eog(id) && !ignore_eos) break;
    ++stats.generated;
    emit(stream.push(id));
    if (stats.generated == max_tokens || position >= n_ctx) break;
    logits = backend(std::span(&id, 1));
    ++position;
  }
  emit(stream.flush());
  stats.generate_s = seconds_since(start);
  return stats;
}

// --stack: the frontend tokenises, schedules and samples; this only streams what it sends.
void run_generate_through_stack(const GenerateArgs& args) {
  if (args.local)
    throw duet::Error(duet::Errc::invalid_argument, "--local and --stack exclude each other");
  duet::client::StackGenerateArgs a;
  a.stack_id = args.stack;
  a.json = args.json;
  if (args.chat) {
    a.request.messages = chat_messages(args);
    a.request.chat_template = args.chat_template;
  } else {
    a.request.prompt = args.prompt;
    a.request.parse_special = args.special;
  }
  a.request.max_tokens = args.max_tokens;
  a.request.sampling = args.sampling;
  a.request.priority = duet::client::parse_priority(args.priority);
  a.request.plan = args.plan;
  a.request.ignore_eos = args.ignore_eos;
  a.request.model = args.model_name;
  a.request.logprobs = args.logprobs;
  duet::client::run_generate_on_stack(a);
}

void run_generate(GenerateArgs args) {
  check_chat_flags(args);
  if (args.logprobs >= 0 && (args.stack.empty() || !args.json))
    throw duet::Error(duet::Errc::invalid_argument,
                      "--logprobs needs --stack and --json (they are printed in the JSON object)");
  if (!args.stack.empty()) return run_generate_through_stack(args);
  if (!args.local) {
    throw duet::Error(duet::Errc::invalid_argument,
                      "generate needs --local (run in-process); running through the service stack "
                      "is not wired yet");
  }
  if (args.max_tokens < 0)
    throw duet::Error(duet::Errc::invalid_argument, "--max-tokens must be >= 0");
  args.sampling.validate();
  if (args.threads > 0) duet::ops::set_num_threads(args.threads);
  const auto model = duet::LlamaModel::load(args.model);
  const duet::Tokenizer tok(model->vocab());
  duet::ReferenceForward fwd(*model);
  const GenerateBackend backend = [&](std::span<const int32_t> tokens) {
    return fwd.forward(tokens, false);
  };
  const GenerateStats stats =
      generate(tok, backend, fwd.n_ctx(), prompt_ids(args, tok, model->vocab().chat_template),
               args.max_tokens, args.sampling, args.ignore_eos, [](const std::string& text) {
                 std::fwrite(text.data(), 1, text.size(), stdout);
                 std::fflush(stdout);
               });
  std::printf("\n");
  std::fprintf(stderr, "prompt: %d tokens, %.1f tok/s; generated: %d tokens, %.1f tok/s\n",
               stats.prompt_tokens, stats.prompt_tokens / std::max(stats.prompt_s, 1e-9),
               stats.generated, stats.generated / std::max(stats.generate_s, 1e-9));
}

duet::cli::RegisterCommand register_generate([](CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand(
      "generate",
      "Generate text from a prompt, streaming it to stdout (BOS as the model's vocab says)");
  cmd->add_option("--model", args->model, "GGUF model")->capture_default_str();
  cmd->add_flag("--local", args->local, "Run in-process with the reference forward pass");
  cmd->add_option("--max-tokens", args->max_tokens,
                  "Stop after this many tokens (or at EOS / end of turn)")
      ->capture_default_str();
  cmd->add_option("--temperature", args->sampling.temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-k", args->sampling.top_k, "Keep the k most likely tokens (0 = all)")
      ->capture_default_str();
  cmd->add_option("--top-p", args->sampling.top_p, "Nucleus sampling threshold in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", args->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Compute threads (0: all cores)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--stack", args->stack,
                  "Run through this running stack's frontend (instead of --local)");
  cmd->add_option("--priority", args->priority, "With --stack: reactive or proactive")
      ->capture_default_str();
  cmd->add_option("--plan", args->plan, "With --stack: the plan the stack must be running");
  cmd->add_option("--model-name", args->model_name,
                  "With --stack: which of the stack's models (default: its first)");
  cmd->add_flag("--json", args->json, "With --stack: print text, ids and stats as one JSON object");
  cmd->add_option("--logprobs", args->logprobs,
                  "With --stack --json: each generated token's log-probability under the model's "
                  "distribution, and those of the N likeliest tokens (0-20)")
      ->check(CLI::Range(0, duet::kMaxTopLogprobs));
  cmd->add_flag("--ignore-eos", args->ignore_eos,
                "Keep generating past EOS: exactly --max-tokens tokens (fixed-length runs)");
  cmd->add_flag("--chat", args->chat,
                "The prompt is a user message, formatted with the model's chat template");
  cmd->add_option("--chat-template", args->chat_template,
                  "With --chat: the template family (llama3, llama2, chatml, mistral-v7, gemma, "
                  "zephyr, ...; default: the model's own)");
  cmd->add_option("--system", args->system, "With --chat: a system message before the prompt");
  cmd->add_flag("--special", args->special,
                "Special token texts in the prompt (<|eot_id|>, <s>...) become their ids");
  cmd->add_option("prompt", args->prompt, "Prompt text")->required();
  cmd->callback([args] { run_generate(*args); });
});

}  // namespace
