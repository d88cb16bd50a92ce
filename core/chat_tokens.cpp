#include "core/chat_tokens.h"

#include <string>

#include "core/gguf.h"

namespace duet {

std::vector<int32_t> encode_with_specials(const Tokenizer& tok, std::string_view text,
                                          bool add_special,
                                          std::span<const TextSpan> special_spans) {
  return tok.encode_with_special_spans(text, add_special, special_spans);
}

std::string chat_template_of(const GgufFile& f) {
  return f.has("tokenizer.chat_template") ? f.get_string("tokenizer.chat_template") : "";
}

bool is_end_of_generation(const Tokenizer& tok, int32_t id) {
  return tok.is_eog(id);
}

}  // namespace duet
