#include "core/chat_tokens.h"

#include <string>

#include "core/gguf.h"

namespace duet {

std::vector<int32_t> encode_with_specials(const Tokenizer& tok, std::string_view text,
                                          bool add_special,
                                          std::span<const TextSpan> special_spans) {
  const Vocab& v = tok.vocab();
  std::vector<std::string_view> specials;  // control pieces, the texts a span may hold
  for (size_t id = 0; id < v.pieces.size(); ++id)
    if (v.types[id] == static_cast<int32_t>(TokenType::control) && !v.pieces[id].empty())
      specials.push_back(v.pieces[id]);
  std::vector<int32_t> out;
  if (add_special) out.push_back(tok.bos());
  size_t fragment = 0;  // start of the text not yet encoded
  const auto flush = [&](size_t end) {
    if (end > fragment) {
      const auto ids = tok.encode(text.substr(fragment, end - fragment), false);
      out.insert(out.end(), ids.begin(), ids.end());
    }
  };
  for (const TextSpan& span : special_spans) {
    for (size_t at = span.begin; at < span.end && at < text.size();) {
      size_t best = 0;  // longest special starting here, inside the span
      for (const auto s : specials)
        if (s.size() > best && at + s.size() <= span.end && text.substr(at, s.size()) == s)
          best = s.size();
      if (best == 0) {
        ++at;
        continue;
      }
      flush(at);
      out.push_back(tok.piece_to_id(text.substr(at, best)));
      at += best;
      fragment = at;
    }
  }
  flush(text.size());
  return out;
}

std::string chat_template_of(const GgufFile& f) {
  return f.has("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : "";
}

bool is_end_of_generation(const Tokenizer& tok, int32_t id) {
  return id == tok.eos();
}

}  // namespace duet
