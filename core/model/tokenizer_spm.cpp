#include "core/model/tokenizer_spm.h"

#include <algorithm>
#include <queue>

#include "core/base/error.h"
#include "core/model/utf8.h"

namespace duet {
namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";      // U+2581 "▁"
constexpr std::string_view kReplacementChar = "\xef\xbf\xbd";  // U+FFFD

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

TokenType type_at(const Vocab& v, int32_t id) {
  return static_cast<TokenType>(v.types[static_cast<size_t>(id)]);
}

}  // namespace

SpmModel::SpmModel(const Vocab& v) {
  const size_t n = v.pieces.size();
  byte_ids_.fill(-1);
  byte_of_id_.assign(n, -1);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& piece = v.pieces[i];
    if (piece.empty()) continue;  // can be neither matched nor merged into; decodes to nothing
    switch (static_cast<TokenType>(v.types[i])) {
      case TokenType::normal:
      case TokenType::unused:
        mergeable_.emplace(piece, id);  // a duplicate keeps its first id, as a lookup would
        break;
      case TokenType::user_defined:
        mergeable_.emplace(piece, id);
        user_defined_by_first_byte_[static_cast<uint8_t>(piece[0])].push_back(piece);
        break;
      case TokenType::byte: {
        const int b = parse_byte_piece(piece);
        if (b < 0)
          throw Error(Errc::bad_format, "tokenizer: byte token " + std::to_string(i) + " is '" +
                                            piece + "', not <0xNN>");
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

int32_t SpmModel::piece_to_id(std::string_view piece, int32_t unk) const {
  if (auto it = reserved_.find(piece); it != reserved_.end()) return it->second;
  if (auto it = mergeable_.find(piece); it != mergeable_.end()) return it->second;
  return unk;
}

size_t SpmModel::match_user_defined(std::string_view text) const {
  for (const auto& piece : user_defined_by_first_byte_[static_cast<uint8_t>(text[0])]) {
    if (text.starts_with(piece)) return piece.size();
  }
  return 0;
}

std::string SpmModel::normalize(std::string_view text, bool add_prefix) const {
  std::string out;
  out.reserve(text.size() + text.size() / 2 + kSpaceSymbol.size());
  if (add_prefix) out.append(kSpaceSymbol);
  for (size_t pos = 0; pos < text.size();) {
    if (text[pos] == ' ') {
      out.append(kSpaceSymbol);
      pos += 1;
      continue;
    }
    const size_t len = utf8::valid_len(text.substr(pos));
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

void SpmModel::encode(const Vocab& v, std::string_view text, bool add_prefix,
                      std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  const std::string normalized = normalize(text, add_prefix && v.add_space_prefix);
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
      len = std::min(utf8::claimed_len(static_cast<uint8_t>(norm[pos])), norm.size() - pos);
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
    agenda.push({v.scores[static_cast<size_t>(it->second)], left, right, merged.size()});
    if (type_at(v, it->second) == TokenType::unused) unmerge[merged] = {piece_of(l), piece_of(r)};
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
    const int32_t id = piece_to_id(piece, v.unk);
    if (type_at(v, id) == TokenType::unused) {
      if (const auto it = unmerge.find(piece); it != unmerge.end()) {
        self(self, it->second.first);
        self(self, it->second.second);
        return;
      }
    }
    const bool unknown = type_at(v, id) == TokenType::unknown;
    if (unknown && byte_fallback_) {
      for (char c : piece) {
        const int32_t byte_id = byte_ids_[static_cast<uint8_t>(c)];
        ids.push_back(byte_id >= 0 ? byte_id : v.unk);
      }
    } else if (!(unknown && previous_was_unknown)) {  // a run of unknown symbols is one <unk>
      ids.push_back(id);
    }
    previous_was_unknown = unknown && !byte_fallback_;
  };
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    emit(emit, piece_of(symbols[static_cast<size_t>(i)]));
}

}  // namespace duet
