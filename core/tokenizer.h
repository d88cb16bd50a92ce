#pragma once
// The tokenizer of tokenizer.ggml.model = "llama": SentencePiece BPE, reproducing sentencepiece's
// own encoder (normalizer.cc + bpe_model.cc + sentencepiece_processor.cc) for a model with
// identity normalisation, a dummy prefix, whitespace escaped as "▁" (U+2581), extra whitespace
// kept, user-defined pieces and byte fallback.
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
//
// decode(): control pieces (<s>, </s>) are dropped, "▁" becomes ' ', runs of byte pieces are
// decoded as UTF-8 (each invalid byte becomes U+FFFD), <unk> becomes " ⁇ ", and the "▁" of the
// first piece is removed (the dummy prefix), all as sentencepiece's Decode.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace duet {

class GgufFile;

struct TextSpan {  // byte range [begin, end) of a text
  size_t begin = 0, end = 0;
};

// GGUF token types (llama_token_type), as sentencepiece's piece types.
enum class TokenType : int32_t {
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct Vocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;  // TokenType values (0, llama.cpp's "undefined", is read as normal)
  int32_t bos = 1, eos = 2, unk = 0;
  bool add_space_prefix =
      true;  // tokenizer.ggml.add_space_prefix: sentencepiece's add_dummy_prefix

  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id,add_space_prefix}. Throws unsupported for another tokenizer model,
  // bad_format (naming the file and key) for missing or inconsistent arrays and ids.
  static Vocab from_gguf(const GgufFile& f);
};

class Tokenizer {
 public:
  explicit Tokenizer(
      Vocab v);  // throws bad_format for an inconsistent vocab or an unknown token type

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const;
  // Skips BOS/EOS (every control piece). Throws invalid_argument for an id outside the vocab.
  std::string decode(const std::vector<int32_t>& ids) const;

  // Token-by-token decoding for streaming: the concatenation of every push() and the final
  // flush() equals decode() of the same ids, and no push() returns part of a UTF-8 character.
  class StreamDecoder {
   public:
    explicit StreamDecoder(const Tokenizer& t);
    std::string push(int32_t id);  // throws invalid_argument for an id outside the vocab
    std::string flush();           // what is still held (an unfinished byte sequence, as U+FFFD)

   private:
    const Tokenizer* tok_;
    std::string pending_bytes_;  // byte pieces not yet forming a whole character
    bool text_started_ = false;  // anything emitted yet
    bool is_bos_ws_ = true;      // the next piece may still carry the dummy-prefix "▁"
    bool bos_ws_seen_ = false;   // the previous piece's "▁" was removed as the dummy prefix
  };

  const Vocab& vocab() const { return vocab_; }
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.pieces.size()); }
  // The piece id of a text, as sentencepiece's PieceToId: unk when there is none.
  int32_t piece_to_id(std::string_view piece) const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  TokenType type_of(int32_t id) const {
    return static_cast<TokenType>(vocab_.types[static_cast<size_t>(id)]);
  }
  size_t match_user_defined(std::string_view text) const;  // longest user-defined prefix, 0 if none
  std::string normalize(std::string_view text) const;

  Vocab vocab_;
  PieceMap mergeable_;  // normal, user-defined and unused pieces: the ones BPE may produce
  PieceMap reserved_;   // control, unknown and byte pieces: looked up first, never merged into
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> piece per byte, -1 if absent
  std::vector<int16_t> byte_of_id_;      // the byte of a byte piece, -1 for others
  bool byte_fallback_ = false;           // the vocab has byte pieces
  std::array<std::vector<std::string>, 256> user_defined_by_first_byte_;  // longest first
};

}  // namespace duet
