#include "core/tokenizer.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "core/gguf.h"

namespace duet {
namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";       // U+2581 "▁"
constexpr std::string_view kReplacementChar = "\xef\xbf\xbd";   // U+FFFD
constexpr std::string_view kUnknownSurface = " \xe2\x81\x87 ";  // sentencepiece's " ⁇ "

bool is_trail_byte(uint8_t b) {
  return (b & 0xc0) == 0x80;
}

// Bytes a UTF-8 sequence with this lead byte claims (1 for a stray trail byte or 0xf8..0xff,
// which then fail validation as sentencepiece's DecodeUTF8 does).
size_t utf8_claimed_len(uint8_t lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0) return 2;
  if ((lead & 0xf0) == 0xe0) return 3;
  if ((lead & 0xf8) == 0xf0) return 4;
  return 1;
}

// Length of the valid UTF-8 character at the start of s, or 0 if it is not one (truncated,
// overlong, a surrogate, above U+10FFFF, a stray byte): sentencepiece's IsValidDecodeUTF8.
size_t valid_utf8_len(std::string_view s) {
  const auto* b = reinterpret_cast<const uint8_t*>(s.data());
  if (s.empty()) return 0;
  if (b[0] < 0x80) return 1;
  const size_t len = utf8_claimed_len(b[0]);
  if (len == 1 || s.size() < len) return 0;
  uint32_t cp = b[0] & (0x7f >> len);
  for (size_t i = 1; i < len; ++i) {
    if (!is_trail_byte(b[i])) return 0;
    cp = (cp << 6) | (b[i] & 0x3f);
  }
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLen[len]) return 0;
  if (cp >= 0xd800 && cp < 0xe000) return 0;
  if (cp > 0x10ffff) return 0;
  return len;
}

// Decodes a run of raw bytes (from byte pieces) as UTF-8 into out, each invalid byte becoming
// U+FFFD. Unless `final`, stops before a tail that is an unfinished but so far valid character,
// so that more bytes can complete it. Returns the number of bytes consumed.
size_t decode_byte_run(std::string_view bytes, bool final, std::string& out) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const std::string_view rest = bytes.substr(pos);
    const size_t len = valid_utf8_len(rest);
    if (len > 0) {
      out.append(rest.substr(0, len));
      pos += len;
      continue;
    }
    if (!final) {
      const size_t claimed = utf8_claimed_len(static_cast<uint8_t>(rest[0]));
      bool could_complete = claimed > 1 && rest.size() < claimed;
      for (size_t i = 1; could_complete && i < rest.size(); ++i) {
        could_complete = is_trail_byte(static_cast<uint8_t>(rest[i]));
      }
      if (could_complete) break;
    }
    out.append(kReplacementChar);
    pos += 1;
  }
  return pos;
}

int parse_byte_piece(std::string_view piece) {
  // "<0xNN>" with two upper- or lower-case hex digits.
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else
      return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
  auto bad = [&](const std::string& what) {
    return Error(Errc::bad_format, f.path() + ": " + what);
  };
  if (!f.has("tokenizer.ggml.model")) throw bad("no tokenizer.ggml.model");
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "llama") {
    throw Error(Errc::unsupported, f.path() + ": tokenizer.ggml.model '" + model +
                                       "' is not supported (only 'llama', SentencePiece BPE)");
  }
  if (!f.has("tokenizer.ggml.tokens")) throw bad("no tokenizer.ggml.tokens");
  Vocab v;
  v.pieces = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.pieces.size();
  if (n == 0) throw bad("tokenizer.ggml.tokens is empty");
  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    if (v.scores.size() != n)
      throw bad("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
                std::to_string(n) + " tokens");
  } else {
    v.scores.assign(n, 0.0f);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    v.types = f.get_int_array("tokenizer.ggml.token_type");
    if (v.types.size() != n)
      throw bad("tokenizer.ggml.token_type has " + std::to_string(v.types.size()) +
                " entries for " + std::to_string(n) + " tokens");
  } else {
    v.types.assign(n, static_cast<int32_t>(TokenType::normal));
  }
  auto read_id = [&](const char* key, int32_t fallback) {
    if (!f.has(key)) return fallback;
    const uint64_t id = f.get_uint(key);
    if (id >= n)
      throw bad(std::string(key) + " = " + std::to_string(id) + " is outside the vocab of " +
                std::to_string(n));
    return static_cast<int32_t>(id);
  };
  v.bos = read_id("tokenizer.ggml.bos_token_id", v.bos);
  v.eos = read_id("tokenizer.ggml.eos_token_id", v.eos);
  v.unk = read_id("tokenizer.ggml.unknown_token_id", v.unk);
  if (f.has("tokenizer.ggml.add_space_prefix")) {
    const GgufValue& value = f.value("tokenizer.ggml.add_space_prefix");
    if (value.type != GgufType::BOOL) throw bad("tokenizer.ggml.add_space_prefix is not a bool");
    v.add_space_prefix = value.u != 0;
  }
  return v;
}

