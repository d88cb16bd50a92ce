#pragma once
// Tokenising text whose special tokens may only come from known places (a chat template's
// markers, or the whole text when a caller asks for parse_special), and the end-of-generation
// test every decoding loop uses: Tokenizer::encode_with_special_spans and Tokenizer::is_eog.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer.h"

namespace duet {

// As llama.cpp's tokenizer with parse_special, but special (control) pieces are recognised only
// inside `special_spans`: the text between two recognised specials is one fragment, encoded as
// plain text; BOS first when add_special and the vocab adds one.
std::vector<int32_t> encode_with_specials(const Tokenizer& tok, std::string_view text,
                                          bool add_special,
                                          std::span<const TextSpan> special_spans);

// tokenizer.chat_template of a model file ("" when it has none).
std::string chat_template_of(const GgufFile& f);

// Whether `id` ends a generation (EOS, EOT and the vocab's other end-of-generation tokens).
bool is_end_of_generation(const Tokenizer& tok, int32_t id);

}  // namespace duet
