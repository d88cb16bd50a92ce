#include "core/model/bpe_pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <string>

#include "core/base/error.h"
#include "core/model/utf8.h"

namespace duet {
namespace {

// llama.cpp's whitespace (unicode_set_whitespace: the White_Space property), as a class body.
// PCRE2's own \s under UCP leaves out U+0085, so \s is never used in the patterns below.
constexpr std::string_view kSpace =
    "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// The patterns are written with `\s` / `\S` / `[^\s` (as in llama.cpp and the tokenizer.json
// files they come from) and rewritten to llama.cpp's whitespace class here.
std::string with_llama_whitespace(std::string_view pattern) {
  const std::string space(kSpace);
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern.substr(i).starts_with("[^\\s")) {
      out += "[^" + space;
      i += 3;
    } else if (pattern.substr(i).starts_with("\\s")) {
      out += "[" + space + "]";
      i += 1;
    } else if (pattern.substr(i).starts_with("\\S")) {
      out += "[^" + space + "]";
      i += 1;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// GPT-2's pattern; llama.cpp's hand-written splitter for it also takes a lone whitespace that
// the pattern leaves unmatched as a piece, which the trailing \s+ spells out.
constexpr std::string_view kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
// Llama 3's, with (?i:'s|...) spelled out as llama.cpp adapted it.
constexpr std::string_view kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// Qwen2's: Llama 3's with single digits.
constexpr std::string_view kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
    "\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum Family { kDefault, kGpt2Family, kLlama3Family, kQwen2Family, kStarcoderFamily };

std::vector<std::string_view> patterns_of(int family) {
  switch (family) {
    case kGpt2Family:
      return {kGpt2};
    case kLlama3Family:
      return {kLlama3};
    case kQwen2Family:
      return {kQwen2};
    case kStarcoderFamily:
      return {"\\p{N}", kGpt2};
    default:  // llama.cpp's default: four passes, each splitting the previous one's pieces
      return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
  }
}

// tokenizer.ggml.pre values llama.cpp maps to these patterns, with its per-name defaults.
constexpr std::array<PreTokenizerInfo, 30> kPreTokenizers = {{
    {"default", kDefault, false, false},
    {"llama3", kLlama3Family, true, true},
    {"llama-v3", kLlama3Family, true, true},
    {"llama-bpe", kLlama3Family, true, true},
    {"falcon3", kLlama3Family, true, true},
    {"falcon-h1", kLlama3Family, true, true},
    {"pixtral", kLlama3Family, true, true},
    {"midm-2.0", kLlama3Family, true, true},
    {"lfm2", kLlama3Family, true, true},
    {"dbrx", kLlama3Family, false, false},
    {"smaug-bpe", kLlama3Family, false, false},
    {"qwen2", kQwen2Family, false, false},
    {"deepseek-r1-qwen", kQwen2Family, false, false},
    {"stablelm2", kQwen2Family, false, false},
    {"hunyuan", kQwen2Family, false, false},
    {"megrez", kQwen2Family, false, false},
    {"gpt-2", kGpt2Family, false, false},
    {"gpt2", kGpt2Family, false, false},  // not a llama.cpp name; the brief's spelling of gpt-2
    {"phi-2", kGpt2Family, false, false},
    {"mpt", kGpt2Family, false, false},
    {"olmo", kGpt2Family, false, false},
    {"jais", kGpt2Family, false, false},
    {"trillion", kGpt2Family, false, false},
    {"starcoder", kStarcoderFamily, false, false},
    {"refact", kStarcoderFamily, false, false},
    {"command-r", kStarcoderFamily, false, false},
    {"smollm", kStarcoderFamily, false, false},
    {"codeshell", kStarcoderFamily, false, false},
    {"exaone", kStarcoderFamily, false, false},
    {"minerva-7b", kStarcoderFamily, false, false},
}};

}  // namespace

const PreTokenizerInfo* find_pretokenizer(std::string_view pre) {
  if (pre.empty()) pre = "default";
  for (const auto& info : kPreTokenizers) {
    if (info.name == pre) return &info;
  }
  return nullptr;
}

std::string known_pretokenizer_names() {
  std::string names;
  for (const auto& info : kPreTokenizers) {
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

bool canonicalize_utf8(std::string_view text, std::string& canonical, std::string& regex_view) {
  size_t pos = 0;
  while (pos < text.size()) {  // the common case: already well-formed
    const size_t len = utf8::valid_len(text.substr(pos));
    if (len == 0) break;
    pos += len;
  }
  if (pos == text.size()) return false;
  canonical.assign(text.substr(0, pos));
  regex_view.assign(text.substr(0, pos));
  const auto* b = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  auto trail = [&](size_t i) { return i < n && utf8::is_trail_byte(b[i]); };
  while (pos < n) {
    // llama.cpp's unicode_cpt_from_utf8: the lead byte's high bits pick the length, the trail
    // bytes must be there; nothing else is checked (overlong forms and surrogates pass).
    uint32_t cp = 0xfffd;
    size_t len = 1;
    const uint8_t lead = b[pos];
    if (lead < 0x80) {
      cp = lead;
    } else if ((lead & 0x40) == 0) {
      // a stray continuation byte
    } else if ((lead & 0x20) == 0) {
      if (trail(pos + 1)) {
        cp = ((lead & 0x1fu) << 6) | (b[pos + 1] & 0x3fu);
        len = 2;
      }
    } else if ((lead & 0x10) == 0) {
      if (trail(pos + 1) && trail(pos + 2)) {
        cp = ((lead & 0x0fu) << 12) | ((b[pos + 1] & 0x3fu) << 6) | (b[pos + 2] & 0x3fu);
        len = 3;
      }
    } else if ((lead & 0x08) == 0) {
      if (trail(pos + 1) && trail(pos + 2) && trail(pos + 3)) {
        cp = ((lead & 0x07u) << 18) | ((b[pos + 1] & 0x3fu) << 12) | ((b[pos + 2] & 0x3fu) << 6) |
             (b[pos + 3] & 0x3fu);
        len = 4;
        if (cp > 0x10ffff) cp = 0xfffd;  // llama.cpp throws here (see the header)
      }
    }
    pos += len;
    utf8::append_codepoint(canonical, cp);
    utf8::append_codepoint(regex_view, cp >= 0xd800 && cp < 0xe000 ? 0xfffd : cp);
  }
  return true;
}

struct PreTokenizer::Pattern {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Pattern() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(const PreTokenizerInfo& info) {
  for (std::string_view source : patterns_of(info.family)) {
    const std::string pattern = with_llama_whitespace(source);
    int error = 0;
    PCRE2_SIZE offset = 0;
    auto p = std::make_unique<Pattern>();
    p->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                            PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (p->code == nullptr) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      throw Error(Errc::internal, "pre-tokenizer '" + std::string(info.name) +
                                      "': PCRE2 rejects its pattern at " + std::to_string(offset) +
                                      ": " + reinterpret_cast<const char*>(message.data()));
    }
    p->jit = pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE) == 0;
    patterns_.push_back(std::move(p));
  }
}

PreTokenizer::~PreTokenizer() = default;

void PreTokenizer::split(std::string_view text, std::vector<uint32_t>& ends) const {
  if (text.empty()) return;
  // A match data block per call (two offsets): the tokenizer is shared between threads.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  if (!match) throw Error(Errc::internal, "pre-tokenizer: out of memory");
  std::vector<uint32_t> pieces{static_cast<uint32_t>(text.size())};
  std::vector<uint32_t> next;
  for (const auto& p : patterns_) {
    next.clear();
    uint32_t piece_begin = 0;
    for (uint32_t piece_end : pieces) {
      // The piece alone is the subject: a lookahead sees its end as the end of the text.
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece_begin);
      const PCRE2_SIZE length = piece_end - piece_begin;
      PCRE2_SIZE start = 0, emitted = 0;  // where to search next; the end of the last piece
      while (start < length) {
        const int rc =
            p->jit ? pcre2_jit_match(p->code, subject, length, start, 0, match.get(), nullptr)
                   : pcre2_match(p->code, subject, length, start, PCRE2_NO_UTF_CHECK, match.get(),
                                 nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          throw Error(Errc::internal,
                      "pre-tokenizer: PCRE2 match failed (" + std::to_string(rc) + ")");
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const PCRE2_SIZE match_begin = ovector[0], match_end = ovector[1];
        if (match_end == match_begin) {  // the patterns never match empty; be safe anyway
          start = match_begin + 1;
          while (start < length && utf8::is_trail_byte(subject[start])) ++start;
          continue;
        }
        // Text a pattern leaves unmatched is a piece of its own, as in llama.cpp's splitter.
        if (match_begin > emitted) next.push_back(piece_begin + static_cast<uint32_t>(match_begin));
        next.push_back(piece_begin + static_cast<uint32_t>(match_end));
        start = emitted = match_end;
      }
      if (emitted < length) next.push_back(piece_end);
      piece_begin = piece_end;
    }
    pieces.swap(next);
  }
  ends.insert(ends.end(), pieces.begin(), pieces.end());
}

}  // namespace duet