Tokenizer::Tokenizer(Vocab v) : vocab_(std::move(v)) {
  const size_t n = vocab_.pieces.size();
  auto bad = [](const std::string& what) { return Error(Errc::bad_format, "tokenizer: " + what); };
  if (n == 0) throw bad("empty vocab");
  if (n > static_cast<size_t>(INT32_MAX)) throw bad("vocab too large");
  if (vocab_.scores.size() != n || vocab_.types.size() != n) {
    throw bad("vocab has " + std::to_string(n) + " pieces but " +
              std::to_string(vocab_.scores.size()) + " scores and " +
              std::to_string(vocab_.types.size()) + " types");
  }
  for (int32_t id : {vocab_.bos, vocab_.eos, vocab_.unk}) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      throw bad("special token id " + std::to_string(id) + " outside the vocab");
  }
  byte_ids_.fill(-1);
  byte_of_id_.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& piece = vocab_.pieces[i];
    int32_t& type = vocab_.types[i];
    if (type == 0) type = static_cast<int32_t>(TokenType::normal);  // llama.cpp's "undefined"
    if (type < static_cast<int32_t>(TokenType::normal) ||
        type > static_cast<int32_t>(TokenType::byte)) {
      throw bad("token " + std::to_string(i) + " has unknown type " + std::to_string(type));
    }
    if (piece.empty()) continue;  // can be neither matched nor merged into; decodes to nothing
    switch (static_cast<TokenType>(type)) {
      case TokenType::normal:
      case TokenType::unused:
        mergeable_.emplace(piece, id);  // a duplicate keeps its first id, as a lookup would
        break;
      case TokenType::user_defined: {
        mergeable_.emplace(piece, id);
        user_defined_by_first_byte_[static_cast<uint8_t>(piece[0])].push_back(piece);
        break;
      }
      case TokenType::byte: {
        const int b = parse_byte_piece(piece);
        if (b < 0) throw bad("byte token " + std::to_string(i) + " is '" + piece + "', not <0xNN>");
        byte_of_id_[i] = static_cast<int16_t>(b);
        if (byte_ids_[static_cast<size_t>(b)] < 0) byte_ids_[static_cast<size_t>(b)] = id;
        byte_fallback_ = true;
        reserved_.emplace(piece, id);
        break;
      }
      case TokenType::unknown:
      case TokenType::control:
        reserved_.emplace(piece, id);
        break;
    }
  }
  for (auto& bucket : user_defined_by_first_byte_) {  // longest first: the longest match wins
    std::stable_sort(bucket.begin(), bucket.end(), [](const std::string& a, const std::string& b) {
      return a.size() > b.size();
    });
  }
}

int32_t Tokenizer::piece_to_id(std::string_view piece) const {
  if (auto it = reserved_.find(piece); it != reserved_.end()) return it->second;
  if (auto it = mergeable_.find(piece); it != mergeable_.end()) return it->second;
  return vocab_.unk;
}

