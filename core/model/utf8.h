#pragma once
// UTF-8 helpers the tokenizers share.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace duet::utf8 {

inline bool is_trail_byte(uint8_t b) {
  return (b & 0xc0) == 0x80;
}

// Bytes a UTF-8 sequence with this lead byte claims (1 for a stray trail byte or 0xf8..0xff,
// which then fail validation).
inline size_t claimed_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

// Length of the valid UTF-8 character at the start of s, or 0 if it is not one (truncated,
// overlong, a surrogate, above U+10FFFF, a stray byte): sentencepiece's IsValidDecodeUTF8.
size_t valid_len(std::string_view s);

// Whether s starts with the beginning of a character that more bytes could still complete
// (a lead byte followed only by trail bytes, fewer than it claims).
bool is_incomplete_prefix(std::string_view s);

// Decodes a run of raw bytes as UTF-8 into out, each invalid byte becoming U+FFFD
// (sentencepiece's decoder). Unless `final`, stops before a tail that is an unfinished but so far
// valid character, so that more bytes can complete it. Returns the number of bytes consumed.
size_t decode_replacing_invalid(std::string_view bytes, bool final, std::string& out);

// The length of the longest prefix of `bytes` that does not end inside a character that more
// bytes could complete (invalid bytes count as whole: they are passed through as they are).
size_t complete_prefix_len(std::string_view bytes);

void append_codepoint(std::string& out, uint32_t cp);  // cp <= 0x10ffff (surrogates too)

}  // namespace duet::utf8
