#pragma once
// The tokenizers of GGUF files, as llama.cpp reads them:
//   tokenizer.ggml.model = "llama": SentencePiece BPE (core/model/tokenizer_spm.cpp), reproducing
//     sentencepiece's own encoder for a model with identity normalisation, a dummy prefix,
//     whitespace escaped as "▁", user-defined pieces and byte fallback (sentencepiece is the
//     reference there, where llama.cpp differs).
//   tokenizer.ggml.model = "gpt2": byte-level BPE (core/model/tokenizer_bpe.cpp): a pre-tokenizer
//     chosen by tokenizer.ggml.pre splits the text into words (core/model/bpe_pretokenize.cpp,
//     PCRE2), each word's bytes are merged by merge rank; llama.cpp's tokenisation is the
//     reference.
//
// Special tokens (llama.cpp's tokenizer_st_partition): before the model runs, the text is cut at
// the texts of special tokens, longest token first; the pieces between them are encoded on their
// own. Which tokens may cut the text:
//   - control and unknown tokens: only with parse_special (or inside a special span);
//   - user-defined tokens: always, for byte-level BPE (llama.cpp does, after HF tokenizers);
//     for SentencePiece they are sentencepiece's user-defined pieces inside the encoder instead,
//     unless special tokens are being parsed (parse_special, or special spans: chat templates):
//     then they cut the text as in llama.cpp, so a chat prompt's ids equal llama.cpp's. Plain
//     text keeps sentencepiece's rules (they differ around a user-defined piece: sentencepiece
//     gives the next word no "▁", llama.cpp does).
// Token attributes follow llama.cpp, including its detection by text: a token whose text is an
// end-of-generation marker ("<|eot_id|>", "<|im_end|>", "</s>", ...) or a FIM marker is treated
// as control (not printed by decode, cut from text only with parse_special) and such EOG texts end
// generation (is_eog).
//
// decode(): control and unknown tokens are dropped (llama.cpp's detokenize with special=false).
//   SentencePiece: "▁" becomes ' ', byte pieces are decoded as UTF-8 (an invalid byte becomes
//   U+FFFD), <unk> becomes " ⁇ " and the first piece loses its dummy-prefix "▁", as sentencepiece.
//   Byte-level BPE: the exact bytes (byte-level mapping reversed; user-defined tokens as their
//   text), no space clean-up, invalid UTF-8 passed through unchanged.
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace duet {

class GgufFile;
class SpmModel;
class BpeModel;

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
  enum class Kind { spm, bpe };  // tokenizer.ggml.model "llama" | "gpt2"
  Kind kind = Kind::spm;
  std::string pre;  // tokenizer.ggml.pre ("" when absent)
  std::vector<std::string> pieces;
  std::vector<float> scores;
  std::vector<int32_t> types;  // TokenType values (0, llama.cpp's "undefined", reads as normal)
  std::vector<std::string> merges;  // bpe only: "a b" per line, by rank (first = merged first)
  // -1 when the vocab has none. Defaults (absent keys) are llama.cpp's: SentencePiece bos 1,
  // eos 2, unk 0; BPE bos = eos = 11 (when the vocab is that large); eot found by text.
  int32_t bos = 1, eos = 2, eot = -1, unk = 0, pad = -1;
  // add_bos_token / add_eos_token, defaulting as llama.cpp: SentencePiece BOS yes; BPE BOS only
  // for the llama3 pre-tokenizers; EOS never.
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;  // tokenizer.ggml.add_space_prefix (sentencepiece's dummy prefix)
  std::string chat_template;     // tokenizer.chat_template, "" when absent

  // Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,*_token_id,add_*} and
  // tokenizer.chat_template. Throws unsupported for another tokenizer model, bad_format (naming
  // the file and key) for missing or inconsistent arrays, a special-token id outside the vocab,
  // or an unknown pre-tokenizer (listing the known ones).
  static Vocab from_gguf(const GgufFile& f);
};

class Tokenizer {
 public:
  // Throws bad_format for an inconsistent vocab: an unknown token type, ids outside the vocab,
  // merges naming missing tokens, an unknown pre-tokenizer, add_bos without a BOS id.
  explicit Tokenizer(Vocab v);
  ~Tokenizer();
  Tokenizer(const Tokenizer&);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(const Tokenizer&) = delete;
  Tokenizer& operator=(Tokenizer&&) = delete;

