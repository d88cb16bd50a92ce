// The SentencePiece tokenizer against sentencepiece itself (tokenizer-vectors.json), its
// detokenizer and streaming decoder, bad input, and the `duet tokenize` verb.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/tokenizer.h"
#include "reference_data.h"

namespace duet {
namespace {

const Tokenizer& fortune_tokenizer() {
  static const Tokenizer t = [] {
    const auto f = GgufFile::open(testdata::fortune_model("q8_0"));
    return Tokenizer(Vocab::from_gguf(*f));
  }();
  return t;
}

bool is_valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t len = b < 0x80             ? 1
                       : (b & 0xe0) == 0xc0 ? 2
                       : (b & 0xf0) == 0xe0 ? 3
                       : (b & 0xf8) == 0xf0 ? 4
                                            : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

TEST(Tokenizer, VocabFromFortuneGguf) {
  const Vocab& v = fortune_tokenizer().vocab();
  EXPECT_EQ(v.pieces.size(), 2048u);
  EXPECT_EQ(v.bos, 1);
  EXPECT_EQ(v.eos, 2);
  EXPECT_EQ(v.unk, 0);
  EXPECT_EQ(v.pieces[3], "\n");
  EXPECT_EQ(v.types[3], static_cast<int32_t>(TokenType::user_defined));
  EXPECT_EQ(v.pieces[4], "<0x00>");
  EXPECT_EQ(v.types[4], static_cast<int32_t>(TokenType::byte));
}

TEST(Tokenizer, MatchesSentencePieceOnEveryVector) {
  const auto vectors = testdata::load_json(testdata::fortune_dir() + "tokenizer-vectors.json");
  ASSERT_GE(vectors.size(), 20u);
  const Tokenizer& t = fortune_tokenizer();
  for (const auto& v : vectors) {
    const std::string text = v["text"];
    const auto ids = t.encode(text, false);
    EXPECT_EQ(ids, v["ids"].get<std::vector<int32_t>>()) << "text: " << v["text"].dump();
    std::vector<std::string> pieces;
    for (int32_t id : ids) pieces.push_back(t.vocab().pieces[static_cast<size_t>(id)]);
    EXPECT_EQ(pieces, v["pieces"].get<std::vector<std::string>>()) << "text: " << v["text"].dump();
  }
}

// A completion continues its prompt: SentencePiece's "▁" at its start is the text's space, which
// decode() of the completion alone drops as the dummy prefix. token_bytes() is each token's part.
TEST(Tokenizer, ACompletionAfterTextKeepsItsLeadingSpaceAndTokenBytesAreItsParts) {
  const Tokenizer& t = fortune_tokenizer();
  const std::vector<int32_t> prompt = t.encode("The meaning of life is", true);
  const std::vector<int32_t> whole = t.encode("The meaning of life is a state of mind", true);
  ASSERT_GT(whole.size(), prompt.size());
  ASSERT_TRUE(std::equal(prompt.begin(), prompt.end(), whole.begin()));
  const std::vector<int32_t> completion(whole.begin() + static_cast<std::ptrdiff_t>(prompt.size()),
                                        whole.end());
  EXPECT_TRUE(t.ends_in_text(prompt));
  EXPECT_FALSE(t.ends_in_text(std::vector<int32_t>{t.bos()}));
  Tokenizer::StreamDecoder after(t, true), fresh(t);
  std::string continued, alone, parts;
  for (const int32_t id : completion) {
    continued += after.push(id);
    alone += fresh.push(id);
    parts += t.token_bytes(id);
  }
  continued += after.flush();
  alone += fresh.flush();
  EXPECT_EQ(continued, " a state of mind");
  EXPECT_EQ(alone, "a state of mind");  // HF's decode of the completion alone
  EXPECT_EQ(parts, continued);
  EXPECT_EQ(t.decode(prompt) + continued, t.decode(whole));
  EXPECT_EQ(t.token_bytes(t.bos()), "");  // a control token adds nothing
  // token_texts: each token's part of decode(ids), the dummy prefix dropped as decode drops it.
  std::string parts_of_whole;
  for (const std::string& p : t.token_texts(whole)) parts_of_whole += p;
  EXPECT_EQ(parts_of_whole, t.decode(whole));
  EXPECT_EQ(t.token_texts(whole).size(), whole.size());
}

TEST(Tokenizer, DecodeInvertsEncodeOnEveryVector) {
  const auto vectors = testdata::load_json(testdata::fortune_dir() + "tokenizer-vectors.json");
  const Tokenizer& t = fortune_tokenizer();
  for (const auto& v : vectors) {
    const std::string text = v["text"];
    EXPECT_EQ(t.decode(t.encode(text, true)), text) << "text: " << v["text"].dump();
  }
}

// heldout-ids.json is sentencepiece's encoding of whole fortunes (BOS text EOS, the last one cut
// off): decoding each complete one and encoding it again must give back exactly its ids.
TEST(Tokenizer, ReencodesEveryHeldOutFortuneToSentencePiecesIds) {
  const auto ids = testdata::load_json(testdata::fortune_dir() + "heldout-ids.json")["ids"]
                       .get<std::vector<int32_t>>();
  const Tokenizer& t = fortune_tokenizer();
  int fortunes = 0;
  for (size_t begin = 0; begin < ids.size();) {
    ASSERT_EQ(ids[begin], t.bos());
    const auto end =
        std::find(ids.begin() + static_cast<std::ptrdiff_t>(begin), ids.end(), t.eos());
    if (end == ids.end()) break;
    const std::vector<int32_t> fortune(ids.begin() + static_cast<std::ptrdiff_t>(begin) + 1, end);
    const std::string text = t.decode(fortune);
    EXPECT_EQ(t.encode(text, false), fortune) << "fortune " << fortunes << ": " << text;
    ++fortunes;
    begin = static_cast<size_t>(end - ids.begin()) + 1;
  }
  EXPECT_GT(fortunes, 20);
}

TEST(Tokenizer, BosIsPrependedOnRequestAndDecodeSkipsBosAndEos) {
  const Tokenizer& t = fortune_tokenizer();
  EXPECT_EQ(t.encode("Hello world", true), (std::vector<int32_t>{1, 378, 462, 1940, 689}));
  EXPECT_EQ(t.encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(t.decode({1, 378, 462, 1940, 689, 2}), "Hello world");
}

TEST(Tokenizer, ControlPiecesInTextAreJustCharacters) {
  const Tokenizer& t = fortune_tokenizer();
  const auto ids = t.encode("<s></s><unk><0x41>", false);
  for (int32_t id : ids) {
    const auto type = static_cast<TokenType>(t.vocab().types[static_cast<size_t>(id)]);
    EXPECT_NE(type, TokenType::control);
    EXPECT_NE(type, TokenType::unknown);
    EXPECT_NE(type, TokenType::byte);
  }
  EXPECT_EQ(t.decode(ids), "<s></s><unk><0x41>");
}

TEST(Tokenizer, ParseSpecialTurnsControlTextsIntoTheirIds) {
  const Tokenizer& t = fortune_tokenizer();
  std::vector<int32_t> expected{1};
  for (int32_t id : t.encode("Hello world", false)) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(t.encode("<s>Hello world</s>", false, true), expected);
  // As llama.cpp: the text after a special token gets the dummy prefix again.
  const auto again = t.encode("</s>Hello", false, true);
  EXPECT_EQ(again.front(), 2);
  EXPECT_EQ(std::vector<int32_t>(again.begin() + 1, again.end()), t.encode("Hello", false));
  // Only inside a special span when the spans are given.
  const std::string text = "<s>Hi</s>";
  const TextSpan first_marker{0, 3};
  const auto spans = t.encode_with_special_spans(text, false, std::span(&first_marker, 1));
  EXPECT_EQ(spans.front(), 1);
  EXPECT_EQ(std::count(spans.begin(), spans.end(), 2), 0);
  EXPECT_EQ(t.decode(spans), "Hi</s>");
  EXPECT_EQ(t.encode_with_special_spans(text, false, {}), t.encode(text, false));
}

TEST(Tokenizer, NewlineIsUserDefinedAndTheNextWordHasNoSpaceMark) {
  const Tokenizer& t = fortune_tokenizer();
  // "▁a", "\n", then "b" without "▁": sentencepiece, not llama.cpp.
  const auto ids = t.encode("a\nb", false);
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.vocab().pieces[static_cast<size_t>(ids[0])],
            "\xe2\x96\x81"
            "a");
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(t.vocab().pieces[static_cast<size_t>(ids[2])], "b");
}

TEST(Tokenizer, InvalidUtf8BecomesReplacementCharacterBytes) {
  const Tokenizer& t = fortune_tokenizer();
  // A stray 0xFF and a truncated 3-byte sequence: each bad byte is U+FFFD, encoded as its three
  // byte pieces (as sentencepiece's normaliser does); nothing is dropped, nothing crashes.
  const auto ids = t.encode(
      "a\xff"
      "b\xe6\x97",
      false);
  const std::string replacement = "\xef\xbf\xbd";
  EXPECT_EQ(t.decode(ids), "a" + replacement + "b" + replacement + replacement);
  int byte_pieces = 0;
  for (int32_t id : ids)
    byte_pieces +=
        t.vocab().types[static_cast<size_t>(id)] == static_cast<int32_t>(TokenType::byte);
  EXPECT_EQ(byte_pieces, 9);
}

TEST(Tokenizer, DecodeTurnsBrokenByteRunsIntoReplacementCharacters) {
  const Tokenizer& t = fortune_tokenizer();
  const int32_t e6 = t.piece_to_id("<0xE6>"), x97 = t.piece_to_id("<0x97>"),
                xa5 = t.piece_to_id("<0xA5>");
  const int32_t a = t.encode("a", false).back();
  EXPECT_EQ(t.decode({e6, x97, xa5}), "\xe6\x97\xa5");  // 日
  EXPECT_EQ(t.decode({e6, x97, a}),
            "\xef\xbf\xbd\xef\xbf\xbd a");     // cut short: one U+FFFD per byte
  EXPECT_EQ(t.decode({x97}), "\xef\xbf\xbd");  // a stray continuation byte
}

TEST(Tokenizer, OutOfRangeIdsAreRejected) {
  const Tokenizer& t = fortune_tokenizer();
  EXPECT_THROW(t.decode({5, 2048}), Error);
  try {
    t.decode({-1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos);
  }
}

TEST(Tokenizer, StreamDecoderNeverSplitsACharacterAndAgreesWithDecode) {
  const Tokenizer& t = fortune_tokenizer();
  const auto vectors = testdata::load_json(testdata::fortune_dir() + "tokenizer-vectors.json");
  for (const auto& v : vectors) {
    const auto ids = t.encode(v["text"].get<std::string>(), true);
    Tokenizer::StreamDecoder stream(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string part = stream.push(id);
      EXPECT_TRUE(is_valid_utf8(part)) << "text: " << v["text"].dump();
      streamed += part;
    }
    streamed += stream.flush();
    EXPECT_EQ(streamed, t.decode(ids)) << "text: " << v["text"].dump();
  }
  // An emoji arrives as 4 byte pieces: nothing shows until the last one.
  const auto emoji = t.encode("\xf0\x9f\x99\x82", false);  // "▁" then 4 bytes
  ASSERT_EQ(emoji.size(), 5u);
  Tokenizer::StreamDecoder stream(t);
  EXPECT_EQ(stream.push(emoji[0]), "");
  EXPECT_EQ(stream.push(emoji[1]), "");
  EXPECT_EQ(stream.push(emoji[2]), "");
  EXPECT_EQ(stream.push(emoji[3]), "");
  EXPECT_EQ(stream.push(emoji[4]), "\xf0\x9f\x99\x82");
  EXPECT_EQ(stream.push(emoji[1]), "");
  EXPECT_EQ(stream.flush(), "\xef\xbf\xbd");  // a sequence cut short by the end of the stream
}

TEST(Tokenizer, LongUnbrokenTextEncodesInNearLinearTime) {
  // One 256 KiB "word" with no spaces: a quadratic merge loop would take minutes.
  std::string text;
  const std::string chunk = "Thequickbrownfoxjumpsoverthelazydog";
  while (text.size() < (256u << 10)) text += chunk;
  const auto start = std::chrono::steady_clock::now();
  const auto ids = fortune_tokenizer().encode(text, false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(fortune_tokenizer().decode(ids), text);
  std::printf("encode: %zu bytes -> %zu tokens in %.3f s (%.1f MB/s)\n", text.size(), ids.size(),
              seconds, static_cast<double>(text.size()) / 1e6 / seconds);
}

TEST(Tokenizer, OtherTokenizerModelsAreRejectedWithTheirName) {
  const std::string path = ::testing::TempDir() + "duet-bert-vocab.gguf";
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
  w.write(path);
  const auto f = GgufFile::open(path);
  try {
    Vocab::from_gguf(*f);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unsupported);
    EXPECT_NE(std::string(e.what()).find("bert"), std::string::npos);
  }
  std::filesystem::remove(path);
}

TEST(Tokenizer, InconsistentVocabIsRejected) {
  Vocab v;
  v.pieces = {"<unk>", "<s>", "</s>", "a"};
  v.scores = {0, 0, 0};
  v.types = {2, 3, 3, 1};
  EXPECT_THROW(Tokenizer{v}, Error);  // 4 pieces, 3 scores
  v.scores.push_back(0);
  v.types[3] = 6;  // a byte piece that is not <0xNN>
  EXPECT_THROW(Tokenizer{v}, Error);
  v.types[3] = 1;
  v.bos = 7;  // outside the vocab
  EXPECT_THROW(Tokenizer{v}, Error);
}

// `duet tokenize` is the tokenizer's command-line face: run the real binary.
TEST(Tokenizer, CliPrintsIdsWithoutBos) {
  const std::string bin = std::string(DUET_BINARY_DIR) + "/bin/duet";
  ASSERT_TRUE(std::filesystem::exists(bin)) << bin << " is missing: build the duet target";
  const std::string cmd = "timeout 30 " + bin + " tokenize --model " +
                          testdata::fortune_model("q8_0") + " --text 'Hello world' 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "378 462 1940 689\n");
}

}  // namespace
}  // namespace duet
