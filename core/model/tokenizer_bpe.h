#pragma once
// Byte-level BPE (tokenizer.ggml.model = "gpt2"), as llama.cpp's llm_tokenizer_bpe_session.
// Internal to the Tokenizer (core/model/tokenizer.h).
//
// A text fragment is read as llama.cpp reads UTF-8 (bpe_pretokenize.h), split into words by the
// pre-tokenizer, and each word's bytes are merged: every byte starts as the token of its
// byte-level character (GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
// others for U+0100 + n), then the adjacent pair with the lowest merge rank is merged (ties: the
// leftmost) until no pair has a merge. With ignore_merges (the llama3 pre-tokenizers) a word that
// is a token as a whole is that token. A final symbol that is no token falls back to the tokens of
// its single bytes, as llama.cpp does.
//
// Merges are looked up by token-id pair in a flat open-addressing table: no strings are built
// while merging.
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/model/tokenizer.h"

namespace duet {

class PreTokenizer;

class BpeModel {
 public:
  // Throws bad_format for merges that name missing tokens or are not "a b", or an unknown pre.
  explicit BpeModel(const Vocab& v);
  ~BpeModel();

  void encode(std::string_view text, std::vector<int32_t>& out) const;  // appends the ids
  // The bytes a normal token stands for (its text with the byte-level mapping reversed).
  const std::string& token_bytes(int32_t id) const { return token_bytes_[static_cast<size_t>(id)]; }
  int32_t text_to_id(std::string_view text) const;  // the token with this stored text, or -1

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Merge {
    int32_t rank, merged;  // merged: the token of the two texts joined, -1 if none
  };
  // (left id, right id) -> Merge, open addressing with linear probing.
  class MergeTable {
   public:
    void build(const std::vector<std::pair<uint64_t, Merge>>& entries);
    const Merge* find(int32_t left, int32_t right) const;

   private:
    static uint64_t key(int32_t l, int32_t r) {
      return (static_cast<uint64_t>(static_cast<uint32_t>(l)) << 32) | static_cast<uint32_t>(r);
    }
    size_t slot(uint64_t k) const { return (k * 0x9e3779b97f4a7c15ull) >> shift_; }
    std::vector<uint64_t> keys_;  // kEmpty where free
    std::vector<Merge> values_;
    int shift_ = 64;
  };

  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void merge_short(std::string_view word, std::vector<int32_t>& out) const;
  void merge_long(std::string_view word, std::vector<int32_t>& out) const;
  void emit_bytes_fallback(std::string_view raw, std::vector<int32_t>& out) const;
  std::string byte_encode(std::string_view raw) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> id_by_text_;
  std::array<int32_t, 256> byte_token_{};   // token of each byte's byte-level char, or -1
  std::array<std::string, 256> byte_char_;  // each byte's byte-level char (UTF-8)
  std::vector<std::string> token_bytes_;    // per token: its text, byte-level decoded
  MergeTable merges_;
  bool ignore_merges_ = false;
  std::unique_ptr<PreTokenizer> pre_;
};

}  // namespace duet
