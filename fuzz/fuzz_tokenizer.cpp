// libFuzzer: any bytes as text to encode, and any ids to decode, with each kind of vocabulary:
// SentencePiece (tiny-fortune) and byte-level BPE (Llama 3's and Qwen2's real vocabularies).
// The first byte picks the vocabulary and whether special tokens are parsed (everywhere, or in
// a span over the text's first half, as a chat template's markers are).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/tokenizer.h"

namespace {
const duet::Tokenizer& tokenizer(size_t which) {
  static const std::array<const char*, 3> paths = {"tests/data/tiny-fortune/fortune-q4_0.gguf",
                                                   "tests/data/vocab/llama3.gguf",
                                                   "tests/data/vocab/qwen2.gguf"};
  static std::array<std::unique_ptr<duet::Tokenizer>, 3> loaded;
  auto& t = loaded[which % paths.size()];
  if (!t) {
    auto file = duet::GgufFile::open(paths[which % paths.size()]);
    t = std::make_unique<duet::Tokenizer>(duet::Vocab::from_gguf(*file));
  }
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const duet::Tokenizer& tok = tokenizer(mode % 3);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    std::vector<int32_t> ids;
    switch ((mode / 3) % 3) {
      case 0:
        ids = tok.encode(text, true);
        break;
      case 1:
        ids = tok.encode(text, true, /*parse_special=*/true);
        break;
      default: {
        const duet::TextSpan half{0, text.size() / 2};
        ids = tok.encode_with_special_spans(text, true, {&half, 1});
      }
    }
    (void)tok.decode(ids);
  } catch (const duet::Error&) {
  }
  // The same bytes as token ids (some out of range: decode must reject them cleanly).
  std::vector<int32_t> ids(size / 4);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<int32_t>(data[4 * i] | data[4 * i + 1] << 8 | data[4 * i + 2] << 16 |
                                  static_cast<uint32_t>(data[4 * i + 3]) << 24) %
             (tok.n_vocab() + 8);
  try {
    duet::Tokenizer::StreamDecoder stream(tok);
    for (int32_t id : ids) (void)stream.push(id);
    (void)stream.flush();
    (void)tok.decode(ids);
  } catch (const duet::Error&) {
  }
  return 0;
}
