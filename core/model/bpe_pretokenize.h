#pragma once
// The pre-tokenizer of byte-level BPE vocabs: splits a text into the words that BPE merges
// within, by the regexes llama.cpp uses for each tokenizer.ggml.pre. Internal to the Tokenizer.
//
// The regexes run on PCRE2 (UTF + UCP, JIT): \p{L} and \p{N} come from PCRE2's Unicode tables.
// `\s` is not PCRE2's: llama.cpp's whitespace is its own list (White_Space, which includes
// U+0085, unlike PCRE2's \s), so the patterns spell that list out. Lookaheads such as
// `\s+(?!\S)` need no emulation: each pattern runs on one piece at a time (the subject ends
// where the piece ends), which is exactly how llama.cpp's hand-written splitters for the gpt2,
// llama3 and qwen2 regexes treat the end of a piece.
//
// Text bytes first go through llama.cpp's UTF-8 reading (unicode_cpts_from_utf8): a byte that
// does not start a well-formed sequence (a stray continuation byte, 0xF8..0xFF, a truncated
// sequence) becomes U+FFFD, whose three bytes are then what BPE sees; overlong forms are read as
// the code point they spell (C0 80 is U+0000) and surrogates are kept. A sequence spelling a
// code point above U+10FFFF makes llama.cpp throw through its C API (the process dies); duet
// reads it as one U+FFFD instead (documented replacement).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace duet {

struct PreTokenizerInfo {
  std::string_view name;
  int family;          // which pattern list (bpe_pretokenize.cpp)
  bool ignore_merges;  // a word that is a whole token is that token (llama.cpp's ignore_merges)
  bool add_bos;        // llama.cpp's add_bos default for it
};

// The entry for a tokenizer.ggml.pre value ("" reads as "default", as llama.cpp), or nullptr.
const PreTokenizerInfo* find_pretokenizer(std::string_view pre);
std::string known_pretokenizer_names();  // "default, gpt-2, ..." for error messages

// llama.cpp's reading of raw bytes (see above). Returns false and leaves `canonical` untouched
// when text is well-formed UTF-8 already (then it is its own canonical form). `regex_view` gets
// the same bytes with each surrogate replaced by U+FFFD (same length), so PCRE2 accepts it.
bool canonicalize_utf8(std::string_view text, std::string& canonical, std::string& regex_view);

class PreTokenizer {
 public:
  explicit PreTokenizer(const PreTokenizerInfo& info);  // compiles the patterns (PCRE2 JIT)
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits text (well-formed UTF-8, as canonicalize_utf8's regex_view) into words: appends the
  // end offset of each word to `ends` (the first word starts at 0).
  void split(std::string_view text, std::vector<uint32_t>& ends) const;

 private:
  struct Pattern;
  std::vector<std::unique_ptr<Pattern>> patterns_;  // applied in order, each to the last's pieces
};

}  // namespace duet
