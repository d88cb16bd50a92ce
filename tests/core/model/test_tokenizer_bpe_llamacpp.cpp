// Byte-level BPE against llama.cpp itself: every string of tests/data/llamacpp/corpus.json (722
// strings: prose, whitespace runs, numbers, code, CJK, Arabic, emoji, combining marks, invalid
// UTF-8, special-token texts) tokenised by duet must give exactly the ids llama.cpp gave for
// the same vocab-only GGUF (Llama 3.1's and Qwen3's real vocabularies, and three pre-tokenizer
// variants), with and without parse_special. The ids were written by tools/llamacpp-oracle
// (node-llama-cpp 3.22.1).
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/model/gguf.h"
#include "core/model/tokenizer.h"
#include "reference_data.h"

namespace duet {
namespace {

std::string data_dir() {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/";
}

const Tokenizer& vocab_tokenizer(const std::string& name) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const auto f = GgufFile::open(data_dir() + "vocab/" + name + ".gguf");
    it = cache.emplace(name, Tokenizer(Vocab::from_gguf(*f))).first;
  }
  return it->second;
}

// A corpus entry's bytes: "text", or "hex" for byte strings that are not valid UTF-8.
std::string entry_bytes(const nlohmann::json& entry) {
  if (entry.contains("text")) return entry["text"].get<std::string>();
  const std::string hex = entry["hex"];
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

bool is_whole_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t len = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 0;
    if (len == 0 || i + len > s.size()) return false;
    i += len;
  }
  return true;
}

std::string show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

class BpeAgainstLlamaCpp : public ::testing::TestWithParam<std::string> {};

TEST_P(BpeAgainstLlamaCpp, HeaderIdsAndFlagsAgree) {
  const auto oracle = testdata::load_json(data_dir() + "llamacpp/tokenize-" + GetParam() + ".json");
  const Tokenizer& t = vocab_tokenizer(GetParam());
  EXPECT_EQ(t.vocab().kind, Vocab::Kind::bpe);
  EXPECT_EQ(t.n_vocab(), oracle["n_vocab"].get<int32_t>());
  EXPECT_EQ(t.bos(), oracle["bos"].get<int32_t>());
  EXPECT_EQ(t.eos(), oracle["eos"].get<int32_t>());
  EXPECT_EQ(t.eot(), oracle["eot"].get<int32_t>());
  EXPECT_EQ(t.vocab().add_bos, oracle["add_bos"].get<bool>());
  EXPECT_EQ(t.vocab().add_eos, oracle["add_eos"].get<bool>());
  EXPECT_TRUE(t.is_eog(t.eos()));
  EXPECT_TRUE(t.is_eog(t.eot()));
  EXPECT_FALSE(t.vocab().chat_template.empty());
}

TEST_P(BpeAgainstLlamaCpp, EveryCorpusStringGivesLlamaCppsIds) {
  const auto oracle = testdata::load_json(data_dir() + "llamacpp/tokenize-" + GetParam() + ".json");
  const Tokenizer& t = vocab_tokenizer(GetParam());
  const auto& strings = oracle["strings"];
  ASSERT_GE(strings.size(), 500u);
  int compared = 0, mismatches = 0;
  for (const auto& entry : strings) {
    const std::string text = entry_bytes(entry);
    if (entry.contains("error")) {
      // llama.cpp dies on a code point above U+10FFFF; duet reads it as U+FFFD instead.
      EXPECT_NO_THROW(t.encode(text, false)) << entry.dump();
      continue;
    }
    const auto plain = t.encode(text, false);
    const auto special = t.encode(text, false, true);
    const bool ok = plain == entry["plain"].get<std::vector<int32_t>>() &&
                    special == entry["special"].get<std::vector<int32_t>>();
    if (!ok && ++mismatches <= 20) {
      ADD_FAILURE() << entry.dump() << "\n duet plain:   " << show(plain)
                    << "\n duet special: " << show(special);
    }
    if (entry.contains("plain_add_special")) {
      EXPECT_EQ(t.encode(text, true), entry["plain_add_special"].get<std::vector<int32_t>>())
          << entry.dump();
    }
    ++compared;
  }
  EXPECT_EQ(mismatches, 0) << "of " << compared << " strings";
  EXPECT_GE(compared, 500);
}

