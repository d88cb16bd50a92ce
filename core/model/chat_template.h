#pragma once
// Chat templates by family, the way llama.cpp formatted chats before it embedded a Jinja engine:
// a GGUF's tokenizer.chat_template (Jinja source) is recognised by substrings it contains, and
// each family's format is written out in code. The formatted text says which of its bytes are the
// template's own (the markers: "<|start_header_id|>", "[INST] ", "\n"...) and which are message
// content, so a tokenizer can recognise special tokens in the markers only: a user who types
// "<|eot_id|>" gets those characters, not an end of turn.
//
// Families (llama.cpp's names): llama3, llama2, llama2-sys, llama2-sys-bos, llama2-sys-strip,
// chatml (Qwen2, InternLM2), mistral-v1, mistral-v3, mistral-v3-tekken, mistral-v7,
// mistral-v7-tekken, gemma, zephyr. "mistral" names llama2, as it does in llama.cpp (whose
// heuristics send any template that starts with "mistral" down the [INST] branch).
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/model/tokenizer.h"

namespace duet {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct FormattedChat {
  std::string text;
  // The template's own bytes, in order, never overlapping: the only places special tokens may be
  // recognised (Tokenizer::encode_with_special_spans).
  std::vector<TextSpan> special_spans;
  // Where each message's content landed in `text` (after the family's trimming), one per message;
  // how a chat session finds the text that follows a reply it generated.
  std::vector<TextSpan> content_spans;
};

// The known family names, as listed in errors.
const std::vector<std::string>& chat_template_names();

// The family of `name_or_jinja`: a known family name as it is, else llama.cpp's substring
// heuristics on a Jinja source. Throws unsupported naming the known families when nothing matches
// (and what llama.cpp calls it when llama.cpp knows a family duet does not format).
std::string detect_chat_template(std::string_view name_or_jinja);

// Formats `messages` in `family` (a name from chat_template_names(), or anything
// detect_chat_template accepts). add_generation_prompt appends the assistant's header where the
// family has one. Throws invalid_argument for a role other than system, user and assistant.
FormattedChat apply_chat_template(std::string_view family, std::span<const ChatMessage> messages,
                                  bool add_generation_prompt);

// The template a request asks for: `forced` (a name, "" = none) or else the model's own Jinja
// source; throws invalid_argument when both are empty ("the model has no chat template; name one
// with --chat-template (known: ...)").
std::string resolve_chat_template(std::string_view forced, std::string_view model_template);

}  // namespace duet
