// The Tokenizer: token attributes as llama.cpp infers them, the special-token partition, and
// decoding; the models themselves are in tokenizer_spm.cpp and tokenizer_bpe.cpp.
#include "core/model/tokenizer.h"

#include <algorithm>
#include <array>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/tokenizer_bpe.h"
#include "core/model/tokenizer_spm.h"
#include "core/model/utf8.h"

namespace duet {
namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";       // U+2581 "▁"
constexpr std::string_view kUnknownSurface = " \xe2\x81\x87 ";  // sentencepiece's " ⁇ "

// Texts llama.cpp (llama-vocab.cpp, load) treats as control tokens whatever their GGUF type:
// end-of-turn, end-of-message and fill-in-the-middle markers...
constexpr std::array<std::string_view, 47> kControlTexts = {"<|eot_id|>",
                                                            "<|im_end|>",
                                                            "<|end|>",
                                                            "<end_of_turn>",
                                                            "<|endoftext|>",
                                                            "<|end_of_text|>",
                                                            "<EOT>",
                                                            "_<EOT>",
                                                            "[EOT]",
                                                            "<｜end▁of▁sentence｜>",
                                                            "<end_of_utterance>",
                                                            "<|eom_id|>",
                                                            "<|fim_prefix|>",
                                                            "<fim-prefix>",
                                                            "<fim_prefix>",
                                                            "<｜fim▁begin｜>",
                                                            "<PRE>",
                                                            "▁<PRE>",
                                                            "<|code_prefix|>",
                                                            "<|prefix|>",
                                                            "<|fim_suffix|>",
                                                            "<fim-suffix>",
                                                            "<fim_suffix>",
                                                            "<｜fim▁hole｜>",
                                                            "<SUF>",
                                                            "▁<SUF>",
                                                            "<|code_suffix|>",
                                                            "<|suffix|>",
                                                            "<|fim_middle|>",
                                                            "<fim-middle>",
                                                            "<fim_middle>",
                                                            "<｜fim▁end｜>",
                                                            "<MID>",
                                                            "▁<MID>",
                                                            "<|code_middle|>",
                                                            "<|middle|>",
                                                            "<|fim_pad|>",
                                                            "<fim-pad>",
                                                            "<fim_pad>",
                                                            "<PAD>",
                                                            "<|fim_repo|>",
                                                            "<|repo_name|>",
                                                            "<fim-repo>",
                                                            "<REPO>",
                                                            "<reponame>",
                                                            "<|file_sep|>",
                                                            "[PAD]"};
// ...and the texts that end generation (also control), besides the EOS and EOT ids.
constexpr std::array<std::string_view, 26> kEogTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
    // the FIM pad / repo / file-separator markers end generation too
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "<|fim_repo|>", "<|repo_name|>",
    "<|file_sep|>"};

template <size_t N>
bool contains(const std::array<std::string_view, N>& list, std::string_view text) {
  return std::find(list.begin(), list.end(), text) != list.end();
}

}  // namespace

Tokenizer::Tokenizer(Vocab v) : vocab_(std::move(v)) {
  const size_t n = vocab_.pieces.size();
  auto bad = [](const std::string& what) { return Error(Errc::bad_format, "tokenizer: " + what); };
  if (n == 0) throw bad("empty vocab");
  if (n > static_cast<size_t>(INT32_MAX)) throw bad("vocab too large");
  if (vocab_.scores.size() != n || vocab_.types.size() != n) {
    throw bad("vocab has " + std::to_string(n) + " pieces but " +
              std::to_string(vocab_.scores.size()) + " scores and " +
              std::to_string(vocab_.types.size()) + " types");
  }
  const bool spm = vocab_.kind == Vocab::Kind::spm;
  // SentencePiece needs its BOS, EOS and unknown pieces; otherwise -1 means "none".
  struct NamedId {
    const char* name;
    int32_t id;
    bool required;
  };
  const std::array<NamedId, 5> ids = {{{"bos", vocab_.bos, spm},
                                       {"eos", vocab_.eos, spm},
                                       {"unk", vocab_.unk, spm},
                                       {"eot", vocab_.eot, false},
                                       {"pad", vocab_.pad, false}}};
  for (const auto& [name, id, required] : ids) {
    if ((id < 0 && required) || id < -1 || (id >= 0 && static_cast<size_t>(id) >= n))
      throw bad(std::string(name) + " token id " + std::to_string(id) + " outside the vocab of " +
                std::to_string(n));
  }
  if (vocab_.add_bos && vocab_.bos < 0) throw bad("add_bos is set but the vocab has no BOS");
  if (vocab_.add_eos && vocab_.eos < 0) throw bad("add_eos is set but the vocab has no EOS");

  attrs_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    int32_t& type = vocab_.types[i];
    if (type == 0) type = static_cast<int32_t>(TokenType::normal);  // llama.cpp's "undefined"
    if (type < static_cast<int32_t>(TokenType::normal) ||
        type > static_cast<int32_t>(TokenType::byte)) {
      throw bad("token " + std::to_string(i) + " has unknown type " + std::to_string(type));
    }
    attrs_[i] = static_cast<uint8_t>(1u << (type - 1));
    const std::string_view text = vocab_.pieces[i];
    if (contains(kControlTexts, text) || contains(kEogTexts, text)) attrs_[i] |= kControl;
    if (contains(kEogTexts, text)) eog_ids_.push_back(static_cast<int32_t>(i));
    if ((attrs_[i] & (kControl | kUserDefined | kUnknown)) && !text.empty())
      special_by_length_.push_back(static_cast<int32_t>(i));
  }
  for (int32_t id : {vocab_.eos, vocab_.eot})
    if (id >= 0) eog_ids_.push_back(id);
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
  std::stable_sort(special_by_length_.begin(), special_by_length_.end(), [&](int32_t a, int32_t b) {
    return vocab_.pieces[static_cast<size_t>(a)].size() >
           vocab_.pieces[static_cast<size_t>(b)].size();
  });

  if (spm)
    spm_ = std::make_shared<SpmModel>(vocab_);
  else
    bpe_ = std::make_shared<BpeModel>(vocab_);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(const Tokenizer&) = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;

