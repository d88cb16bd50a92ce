#pragma once
// Chat messages of a Generate request into prompt tokens. Without a session the messages are the
// whole conversation: formatted with the generation prompt and tokenised with BOS as the vocab
// says. In a session the frontend keeps the conversation (each turn's messages and the reply it
// generated) and a turn's prompt is what the template writes after the last reply: the reply's
// own tokens are in the KV already, as is its end-of-turn token when the model sampled one (the
// session's pending token), so the turn's text starts after that marker, or at it when the reply
// ended any other way (length, stop).
//
// Why a delta and not the longest common token prefix of the re-tokenised conversation: the KV
// holds the tokens the model sampled, which need not be how the reply's text re-tokenises, and
// the template trims some replies (llama3, gemma); a delta never discards or recomputes KV.
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/model/chat_template.h"
#include "core/model/tokenizer.h"
#include "schemas/client_generated.h"

namespace duet::frontend {

// What a chat session remembers between turns.
struct ChatHistory {
  std::string family;                 // the template of its first turn
  std::vector<ChatMessage> messages;  // every turn's messages and replies, in order
};

// The messages of `g`, checked: each has a role and content, valid UTF-8, and their content
// totals at most max_bytes. Throws invalid_argument / out_of_range naming the message.
std::vector<ChatMessage> read_chat_messages(const fb::client::Generate& g, size_t max_bytes);

// The prompt ids of a chat turn. `history` null: no session, or its first turn. `pending`: the
// session's last sampled token not yet in the KV (prepended by the caller). `add_special`: the
// sequence is empty (BOS as the vocab says).
std::vector<int32_t> chat_turn_ids(const Tokenizer& tok, const std::string& family,
                                   const ChatHistory* history, std::optional<int32_t> pending,
                                   std::span<const ChatMessage> turn, bool add_special);

}  // namespace duet::frontend
