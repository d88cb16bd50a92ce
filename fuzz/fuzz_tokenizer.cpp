// libFuzzer: any bytes as text to encode with the tiny-fortune vocabulary, and any ids to decode.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/gguf.h"
#include "core/tokenizer.h"

namespace {
const duet::Tokenizer& tokenizer() {
  static std::unique_ptr<duet::Tokenizer> t = [] {
    const char* env = std::getenv("DUET_FUZZ_MODEL");
    auto file = duet::GgufFile::open(env ? env : "tests/data/tiny-fortune/fortune-q4_0.gguf");
    return std::make_unique<duet::Tokenizer>(duet::Vocab::from_gguf(*file));
  }();
  return *t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const duet::Tokenizer& tok = tokenizer();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    std::vector<int32_t> ids = tok.encode(text, true);
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
