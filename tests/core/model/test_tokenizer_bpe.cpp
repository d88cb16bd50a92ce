// Byte-level BPE on a small hand-made vocab (written as a GGUF with GgufWriter): merge order,
// the long-word path, special and user-defined tokens, invalid UTF-8, exact-byte decoding and
// streaming, the bad-file errors, and `duet tokenize` on a vocab-only GGUF.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/gguf_writer.h"
#include "core/model/tokenizer.h"

namespace duet {
namespace {

// GPT-2's byte-level character for a byte (printable bytes are themselves).
std::string byte_char(uint8_t b) {
  uint32_t cp = b, next = 256;
  for (uint32_t c = 0; c < 256; ++c) {
    const bool printable = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
    if (!printable) {
      if (c == b) cp = next;
      ++next;
    }
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
  return s;
}

struct HandVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  std::string pre = "llama-bpe";
  int32_t id(const std::string& text) const {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == text) return static_cast<int32_t>(i);
    return -1;
  }
  int32_t add(const std::string& text, TokenType type = TokenType::normal) {
    tokens.push_back(text);
    types.push_back(static_cast<int32_t>(type));
    return static_cast<int32_t>(tokens.size()) - 1;
  }
  void merge(const std::string& a, const std::string& b) {
    merges.push_back(a + " " + b);
    if (id(a + b) < 0) add(a + b);
  }
};

// Ids 0..255: one token per byte (its byte-level character), then merges and specials.
HandVocab base_vocab() {
  HandVocab v;
  for (int b = 0; b < 256; ++b) v.add(byte_char(static_cast<uint8_t>(b)));
  return v;
}

// The vocabs these tests write live in one directory per process, removed at exit (ctest runs
// test binaries side by side, and nothing may be left in /tmp).
const std::filesystem::path& vocab_dir() {
  struct Dir {
    std::filesystem::path path =
        std::filesystem::path(::testing::TempDir()) / ("duet-bpe-" + std::to_string(::getpid()));
    Dir() { std::filesystem::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string write_vocab(const HandVocab& v, const std::string& name,
                        void (*extra)(GgufWriter&) = nullptr) {
  const std::string path = (vocab_dir() / (name + ".gguf")).string();
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", v.pre);
  w.set_string_array("tokenizer.ggml.tokens", v.tokens);
  w.set_int32_array("tokenizer.ggml.token_type", v.types);
  w.set_string_array("tokenizer.ggml.merges", v.merges);
  w.set_uint32("tokenizer.ggml.bos_token_id", 0);
  w.set_uint32("tokenizer.ggml.eos_token_id", 1);
  w.set_bool("tokenizer.ggml.add_bos_token", false);
  if (extra) extra(w);
  w.write(path);
  return path;
}

Tokenizer load(const std::string& path) {
  const auto f = GgufFile::open(path);
  return Tokenizer(Vocab::from_gguf(*f));
}

TEST(TokenizerBpe, LowerMergeRankWinsAndTiesGoLeftmost) {
  HandVocab v = base_vocab();
  v.merge("a", "b");
  v.merge("b", "c");
  const Tokenizer first = load(write_vocab(v, "rank-ab"));
  EXPECT_EQ(first.encode("abc", false), (std::vector<int32_t>{v.id("ab"), 'c'}));
  EXPECT_EQ(first.encode("abab", false), (std::vector<int32_t>{v.id("ab"), v.id("ab")}));

  HandVocab w = base_vocab();
  w.merge("b", "c");
  w.merge("a", "b");
  const Tokenizer second = load(write_vocab(w, "rank-bc"));
  EXPECT_EQ(second.encode("abc", false), (std::vector<int32_t>{'a', w.id("bc")}));
}

TEST(TokenizerBpe, LongWordsMergeAsShortOnes) {
  HandVocab v = base_vocab();
  v.merge("a", "a");
  v.merge("aa", "aa");
  const Tokenizer t = load(write_vocab(v, "long"));
  // 40 letters take the rescanning path, 400 the heap path: both end in "aaaa" tokens.
  EXPECT_EQ(t.encode(std::string(40, 'a'), false), std::vector<int32_t>(10, v.id("aaaa")));
  EXPECT_EQ(t.encode(std::string(400, 'a'), false), std::vector<int32_t>(100, v.id("aaaa")));
  auto odd = std::vector<int32_t>(100, v.id("aaaa"));
  odd.push_back(v.id("aa"));
  odd.push_back('a');
  EXPECT_EQ(t.encode(std::string(403, 'a'), false), odd);
}

TEST(TokenizerBpe, SpacesAreByteLevelCharactersAndWordsSplitBeforeThem) {
  HandVocab v = base_vocab();
  const std::string space = byte_char(' ');  // "Ġ"
  v.merge(space, "h");
  v.merge("h", "i");
  v.merge(space + "h", "i");
  const Tokenizer t = load(write_vocab(v, "space"));
  // llama3's pattern: "hi", " hi", "  " before " hi" keeps one space for the word.
  EXPECT_EQ(t.encode("hi hi", false), (std::vector<int32_t>{v.id("hi"), v.id(space + "hi")}));
  EXPECT_EQ(t.encode("hi   hi", false),
            (std::vector<int32_t>{v.id("hi"), ' ', ' ', v.id(space + "hi")}));
  EXPECT_EQ(t.decode(t.encode("hi   hi", false)), "hi   hi");
}

TEST(TokenizerBpe, ControlTokensNeedParseSpecialUserDefinedOnesDoNot) {
  HandVocab v = base_vocab();
  const int32_t end = v.add("<|end|>", TokenType::control);
  const int32_t mark = v.add("<u>", TokenType::user_defined);
  const Tokenizer t = load(write_vocab(v, "special"));
  const auto plain = t.encode("a<|end|>b<u>c", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), end), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), mark), 1);
  const auto special = t.encode("a<|end|>b<u>c", false, true);
  EXPECT_EQ(special, (std::vector<int32_t>{'a', end, 'b', mark, 'c'}));
  // decode: control tokens print nothing, user-defined ones their text.
  EXPECT_EQ(t.decode(special), "ab<u>c");
  EXPECT_TRUE(t.is_eog(end));  // "<|end|>" ends generation, as in llama.cpp
  // A special span admits exactly the marker inside it.
  const std::string text = "<|end|>x<|end|>";
  const TextSpan marker{8, 15};
  EXPECT_EQ(t.encode_with_special_spans(text, false, std::span(&marker, 1)).back(), end);
  EXPECT_EQ(t.encode_with_special_spans(text, false, std::span(&marker, 1)).front(), '<');
}

