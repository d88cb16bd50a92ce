#pragma once
// SentencePiece BPE (tokenizer.ggml.model = "llama"), reproducing sentencepiece's own encoder
// (normalizer.cc + bpe_model.cc + sentencepiece_processor.cc) for a model with identity
// normalisation, a dummy prefix, whitespace escaped as "▁" (U+2581), extra whitespace kept,
// user-defined pieces and byte fallback. Internal to the Tokenizer (core/model/tokenizer.h).
//
// encode():
//   1. normalise: a non-empty text gets a leading "▁" (the dummy prefix); every ' ' becomes "▁";
//      a byte that is not part of valid UTF-8 becomes U+FFFD (as sentencepiece does), which then
//      falls back to its three bytes <0xEF><0xBF><0xBD>. Nothing else changes (tabs, newlines,
//      case, runs of spaces are kept).
//   2. split into symbols: the longest user-defined piece (token type 4) starting here, or one
//      UTF-8 character. User-defined symbols never merge.
//   3. BPE: repeatedly merge the adjacent pair whose concatenation is a piece with the highest
//      score (ties: the leftmost pair), via a priority queue: O(n log n).
//   4. each symbol maps to its piece id; a symbol that is no piece becomes its UTF-8 bytes as
//      <0xNN> pieces (or <unk> if the vocab has no byte pieces). Control, unknown and byte
//      pieces are never produced from text: "<s>" in a text is the characters '<', 's', '>'.
// That the user-defined "\n" splits the text, not the words, is why the word after it gets no
// "▁" (llama.cpp differs here; sentencepiece is the reference).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/model/tokenizer.h"

namespace duet {

class SpmModel {
 public:
  explicit SpmModel(const Vocab& v);  // v.types already checked; throws bad_format for a bad byte
                                      // piece

  // Appends the ids of text; the dummy prefix only when add_prefix (and the vocab has one).
  void encode(const Vocab& v, std::string_view text, bool add_prefix,
              std::vector<int32_t>& out) const;
  int32_t piece_to_id(std::string_view piece, int32_t unk) const;
  int16_t byte_of(int32_t id) const { return byte_of_id_[static_cast<size_t>(id)]; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  size_t match_user_defined(std::string_view text) const;  // longest user-defined prefix, 0 if none
  std::string normalize(std::string_view text, bool add_prefix) const;

  PieceMap mergeable_;  // normal, user-defined and unused pieces: the ones BPE may produce
  PieceMap reserved_;   // control, unknown and byte pieces: looked up first, never merged into
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> piece per byte, -1 if absent
  std::vector<int16_t> byte_of_id_;      // the byte of a byte piece, -1 for others
  bool byte_fallback_ = false;           // the vocab has byte pieces
  std::array<std::vector<std::string>, 256> user_defined_by_first_byte_;  // longest first
};

}  // namespace duet