bool Tokenizer::is_eog(int32_t id) const {
  return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t Tokenizer::piece_to_id(std::string_view piece) const {
  return spm_ ? spm_->piece_to_id(piece, vocab_.unk) : bpe_->text_to_id(piece);
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    throw Error(
        Errc::invalid_argument,
        "token id " + std::to_string(id) + " is outside the vocab of " + std::to_string(n_vocab()));
  }
}

std::vector<Tokenizer::Fragment> Tokenizer::partition(std::string_view text, bool parse_special,
                                                      std::span<const TextSpan> spans) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : special_by_length_) {
    const uint8_t attr = attrs_[static_cast<size_t>(id)];
    const bool control_like = (attr & (kControl | kUnknown)) != 0;
    // SentencePiece's user-defined pieces are the encoder's business (sentencepiece's rules),
    // except where special tokens are parsed: there duet follows llama.cpp, whose partition cuts
    // at every user-defined piece too (the next text then gets the dummy prefix again). That is
    // what makes a chat template's ids equal llama.cpp's on a vocab with a user-defined "\n".
    const bool parsing = parse_special || !spans.empty();
    if (!control_like && spm_ && !parsing) continue;
    if (control_like && !parsing) continue;
    const std::string_view piece = vocab_.pieces[static_cast<size_t>(id)];
    auto allowed = [&](size_t at) {
      if (!control_like || parse_special) return true;
      return std::any_of(spans.begin(), spans.end(), [&](const TextSpan& s) {
        return s.begin <= at && at + piece.size() <= s.end;
      });
    };
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      // Every occurrence, leftmost first, cuts the fragment (llama.cpp's tokenizer_st_partition).
      size_t rest = f.begin, search = f.begin;
      while (true) {
        const size_t at = text.substr(0, f.end).find(piece, search);
        if (at == std::string_view::npos) break;
        if (!allowed(at)) {
          search = at + 1;
          continue;
        }
        if (at > rest) next.push_back({-1, rest, at});
        next.push_back({id, at, at + piece.size()});
        rest = search = at + piece.size();
      }
      if (rest < f.end) next.push_back({-1, rest, f.end});
    }
    frags.swap(next);
  }
  return frags;
}

std::vector<int32_t> Tokenizer::encode_fragments(std::string_view text,
                                                 const std::vector<Fragment>& frags,
                                                 bool add_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_special && vocab_.add_bos) ids.push_back(vocab_.bos);
  // SentencePiece: as llama.cpp, a text fragment gets the dummy prefix when it starts the text or
  // follows a special token.
  bool after_special = true;
  for (const Fragment& f : frags) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view part = text.substr(f.begin, f.end - f.begin);
    if (spm_)
      spm_->encode(vocab_, part, after_special, ids);
    else
      bpe_->encode(part, ids);
    after_special = false;
  }
  if (add_special && vocab_.add_eos) ids.push_back(vocab_.eos);
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  return encode_fragments(text, partition(text, parse_special, {}), add_special);
}

