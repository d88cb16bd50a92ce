#include "core/model/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "core/base/error.h"
#include "core/model/bpe_pretokenize.h"
#include "core/model/utf8.h"

namespace duet {
namespace {

constexpr uint64_t kEmpty = ~0ull;

// GPT-2's bytes_to_unicode: the code point that stands for each byte in token texts.
std::array<uint32_t, 256> byte_to_codepoint() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

// Words longer than this (in bytes) merge through a heap; shorter ones by rescanning, which is
// faster for the few symbols most words have.
constexpr size_t kShortWord = 48;

}  // namespace

void BpeModel::MergeTable::build(const std::vector<std::pair<uint64_t, Merge>>& entries) {
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity *= 2;
  shift_ = 64 - std::countr_zero(capacity);
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Merge{0, -1});
  for (const auto& [k, v] : entries) {
    size_t i = slot(k);
    while (keys_[i] != kEmpty && keys_[i] != k) i = (i + 1) & (capacity - 1);
    if (keys_[i] == k) continue;  // a repeated pair keeps its first (lowest) rank, as llama.cpp
    keys_[i] = k;
    values_[i] = v;
  }
}

const BpeModel::Merge* BpeModel::MergeTable::find(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  const uint64_t k = key(left, right);
  const size_t mask = keys_.size() - 1;
  for (size_t i = slot(k);; i = (i + 1) & mask) {
    if (keys_[i] == k) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

BpeModel::BpeModel(const Vocab& v) {
  const PreTokenizerInfo* info = find_pretokenizer(v.pre);
  if (info == nullptr) {
    throw Error(Errc::bad_format, "tokenizer: unknown pre-tokenizer tokenizer.ggml.pre = '" +
                                      v.pre + "' (known: " + known_pretokenizer_names() + ")");
  }
  ignore_merges_ = info->ignore_merges;
  pre_ = std::make_unique<PreTokenizer>(*info);

  const size_t n = v.pieces.size();
  id_by_text_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // As llama.cpp: an empty text is stored as "[EMPTY_i]", and a repeated text names the last
    // token that has it.
    const std::string text =
        v.pieces[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : v.pieces[i];
    id_by_text_[text] = static_cast<int32_t>(i);
  }

  const std::array<uint32_t, 256> cp_of_byte = byte_to_codepoint();
  std::array<int16_t, 512> byte_of_cp{};
  byte_of_cp.fill(-1);
  for (size_t b = 0; b < 256; ++b) {
    utf8::append_codepoint(byte_char_[b], cp_of_byte[b]);
    byte_of_cp[cp_of_byte[b]] = static_cast<int16_t>(b);
    byte_token_[b] = text_to_id(byte_char_[b]);
  }

  // Each token's bytes (llama.cpp's llama_decode_text): a character outside the byte-level
  // alphabet is kept visible as "[UNK_BYTE_0x..<text>]", as llama.cpp prints it.
  token_bytes_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string_view text = v.pieces[i];
    std::string& out = token_bytes_[i];
    for (size_t pos = 0; pos < text.size();) {
      size_t len = utf8::valid_len(text.substr(pos));
      uint32_t cp = 0xfffd;
      if (len > 0) {
        const auto* b = reinterpret_cast<const uint8_t*>(text.data() + pos);
        cp = len == 1   ? b[0]
             : len == 2 ? ((b[0] & 0x1fu) << 6) | (b[1] & 0x3fu)
             : len == 3 ? ((b[0] & 0x0fu) << 12) | ((b[1] & 0x3fu) << 6) | (b[2] & 0x3fu)
                        : ((b[0] & 0x07u) << 18) | ((b[1] & 0x3fu) << 12) | ((b[2] & 0x3fu) << 6) |
                              (b[3] & 0x3fu);
      } else {
        len = 1;
      }
      pos += len;
      if (cp < byte_of_cp.size() && byte_of_cp[cp] >= 0) {
        out.push_back(static_cast<char>(byte_of_cp[cp]));
        continue;
      }
      std::string utf;
      utf8::append_codepoint(utf, cp);
      out += "[UNK_BYTE_0x";
      for (unsigned char c : utf) {
        char hex[3];
        std::snprintf(hex, sizeof hex, "%02x", c);
        out += hex;
      }
      out += std::string(text) + "]";
    }
  }

  std::vector<std::pair<uint64_t, Merge>> entries;
  entries.reserve(v.merges.size());
  for (size_t rank = 0; rank < v.merges.size(); ++rank) {
    const std::string& line = v.merges[rank];
    // As llama.cpp: split at the first space after the first byte.
    const size_t space = line.size() > 1 ? line.find(' ', 1) : std::string::npos;
    if (space == std::string::npos) {
      throw Error(Errc::bad_format, "tokenizer: merge " + std::to_string(rank) + " '" + line +
                                        "' is not two tokens separated by a space");
    }
    const std::string_view left = std::string_view(line).substr(0, space);
    const std::string_view right = std::string_view(line).substr(space + 1);
    const int32_t l = text_to_id(left), r = text_to_id(right);
    if (l < 0 || r < 0) {
      throw Error(Errc::bad_format, "tokenizer: merge " + std::to_string(rank) + " '" + line +
                                        "' names a token that is not in the vocab ('" +
                                        std::string(l < 0 ? left : right) + "')");
    }
    const int32_t merged = text_to_id(std::string(left) + std::string(right));
    entries.push_back(
        {(static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r),
         Merge{static_cast<int32_t>(rank), merged}});
  }
  merges_.build(entries);
}

BpeModel::~BpeModel() = default;

int32_t BpeModel::text_to_id(std::string_view text) const {
  const auto it = id_by_text_.find(text);
  return it == id_by_text_.end() ? -1 : it->second;
}

std::string BpeModel::byte_encode(std::string_view raw) const {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += byte_char_[static_cast<uint8_t>(c)];
  return out;
}

void BpeModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string canonical, regex_view;
  const bool rewritten = canonicalize_utf8(text, canonical, regex_view);
  const std::string_view words = rewritten ? std::string_view(canonical) : text;
  std::vector<uint32_t> ends;
  pre_->split(rewritten ? std::string_view(regex_view) : text, ends);
  uint32_t begin = 0;
  for (uint32_t end : ends) {
    encode_word(words.substr(begin, end - begin), out);
    begin = end;
  }
}

