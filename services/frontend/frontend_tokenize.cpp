// Tokenize / Detokenize: the stack's own tokenizer for clients, so http_svc's /tokenize and
// /detokenize (llama-server's shapes) count tokens exactly as Generate does.
#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

void Frontend::on_tokenize(const std::vector<std::string>& routing, uint64_t id,
                           const fbc::Tokenize& t) {
  check_model(t.model());
  const std::string_view text = t.text() ? t.text()->string_view() : std::string_view();
  if (text.size() > options_.max_prompt_bytes)
    throw Error(Errc::out_of_range, "text of " + std::to_string(text.size()) +
                                        " bytes exceeds the limit of " +
                                        std::to_string(options_.max_prompt_bytes));
  if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
    throw Error(Errc::invalid_argument,
                "text is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
  const std::vector<int32_t> ids = tokenizer_.encode(text, t.add_special(), t.parse_special());
  // Each id's piece is the text it adds when the ids are decoded in order (a byte piece that
  // ends a UTF-8 character carries the whole character, the ones before it nothing).
  Tokenizer::StreamDecoder decoder(tokenizer_);
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<flatbuffers::String>> pieces;
  pieces.reserve(ids.size());
  for (const int32_t tok : ids) pieces.push_back(fbb.CreateString(decoder.push(tok)));
  auto body = fbc::CreateTokenizeReplyDirect(fbb, &ids, &pieces);
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::TokenizeReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

void Frontend::on_detokenize(const std::vector<std::string>& routing, uint64_t id,
                             const fbc::Detokenize& d) {
  check_model(d.model());
  std::vector<int32_t> ids;
  if (d.ids()) {
    if (d.ids()->size() > static_cast<size_t>(options_.max_prompt_bytes))
      throw Error(Errc::out_of_range, "Detokenize of " + std::to_string(d.ids()->size()) +
                                          " ids exceeds the limit of " +
                                          std::to_string(options_.max_prompt_bytes));
    for (const int32_t t : *d.ids()) {
      if (t < 0 || t >= tokenizer_.n_vocab())
        throw Error(Errc::invalid_argument, "token id " + std::to_string(t) +
                                                " is outside the vocabulary [0, " +
                                                std::to_string(tokenizer_.n_vocab()) + ")");
      ids.push_back(t);
    }
  }
  const std::string text = tokenizer_.decode(ids);
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateDetokenizeReply(fbb, fbb.CreateString(text));
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::DetokenizeReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

}  // namespace duet::frontend