std::vector<int32_t> Tokenizer::encode_with_special_spans(
    std::string_view text, bool add_special, std::span<const TextSpan> special_spans) const {
  for (const TextSpan& s : special_spans) {
    if (s.begin > s.end || s.end > text.size())
      throw Error(Errc::invalid_argument, "special span [" + std::to_string(s.begin) + ", " +
                                              std::to_string(s.end) + ") is outside the text of " +
                                              std::to_string(text.size()) + " bytes");
  }
  // An empty span list must still mean "no special tokens", not "parse them all".
  static constexpr TextSpan kNowhere{0, 0};
  const std::span<const TextSpan> spans =
      special_spans.empty() ? std::span<const TextSpan>(&kNowhere, 1) : special_spans;
  return encode_fragments(text, partition(text, false, spans), add_special);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  StreamDecoder decoder(*this);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  text += decoder.flush();
  return text;
}

namespace {

// A SentencePiece piece's text: each "▁" a space.
void append_spm_piece(std::string& out, std::string_view piece) {
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos).starts_with(kSpaceSymbol)) {
      out.push_back(' ');
      pos += kSpaceSymbol.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
}

}  // namespace

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  const uint8_t attr = attrs_[static_cast<size_t>(id)];
  const std::string& piece = vocab_.pieces[static_cast<size_t>(id)];
  if (attr & kControl) return {};
  if (!spm_) {
    // llama.cpp's token_to_piece(special = false): control and unknown tokens print nothing,
    // user-defined ones their text, normal (and byte) ones their bytes; unused ones nothing.
    if (attr & kUnknown) return {};
    if (attr & kUserDefined) return piece;
    return attr & (kNormal | kByte) ? bpe_->token_bytes(id) : std::string();
  }
  if (const int16_t byte = spm_->byte_of(id); byte >= 0) return std::string(1, char(byte));
  if (attr & kUnknown) return std::string(kUnknownSurface);
  std::string out;
  append_spm_piece(out, piece);
  return out;
}

std::vector<std::string> Tokenizer::token_texts(std::span<const int32_t> ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  bool started = false;  // a piece with text came before: no dummy prefix any more
  for (const int32_t id : ids) {
    std::string text = token_bytes(id);
    const std::string& piece = vocab_.pieces[static_cast<size_t>(id)];
    if (spm_ && !started && vocab_.add_space_prefix && spm_->byte_of(id) < 0 &&
        !(attrs_[static_cast<size_t>(id)] & (kControl | kUnknown)) &&
        piece.starts_with(kSpaceSymbol))
      text.erase(0, 1);  // the ' ' token_bytes made of the dummy "▁"
    started = started || !text.empty() || piece.starts_with(kSpaceSymbol);
    out.push_back(std::move(text));
  }
  return out;
}

Tokenizer::StreamDecoder::StreamDecoder(const Tokenizer& t, bool after_text)
    : tok_(&t), text_started_(after_text), is_bos_ws_(!after_text) {}

std::string Tokenizer::StreamDecoder::push(int32_t id) {
  tok_->check_id(id);
  return tok_->spm_ ? push_spm(id) : push_bpe(id);
}

std::string Tokenizer::StreamDecoder::push_bpe(int32_t id) {
  pending_bytes_ += tok_->token_bytes(id);
  // Hold back only a character that the next tokens may still complete.
  const size_t ready = utf8::complete_prefix_len(pending_bytes_);
  std::string out = pending_bytes_.substr(0, ready);
  pending_bytes_.erase(0, ready);
  return out;
}

std::string Tokenizer::StreamDecoder::push_spm(int32_t id) {
  std::string out;
  const int16_t byte = tok_->spm_->byte_of(id);
  if (byte >= 0) {
    pending_bytes_.push_back(static_cast<char>(byte));
    pending_bytes_.erase(0, utf8::decode_replacing_invalid(pending_bytes_, false, out));
    text_started_ = text_started_ || !out.empty();
    return out;
  }
  out = flush();
  // As sentencepiece: only the first piece that can carry the dummy prefix loses its "▁".
  if (bos_ws_seen_ || text_started_) is_bos_ws_ = false;
  bos_ws_seen_ = false;
  const uint8_t attr = tok_->attrs_[static_cast<size_t>(id)];
  std::string_view piece = tok_->vocab_.pieces[static_cast<size_t>(id)];
  if (attr & kControl) return out;
  if (attr & kUnknown) {
    out.append(kUnknownSurface);
  } else {
    if (is_bos_ws_ && tok_->vocab_.add_space_prefix && piece.starts_with(kSpaceSymbol)) {
      piece.remove_prefix(kSpaceSymbol.size());
      bos_ws_seen_ = true;
    }
    append_spm_piece(out, piece);
  }
  text_started_ = text_started_ || !out.empty();
  return out;
}

std::string Tokenizer::StreamDecoder::flush() {
  std::string out;
  if (tok_->spm_)
    utf8::decode_replacing_invalid(pending_bytes_, true, out);
  else
    out = pending_bytes_;  // exact bytes, finished or not
  pending_bytes_.clear();
  text_started_ = text_started_ || !out.empty();
  return out;
}

}  // namespace duet