void BpeModel::emit_bytes_fallback(std::string_view raw, std::vector<int32_t>& out) const {
  // llama.cpp: a symbol that is no token becomes the tokens of the single bytes of its
  // byte-level text, where there are such tokens (others are dropped).
  const std::string encoded = byte_encode(raw);
  for (char c : encoded) {
    const int32_t id = text_to_id(std::string_view(&c, 1));
    if (id >= 0) out.push_back(id);
  }
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() == 1) {
    const int32_t id = byte_token_[static_cast<uint8_t>(word[0])];
    if (id >= 0)
      out.push_back(id);
    else
      emit_bytes_fallback(word, out);
    return;
  }
  if (ignore_merges_) {
    if (const int32_t id = text_to_id(byte_encode(word)); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() <= kShortWord)
    merge_short(word, out);
  else
    merge_long(word, out);
}

void BpeModel::merge_short(std::string_view word, std::vector<int32_t>& out) const {
  // Symbols as parallel arrays with the merge of each adjacent pair cached; a merge rescans the
  // cached ranks for the lowest and looks up only the two pairs it changed.
  struct Pair {
    int32_t rank, merged;  // rank INT32_MAX: no merge
  };
  std::array<int32_t, kShortWord> id{}, len{};
  std::array<Pair, kShortWord> pair{};
  size_t n = word.size();
  auto lookup = [&](size_t i) {
    const Merge* m = merges_.find(id[i], id[i + 1]);
    pair[i] = m ? Pair{m->rank, m->merged} : Pair{INT32_MAX, -1};
  };
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_token_[static_cast<uint8_t>(word[i])];
    len[i] = 1;
  }
  for (size_t i = 0; i + 1 < n; ++i) lookup(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (pair[i].rank < pair[best].rank) best = i;  // strict: ties go to the leftmost
    if (pair[best].rank == INT32_MAX) break;
    id[best] = pair[best].merged;
    len[best] += len[best + 1];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      id[i] = id[i + 1];
      len[i] = len[i + 1];
      pair[i] = pair[i + 1];
    }
    --n;
    if (best > 0) lookup(best - 1);
    if (best + 1 < n) lookup(best);
  }
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    if (id[i] >= 0)
      out.push_back(id[i]);
    else
      emit_bytes_fallback(word.substr(offset, static_cast<size_t>(len[i])), out);
    offset += static_cast<size_t>(len[i]);
  }
}

void BpeModel::merge_long(std::string_view word, std::vector<int32_t>& out) const {
  // A doubly linked list of symbols and a heap of candidate merges (llama.cpp's algorithm);
  // a candidate whose symbols changed since it was queued is skipped when it comes up.
  struct Symbol {
    int32_t id, prev, next;
    uint32_t begin, len;  // len 0: merged into its left neighbour
  };
  struct Candidate {
    int32_t rank, left, right, left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank > o.rank || (rank == o.rank && left > o.left);
    }
  };
  const auto n = static_cast<int32_t>(word.size());
  std::vector<Symbol> sym(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    sym[static_cast<size_t>(i)] = {byte_token_[static_cast<uint8_t>(word[static_cast<size_t>(i)])],
                                   i - 1, i + 1 < n ? i + 1 : -1, static_cast<uint32_t>(i), 1};
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const Symbol& a = sym[static_cast<size_t>(l)];
    const Symbol& b = sym[static_cast<size_t>(r)];
    if (const Merge* m = merges_.find(a.id, b.id)) heap.push({m->rank, l, r, a.id, b.id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& a = sym[static_cast<size_t>(c.left)];
    Symbol& b = sym[static_cast<size_t>(c.right)];
    if (a.len == 0 || b.len == 0 || a.next != c.right || a.id != c.left_id || b.id != c.right_id)
      continue;
    a.id = merges_.find(a.id, b.id)->merged;
    a.len += b.len;
    a.next = b.next;
    if (b.next >= 0) sym[static_cast<size_t>(b.next)].prev = c.left;
    b.len = 0;
    consider(a.prev, c.left);
    consider(c.left, a.next);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Symbol& s = sym[static_cast<size_t>(i)];
    if (s.id >= 0)
      out.push_back(s.id);
    else
      emit_bytes_fallback(word.substr(s.begin, s.len), out);
  }
}

}  // namespace duet