TEST_P(BpeAgainstLlamaCpp, DecodeGivesBackTheExactBytesOfPlainTokenisation) {
  const auto corpus = testdata::load_json(data_dir() + "llamacpp/corpus.json");
  const Tokenizer& t = vocab_tokenizer(GetParam());
  for (const auto& entry : corpus["strings"]) {
    if (!entry.contains("text")) continue;  // invalid UTF-8 is read as U+FFFD: not invertible
    const std::string text = entry["text"];
    const auto ids = t.encode(text, false);
    EXPECT_EQ(t.decode(ids), text) << entry.dump();
    Tokenizer::StreamDecoder stream(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = stream.push(id);
      EXPECT_TRUE(is_whole_utf8(part)) << entry.dump();  // never half a character
      streamed += part;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, text) << entry.dump();
  }
}

// Random bytes (valid UTF-8 or not, special-token texts mixed in) never crash or throw, with and
// without parse_special, and decoding streams exactly what decode() gives.
TEST_P(BpeAgainstLlamaCpp, RandomBytesEncodeAndDecodeConsistently) {
  const Tokenizer& t = vocab_tokenizer(GetParam());
  std::mt19937 rng(18);
  const std::vector<std::string> pieces = {
      "<|eot_id|>", "<|im_end|>",   "<think>",          " ",  "\n",
      "12",         "\xe6\x97\xa5", "\xf0\x9f\x99\x82", "'s", "\r\n"};
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) {
      if (rng() % 3 == 0)
        text += pieces[rng() % pieces.size()];
      else
        text.push_back(static_cast<char>(rng() % 256));
    }
    for (bool special : {false, true}) {
      const auto ids = t.encode(text, false, special);
      Tokenizer::StreamDecoder stream(t);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.flush();
      EXPECT_EQ(streamed, t.decode(ids));
    }
  }
}

// llama3 (pre llama-bpe) and qwen2 are the real vocabs; bpe-* are Llama 3's first 4000 merges
// with another pre-tokenizer (tools/vocab/pre_variant.py), for the gpt-2, default (four regex
// passes) and starcoder patterns.
INSTANTIATE_TEST_SUITE_P(Vocabs, BpeAgainstLlamaCpp,
                         ::testing::Values("llama3", "qwen2", "bpe-gpt-2", "bpe-default",
                                           "bpe-starcoder"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-') c = '_';
                           return name;
                         });

// SentencePiece (tiny-fortune, whose "\n" is a user-defined piece): with special parsing duet
// follows llama.cpp's partition and gives llama.cpp's ids on the whole corpus; without it duet
// keeps sentencepiece's rules (the SentencePiece reference vectors), which differ from
// llama.cpp's only around a user-defined piece. Bytes that are not UTF-8 ("hex" entries) are
// the one other difference, in both modes: sentencepiece reads them as U+FFFD, llama.cpp's
// byte fallback keeps the byte; duet stays with sentencepiece, the reference of this format.
TEST(SpmAgainstLlamaCpp, ParseSpecialGivesLlamaCppsIdsAndPlainDiffersOnlyAtUserDefinedPieces) {
  const auto oracle = testdata::load_json(data_dir() + "llamacpp/tokenize-fortune.json");
  const auto f = GgufFile::open(data_dir() + "tiny-fortune/fortune-f16.gguf");
  const Tokenizer t(Vocab::from_gguf(*f));
  ASSERT_EQ(t.vocab().kind, Vocab::Kind::spm);
  int compared = 0, special_mismatches = 0, plain_differs = 0;
  for (const auto& entry : oracle["strings"]) {
    if (entry.contains("error") || entry.contains("hex")) continue;
    const std::string text = entry_bytes(entry);
    const auto special = t.encode(text, false, true);
    if (special != entry["special"].get<std::vector<int32_t>>() && ++special_mismatches <= 20)
      ADD_FAILURE() << entry.dump() << "\n duet special: " << show(special);
    if (t.encode(text, false) != entry["plain"].get<std::vector<int32_t>>()) {
      ++plain_differs;
      EXPECT_NE(text.find('\n'), std::string::npos) << entry.dump();
    }
    ++compared;
  }
  EXPECT_EQ(special_mismatches, 0) << "of " << compared << " strings";
  EXPECT_GE(compared, 500);
  std::printf("tiny-fortune: plain text differs from llama.cpp on %d of %d strings (all at \\n)\n",
              plain_differs, compared);
}

}  // namespace
}  // namespace duet