size_t Tokenizer::match_user_defined(std::string_view text) const {
  for (const auto& piece : user_defined_by_first_byte_[static_cast<uint8_t>(text[0])]) {
    if (text.starts_with(piece)) return piece.size();
  }
  return 0;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size() + text.size() / 2 + kSpaceSymbol.size());
  if (vocab_.add_space_prefix) out.append(kSpaceSymbol);
  for (size_t pos = 0; pos < text.size();) {
    if (text[pos] == ' ') {
      out.append(kSpaceSymbol);
      pos += 1;
      continue;
    }
    const size_t len = valid_utf8_len(text.substr(pos));
    if (len == 0) {
      out.append(kReplacementChar);  // one malformed byte
      pos += 1;
    } else {
      out.append(text.substr(pos, len));
      pos += len;
    }
  }
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  if (add_bos) ids.push_back(vocab_.bos);
  if (text.empty()) return ids;
  const std::string normalized = normalize(text);
  const std::string_view norm(normalized);

  // Symbols form a doubly linked list over the normalised text; a merge grows the left symbol
  // and empties the right one.
  struct Symbol {
    size_t begin, len;
    int32_t prev, next;
    bool frozen;  // a user-defined piece: never merged
  };
  std::vector<Symbol> symbols;
  symbols.reserve(norm.size());
  for (size_t pos = 0; pos < norm.size();) {
    size_t len = match_user_defined(norm.substr(pos));
    const bool frozen = len > 0;
    if (!frozen)
      len = std::min(utf8_claimed_len(static_cast<uint8_t>(norm[pos])), norm.size() - pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({pos, len, index - 1, pos + len < norm.size() ? index + 1 : -1, frozen});
    pos += len;
  }
  auto piece_of = [&](const Symbol& s) { return norm.substr(s.begin, s.len); };

  struct Candidate {
    float score;
    int32_t left, right;
    size_t len;  // stale when the two symbols no longer add up to this
  };
  auto lower_priority = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> agenda(
      lower_priority);
  // Unused pieces may be merged through but are split back into what formed them.
  std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>> unmerge;

  auto consider_pair = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    if (l.frozen || r.frozen) return;
    const std::string_view merged = norm.substr(l.begin, l.len + r.len);
    const auto it = mergeable_.find(merged);
    if (it == mergeable_.end()) return;
    agenda.push({vocab_.scores[static_cast<size_t>(it->second)], left, right, merged.size()});
    if (type_of(it->second) == TokenType::unused) unmerge[merged] = {piece_of(l), piece_of(r)};
  };
  for (size_t i = 1; i < symbols.size(); ++i)
    consider_pair(static_cast<int32_t>(i) - 1, static_cast<int32_t>(i));

  while (!agenda.empty()) {
    const Candidate top = agenda.top();
    agenda.pop();
    Symbol& l = symbols[static_cast<size_t>(top.left)];
    Symbol& r = symbols[static_cast<size_t>(top.right)];
    if (l.len == 0 || r.len == 0 || l.len + r.len != top.len) continue;
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.left;
    r.len = 0;
    consider_pair(l.prev, top.left);
    consider_pair(top.left, l.next);
  }

  bool previous_was_unknown = false;
  auto emit = [&](auto& self, std::string_view piece) -> void {
    const int32_t id = piece_to_id(piece);
    if (type_of(id) == TokenType::unused) {
      if (const auto it = unmerge.find(piece); it != unmerge.end()) {
        self(self, it->second.first);
        self(self, it->second.second);
        return;
      }
    }
    const bool unknown = type_of(id) == TokenType::unknown;
    if (unknown && byte_fallback_) {
      for (char c : piece) {
        const int32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
        ids.push_back(byte_id >= 0 ? byte_id : vocab_.unk);
      }
    } else if (!(unknown && previous_was_unknown)) {  // a run of unknown symbols is one <unk>
      ids.push_back(id);
    }
    previous_was_unknown = unknown && !byte_fallback_;
  };
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    emit(emit, piece_of(symbols[static_cast<size_t>(i)]));
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  StreamDecoder decoder(*this);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  text += decoder.flush();
  return text;
}

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& t) : tok_(&t) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  if (id < 0 || id >= tok_->n_vocab()) {
    throw Error(Errc::invalid_argument, "token id " + std::to_string(id) +
                                            " is outside the vocab of " +
                                            std::to_string(tok_->n_vocab()));
  }
  std::string out;
  const int16_t byte = tok_->byte_of_id_[static_cast<size_t>(id)];
  if (byte >= 0) {
    pending_bytes_.push_back(static_cast<char>(byte));
    pending_bytes_.erase(0, decode_byte_run(pending_bytes_, false, out));
    text_started_ = text_started_ || !out.empty();
    return out;
  }
  out = flush();
  // As sentencepiece: only the first piece that can carry the dummy prefix loses its "▁".
  if (bos_ws_seen_ || text_started_) is_bos_ws_ = false;
  bos_ws_seen_ = false;
  const TokenType type = tok_->type_of(id);
  std::string_view piece = tok_->vocab_.pieces[static_cast<size_t>(id)];
  if (type == TokenType::control) return out;
  if (type == TokenType::unknown) {
    out.append(kUnknownSurface);
  } else {
    if (is_bos_ws_ && tok_->vocab_.add_space_prefix && piece.starts_with(kSpaceSymbol)) {
      piece.remove_prefix(kSpaceSymbol.size());
      bos_ws_seen_ = true;
    }
    for (size_t pos = 0; pos < piece.size();) {
      if (piece.substr(pos).starts_with(kSpaceSymbol)) {
        out.push_back(' ');
        pos += kSpaceSymbol.size();
      } else {
        out.push_back(piece[pos++]);
      }
    }
  }
  text_started_ = text_started_ || !out.empty();
  return out;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string out;
  decode_byte_run(pending_bytes_, true, out);
  pending_bytes_.clear();
  text_started_ = text_started_ || !out.empty();
  return out;
}

}  // namespace duet