TEST(TokenizerBpe, InvalidUtf8IsReadAsReplacementCharacters) {
  const Tokenizer t = load(write_vocab(base_vocab(), "invalid"));
  // A stray 0xFF is U+FFFD (EF BF BD) to llama.cpp: its three byte tokens.
  EXPECT_EQ(t.encode("\xff", false), (std::vector<int32_t>{0xef, 0xbf, 0xbd}));
  // An overlong NUL (C0 80) is read as the code point it spells.
  EXPECT_EQ(t.encode(std::string("\xc0\x80", 2), false), (std::vector<int32_t>{0}));
  // Above U+10FFFF llama.cpp aborts; duet reads one U+FFFD.
  EXPECT_EQ(t.encode("\xf4\x90\x80\x80", false), (std::vector<int32_t>{0xef, 0xbf, 0xbd}));
}

TEST(TokenizerBpe, StreamDecoderHoldsASplitCharacterAndDecodeIsExact) {
  const Tokenizer t = load(write_vocab(base_vocab(), "stream"));
  const auto ids = t.encode("\xc3\xa9!", false);  // "é!" as byte tokens C3 A9 21
  ASSERT_EQ(ids, (std::vector<int32_t>{0xc3, 0xa9, '!'}));
  Tokenizer::StreamDecoder stream(t);
  EXPECT_EQ(stream.push(ids[0]), "");
  EXPECT_EQ(stream.push(ids[1]), "\xc3\xa9");
  EXPECT_EQ(stream.push(ids[2]), "!");
  EXPECT_EQ(stream.push(0xe6), "");
  EXPECT_EQ(stream.flush(), "\xe6");  // exact bytes, even unfinished
  EXPECT_EQ(t.decode({0xe6, 0x97}), "\xe6\x97");
  EXPECT_THROW(t.decode({300}), Error);
}

TEST(TokenizerBpe, BadFilesAreRefusedNamingTheProblem) {
  auto expect_error = [](const std::string& path, Errc code,
                         const std::vector<std::string>& words) {
    try {
      load(path);
      FAIL() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      for (const auto& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  HandVocab unknown_pre = base_vocab();
  unknown_pre.pre = "klingon";
  expect_error(write_vocab(unknown_pre, "pre"), Errc::bad_format,
               {"klingon", "llama-bpe", "qwen2"});

  HandVocab bad_merge = base_vocab();
  bad_merge.merges.push_back("a zz");
  expect_error(write_vocab(bad_merge, "merge"), Errc::bad_format, {"a zz", "zz"});

  expect_error(write_vocab(base_vocab(), "eos-range",
                           [](GgufWriter& w) { w.set_uint32("tokenizer.ggml.eos_token_id", 999); }),
               Errc::bad_format, {"tokenizer.ggml.eos_token_id", "999"});
  expect_error(write_vocab(base_vocab(), "eot-range",
                           [](GgufWriter& w) { w.set_uint32("tokenizer.ggml.eot_token_id", 256); }),
               Errc::bad_format, {"tokenizer.ggml.eot_token_id"});
}

std::string run_cli(const std::string& args) {
  const std::string bin = std::string(DUET_BINARY_DIR) + "/bin/duet";
  FILE* pipe = ::popen(("timeout 30 " + bin + " tokenize " + args + " 2>&1").c_str(), "r");
  std::string out;
  char buf[256];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  EXPECT_EQ(::pclose(pipe), 0) << out;
  return out;
}

TEST(TokenizerBpe, CliTokenizesWithAVocabOnlyGguf) {
  const std::string vocab = std::string(DUET_SOURCE_DIR) + "/tests/data/vocab/llama3.gguf";
  ASSERT_TRUE(GgufFile::open(vocab)->tensors().empty());  // tokenizer metadata only
  EXPECT_EQ(run_cli("--model " + vocab + " --text 'Hello world'"), "9906 1917\n");
  EXPECT_EQ(run_cli("--model " + vocab + " --text 'Hello world' --bos"), "128000 9906 1917\n");
  // <|eot_id|> is text without --special and one token with it.
  const auto f = GgufFile::open(vocab);
  const Tokenizer t(Vocab::from_gguf(*f));
  std::string hi;
  for (int32_t id : t.encode("Hi", false)) hi += std::to_string(id) + " ";
  EXPECT_EQ(run_cli("--model " + vocab + " --text 'Hi<|eot_id|>' --special"), hi + "128009\n");
  EXPECT_EQ(run_cli("--model " + vocab + " --text 'Hi<|eot_id|>'").find("128009"),
            std::string::npos);
}

}  // namespace
}  // namespace duet
