#include "services/frontend/chat_turn.h"

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

std::vector<ChatMessage> read_chat_messages(const fb::client::Generate& g, size_t max_bytes) {
  std::vector<ChatMessage> out;
  size_t total = 0;
  const auto* msgs = g.messages();
  for (flatbuffers::uoffset_t i = 0; msgs && i < msgs->size(); ++i) {
    const auto* m = msgs->Get(i);
    const std::string where = "chat message " + std::to_string(i);
    if (!m || !m->role() || !m->content())
      throw Error(Errc::invalid_argument, where + " needs a role and a content");
    total += m->content()->size();
    if (total > max_bytes)
      throw Error(Errc::out_of_range, "chat messages exceed the prompt limit of " +
                                          std::to_string(max_bytes) + " bytes");
    if (const size_t bad = invalid_utf8_at(m->content()->string_view());
        bad != std::string_view::npos)
      throw Error(Errc::invalid_argument,
                  where + " is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
    out.push_back({m->role()->str(), m->content()->str()});
  }
  return out;
}

std::vector<int32_t> chat_turn_ids(const Tokenizer& tok, const std::string& family,
                                   const ChatHistory* history, std::optional<int32_t> pending,
                                   std::span<const ChatMessage> turn, bool add_special) {
  if (!history || history->messages.empty()) {
    const FormattedChat f = apply_chat_template(family, turn, true);
    return tok.encode_with_special_spans(f.text, add_special, f.special_spans);
  }
  std::vector<ChatMessage> all = history->messages;
  all.insert(all.end(), turn.begin(), turn.end());
  const FormattedChat before = apply_chat_template(family, history->messages, false);
  const FormattedChat now = apply_chat_template(family, all, true);
  // The KV holds the conversation up to the end of the last reply's content.
  size_t start = before.content_spans.back().end;
  if (now.text.compare(0, start, before.text, 0, start) != 0)
    throw Error(Errc::invalid_argument,
                "these messages change how the session's earlier turns are formatted in the '" +
                    family + "' template (a system message can only open a conversation)");
  // A reply that ended with its end-of-turn token has that marker in the KV already.
  if (pending && tok.is_eog(*pending)) {
    const std::string& piece = tok.vocab().pieces[static_cast<size_t>(*pending)];
    if (!piece.empty() && now.text.compare(start, piece.size(), piece) == 0) start += piece.size();
  }
  std::vector<TextSpan> spans;
  for (const TextSpan& s : now.special_spans) {
    if (s.end <= start) continue;
    spans.push_back({std::max(s.begin, start) - start, s.end - start});
  }
  return tok.encode_with_special_spans(std::string_view(now.text).substr(start), add_special,
                                       spans);
}

}  // namespace duet::frontend