  // add_special: BOS/EOS as the vocab's add_bos/add_eos say (llama.cpp's add_special);
  // parse_special: control-token texts in `text` become their ids (llama.cpp's parse_special).
  std::vector<int32_t> encode(std::string_view text, bool add_special,
                              bool parse_special = false) const;
  // Special tokens are recognised only when they lie inside one of `special_spans` (a chat
  // template's own markers); the text between recognised special tokens is one fragment, as
  // llama.cpp tokenises after its partition. A user who types "<|eot_id|>" gets those characters.
  std::vector<int32_t> encode_with_special_spans(std::string_view text, bool add_special,
                                                 std::span<const TextSpan> special_spans) const;
  // Drops control and unknown tokens. Throws invalid_argument for an id outside the vocab.
  std::string decode(const std::vector<int32_t>& ids) const;
  // What one token adds to a text after other tokens (llama.cpp's token_to_piece, special =
  // false): nothing for a control token; SentencePiece: "▁" as ' ', a byte piece its byte,
  // <unk> " ⁇ "; byte-level BPE: its bytes, which may be part of a UTF-8 character. For
  // per-token output (logprobs); decode() is the text.
  std::string token_bytes(int32_t id) const;
  // Each id's part of decode(ids), bytes as they are: token_bytes(), except that a
  // SentencePiece text's first piece loses the dummy prefix's space, as decode() drops it.
  std::vector<std::string> token_texts(std::span<const int32_t> ids) const;
  // Whether ids end in a token that adds text (StreamDecoder's after_text for what follows).
  bool ends_in_text(std::span<const int32_t> ids) const {
    return !ids.empty() && !token_bytes(ids.back()).empty();
  }

  // Token-by-token decoding for streaming: the concatenation of every push() and the final
  // flush() equals decode() of the same ids, and no push() returns part of a UTF-8 character.
  class StreamDecoder {
   public:
    // after_text: the ids continue a text (a prompt that ends in a token with text), so a
    // SentencePiece "▁" at their start is that text's space, not the dummy prefix decode()
    // drops: a completion then concatenates to its prompt (llama.cpp's and vLLM's text).
    explicit StreamDecoder(const Tokenizer& t, bool after_text = false);
    std::string push(int32_t id);  // throws invalid_argument for an id outside the vocab
    std::string flush();           // what is still held (SentencePiece: an unfinished byte
                                   // sequence as U+FFFD; BPE: the held bytes as they are)

   private:
    std::string push_spm(int32_t id);
    std::string push_bpe(int32_t id);

    const Tokenizer* tok_;
    std::string pending_bytes_;  // bytes not yet forming a whole character
    bool text_started_ = false;  // anything emitted yet
    bool is_bos_ws_ = true;      // SentencePiece: the next piece may still carry the dummy "▁"
    bool bos_ws_seen_ = false;   // SentencePiece: the previous piece's "▁" was the dummy prefix
  };

  bool is_eog(int32_t id) const;  // EOS, EOT and the other end-of-generation ids
  int32_t bos() const { return vocab_.bos; }
  int32_t eos() const { return vocab_.eos; }
  int32_t eot() const { return vocab_.eot; }
  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.pieces.size()); }
  const Vocab& vocab() const { return vocab_; }
  // The piece id of a text (SentencePiece: as its PieceToId, unk when there is none; BPE: the
  // token whose stored text this is, -1 when there is none).
  int32_t piece_to_id(std::string_view piece) const;

 private:
  // A piece of the text after the special-token partition: a token, or a byte range to encode.
  struct Fragment {
    int32_t token;  // -1 for text
    size_t begin, end;
  };
  // llama.cpp's tokenizer_st_partition. A control/unknown token cuts the text when
  // parse_special, or when it lies inside one of `spans` (spans non-empty).
  std::vector<Fragment> partition(std::string_view text, bool parse_special,
                                  std::span<const TextSpan> spans) const;
  std::vector<int32_t> encode_fragments(std::string_view text, const std::vector<Fragment>& frags,
                                        bool add_special) const;
  void check_id(int32_t id) const;

  // llama.cpp's token attributes (bit set): the GGUF type plus what llama.cpp infers from texts.
  enum Attr : uint8_t {
    kNormal = 1,
    kUnknown = 2,
    kControl = 4,
    kUserDefined = 8,
    kUnused = 16,
    kByte = 32,
  };

  Vocab vocab_;
  std::vector<uint8_t> attrs_;
  std::vector<int32_t> special_by_length_;  // control/user-defined/unknown, longest text first
  std::vector<int32_t> eog_ids_;            // sorted
  std::shared_ptr<const SpmModel> spm_;     // one of the two, by vocab_.kind
  std::shared_ptr<const BpeModel> bpe_;
};

}  // namespace duet
