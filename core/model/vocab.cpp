// Vocab::from_gguf: the tokenizer.* metadata of a GGUF file, with llama.cpp's defaults.
#include <algorithm>
#include <array>

#include "core/base/error.h"
#include "core/model/bpe_pretokenize.h"
#include "core/model/gguf.h"
#include "core/model/tokenizer.h"

namespace duet {
namespace {

// llama.cpp finds the end-of-turn token by its text when the metadata has no eot id; the first
// of these texts the vocab has (in this order) is the one.
constexpr std::array<std::string_view, 11> kEotTexts = {
    "<|eot_id|>",        "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>",   "<EOT>",      "_<EOT>",  "[EOT]",         "<｜end▁of▁sentence｜>",
    "<end_of_utterance>"};

}  // namespace

Vocab Vocab::from_gguf(const GgufFile& f) {
  auto bad = [&](const std::string& what) {
    return Error(Errc::bad_format, f.path() + ": " + what);
  };
  if (!f.has("tokenizer.ggml.model")) throw bad("no tokenizer.ggml.model");
  const std::string model = f.get_string("tokenizer.ggml.model");
  Vocab v;
  if (model == "llama") {
    v.kind = Kind::spm;
  } else if (model == "gpt2") {
    v.kind = Kind::bpe;
  } else {
    throw Error(Errc::unsupported,
                f.path() + ": tokenizer.ggml.model '" + model +
                    "' is not supported (only 'llama', SentencePiece, and 'gpt2', byte-level BPE)");
  }
  if (f.has("tokenizer.ggml.pre")) v.pre = f.get_string("tokenizer.ggml.pre");
  if (!f.has("tokenizer.ggml.tokens")) throw bad("no tokenizer.ggml.tokens");
  v.pieces = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = v.pieces.size();
  if (n == 0) throw bad("tokenizer.ggml.tokens is empty");
  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_float_array("tokenizer.ggml.scores");
    if (v.scores.size() != n)
      throw bad("tokenizer.ggml.scores has " + std::to_string(v.scores.size()) + " entries for " +
                std::to_string(n) + " tokens");
  } else {
    v.scores.assign(n, 0.0f);
  }
  if (f.has("tokenizer.ggml.token_type")) {
    v.types = f.get_int_array("tokenizer.ggml.token_type");
    if (v.types.size() != n)
      throw bad("tokenizer.ggml.token_type has " + std::to_string(v.types.size()) +
                " entries for " + std::to_string(n) + " tokens");
  } else {
    v.types.assign(n, static_cast<int32_t>(TokenType::normal));
  }

  const PreTokenizerInfo* pre = nullptr;
  if (v.kind == Kind::bpe) {
    if (!f.has("tokenizer.ggml.merges")) throw bad("no tokenizer.ggml.merges (a gpt2 tokenizer)");
    v.merges = f.get_string_array("tokenizer.ggml.merges");
    pre = find_pretokenizer(v.pre);
    if (pre == nullptr) {
      throw bad("unknown pre-tokenizer tokenizer.ggml.pre = '" + v.pre +
                "' (known: " + known_pretokenizer_names() + ")");
    }
    // llama.cpp's BPE defaults: ids 11 (disabled below when the vocab is smaller), no dummy
    // prefix, BOS only where the pre-tokenizer's family adds one.
    v.bos = 11;
    v.eos = 11;
    v.unk = -1;
    v.add_space_prefix = false;
    v.add_bos = pre->add_bos;
    v.add_eos = false;
  }

  // A default that does not fit the vocab is no token; an id the file states must fit.
  auto read_id = [&](const char* key, int32_t fallback) {
    if (fallback >= 0 && static_cast<size_t>(fallback) >= n) fallback = -1;
    if (!f.has(key)) return fallback;
    const uint64_t id = f.get_uint(key);
    if (id >= n)
      throw bad(std::string(key) + " = " + std::to_string(id) + " is outside the vocab of " +
                std::to_string(n) + " tokens");
    return static_cast<int32_t>(id);
  };
  v.bos = read_id("tokenizer.ggml.bos_token_id", v.bos);
  v.eos = read_id("tokenizer.ggml.eos_token_id", v.eos);
  v.unk = read_id("tokenizer.ggml.unknown_token_id", v.unk);
  v.pad = read_id("tokenizer.ggml.padding_token_id", -1);
  v.eot = read_id("tokenizer.ggml.eot_token_id", -1);
  if (v.eot < 0) {
    for (std::string_view text : kEotTexts) {
      const auto it = std::find(v.pieces.begin(), v.pieces.end(), text);
      if (it != v.pieces.end()) {
        v.eot = static_cast<int32_t>(it - v.pieces.begin());
        break;
      }
    }
  }

  auto read_bool = [&](const char* key, bool& out) {
    if (!f.has(key)) return;
    const GgufValue& value = f.value(key);
    if (value.type != GgufType::BOOL) throw bad(std::string(key) + " is not a bool");
    out = value.u != 0;
  };
  read_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  read_bool("tokenizer.ggml.add_eos_token", v.add_eos);
  read_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (v.add_bos && v.bos < 0) throw bad("add_bos_token is true, but there is no BOS token id");
  if (v.add_eos && v.eos < 0) throw bad("add_eos_token is true, but there is no EOS token id");
  if (f.has("tokenizer.chat_template")) v.chat_template = f.get_string("tokenizer.chat_template");
  return v;
}

}  // namespace duet
