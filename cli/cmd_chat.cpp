// duet chat --stack ID: an interactive chat over the stack's frontend. Each stdin line is one
// user message of a session, formatted by the frontend with the model's chat template (or
// --chat-template NAME); the frontend keeps the conversation and the KV cache between turns, so
// a turn prefills only the template's text after the last reply. The reply streams to stdout.
// --raw sends each line as prompt text instead (no template). The session is closed at end of
// input.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>

#include "cli/command.h"
#include "core/ipc/client.h"

namespace {

struct ChatArgs {
  std::string stack = "default";
  std::string run_dir;
  std::string priority = "reactive";
  duet::client::GenerateRequest request;
  int timeout_s = 600;
  std::string system;  // the first turn's system message ("" = none)
  bool raw = false;    // lines are prompt text, not chat messages
};

void run_chat(ChatArgs args) {
  using namespace duet::client;
  Client c(stack_endpoint(args.stack, args.run_dir));
  c.set_model(args.request.model);  // the session's model: its close names it too
  GenerateRequest turn = args.request;
  turn.priority = parse_priority(args.priority);
  turn.stream = true;
  std::random_device rd;
  turn.session = (uint64_t(rd()) << 32 | rd()) | 1;  // never 0 (= no session)
  const bool interactive = isatty(STDIN_FILENO);
  if (args.raw && (!args.system.empty() || !turn.chat_template.empty()))
    throw duet::Error(duet::Errc::invalid_argument,
                      "--raw sends lines as they are: it takes no --system or --chat-template");
  std::string line;
  bool first_turn = true;
  for (;;) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (args.raw) {
      turn.prompt = line;
    } else {
      turn.messages.clear();
      if (!args.system.empty() && first_turn) turn.messages.push_back({"system", args.system});
      turn.messages.push_back({"user", line});
    }
    first_turn = false;
    const GenerateResult r = c.generate(
        turn,
        [](const Chunk& chunk) {
          std::fwrite(chunk.text.data(), 1, chunk.text.size(), stdout);
          std::fflush(stdout);
          return true;
        },
        std::chrono::seconds(args.timeout_s));
    std::printf("\n");
    std::fflush(stdout);
    if (interactive)
      std::fprintf(stderr, "[%u tokens, TTFT %.1f ms, %.1f tok/s, %s]\n", r.stats.generated_tokens,
                   r.stats.ttft_ms, r.stats.tpot_ms > 0 ? 1000.0 / r.stats.tpot_ms : 0.0,
                   r.stats.finish_reason.c_str());
  }
  try {
    c.close_session(turn.session);
  } catch (const duet::Error& e) {
    if (e.code() != duet::Errc::not_found) throw;  // no turn was ever taken
  }
}

duet::cli::RegisterCommand register_chat([](CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  auto* cmd = app.add_subcommand(
      "chat",
      "Chat with a running stack: each stdin line is a user message, formatted with the model's "
      "chat template; the KV cache is kept between turns");
  cmd->add_option("--stack", args->stack, "stack id")->capture_default_str();
  cmd->add_option("--model-name", args->request.model,
                  "which of the stack's models (default: its first)");
  cmd->add_option("--run-dir", args->run_dir, "run directory (default: from the stack id)");
  cmd->add_option("--max-tokens", args->request.max_tokens, "tokens per reply at most")
      ->capture_default_str();
  cmd->add_option("--temperature", args->request.sampling.temperature, "0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", args->request.sampling.top_k, "0 = all tokens")->capture_default_str();
  cmd->add_option("--top-p", args->request.sampling.top_p, "nucleus threshold in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", args->request.sampling.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--priority", args->priority, "reactive or proactive")->capture_default_str();
  cmd->add_option("--plan", args->request.plan,
                  "plan the stack must be running (default: its own)");
  cmd->add_option("--stop", args->request.stop, "stop strings (repeatable)");
  cmd->add_option("--timeout", args->timeout_s, "seconds one reply may take")
      ->capture_default_str();
  cmd->add_option("--chat-template", args->request.chat_template,
                  "chat template family (llama3, llama2, chatml, mistral-v7, gemma, zephyr, ...; "
                  "default: the model's own)");
  cmd->add_option("--system", args->system, "system message of the conversation");
  cmd->add_flag("--raw", args->raw, "send each line as prompt text, without a chat template");
  cmd->callback([args] { run_chat(*args); });
});

}  // namespace
