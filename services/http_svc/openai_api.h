#pragma once
// OpenAI's request and response shapes (POST /v1/completions, /v1/chat/completions), mapped to
// and from the client API (core/ipc/client.h). Parsing is strict where a value would change the
// output (a bad type, an n other than 1, a penalty we do not apply: 400 naming the field) and
// lenient where it would not (unknown fields, "user"), as OpenAI's own server is.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/ipc/client.h"

namespace duet::http {

// An HTTP error in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string message, std::string param = "",
           std::string code = "")
      : std::runtime_error(message),
        status_(status),
        type_(std::move(type)),
        param_(std::move(param)),
        code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  nlohmann::json to_json() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

ApiError bad_request(const std::string& param, const std::string& message);
// A frontend error (duet::Error) as its HTTP status: invalid input 400, busy 429, a peer down or
// a deadline 503, not_found 404, anything else 500.
ApiError from_duet_error(const Error& e);

struct ChatMessage {
  std::string role, content;
};

enum class Endpoint { completions, chat };

struct CompletionRequest {
  Endpoint endpoint = Endpoint::completions;
  std::string model;  // as the client named it ("" = the stack's)
  client::GenerateRequest generate;
  std::vector<ChatMessage> messages;  // chat
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions' echo: the reply's text starts with the prompt's, and its logprobs (when asked
  // for) with the prompt tokens' (the first's null); max_tokens may be 0. Not with stream.
  bool echo = false;
  // Completions' batch of prompts (several strings or token-id arrays): the prompts after the
  // first, each a request of its own, run side by side in the stack; choices[i] is prompt i's.
  // Not with stream.
  std::vector<client::GenerateRequest> more;
};

// Parses a request body. `header_priority` is X-Duet-Priority ("" when absent); the body's
// "priority" field wins when both are given. Throws ApiError (400) naming the field.
CompletionRequest parse_completion_request(Endpoint endpoint, const std::string& body,
                                           const std::string& header_priority);

// Hands the chat messages to the frontend, which formats them with the model's chat template.
void apply_chat_messages(CompletionRequest& r);

// OpenAI's finish_reason for the frontend's ("eos"/"stop" -> "stop", "length" -> "length").
std::string finish_reason(const std::string& duet_reason);

nlohmann::json usage_json(const client::Stats& s);

// A whole (non-streamed) response: one choice per result (a batch's, in prompt order).
nlohmann::json completion_response(const CompletionRequest& req, const std::string& id,
                                   int64_t created, const std::string& model,
                                   const std::vector<client::GenerateResult>& results);

// One streamed chunk: text (may be empty), finish_reason (null when empty), and usage when
// given (the last chunk when stream_options.include_usage; choices is then empty as OpenAI's).
// logprobs: those of the chunk's tokens (none: null); text_offset: where the chunk's text starts
// in the completion (code points), advanced past its tokens (completions' text_offset).
nlohmann::json stream_chunk(const CompletionRequest& req, const std::string& id, int64_t created,
                            const std::string& model, const std::string& text,
                            const std::string& finish, bool first,
                            const std::vector<client::TokenLogprob>& logprobs, size_t& text_offset);
// OpenAI's logprobs object of a choice for these tokens (null when the request asked for none):
// completions {tokens, token_logprobs, top_logprobs, text_offset}, chat {content: [{token,
// logprob, bytes, top_logprobs}]}. Log-probabilities are the model's own distribution's (no
// temperature, top-k or top-p), as vLLM's; a token's text replaces bytes of a partial UTF-8
// character with U+FFFD ("bytes" keeps them).
nlohmann::json logprobs_json(const CompletionRequest& req,
                             const std::vector<client::TokenLogprob>& lps, size_t& text_offset);
nlohmann::json usage_chunk(const CompletionRequest& req, const std::string& id, int64_t created,
                           const std::string& model, const client::Stats& s);

}  // namespace duet::http
