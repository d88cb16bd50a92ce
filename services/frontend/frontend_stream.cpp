// Frontend: a request after its step: sampling its token from the logits, streaming text out at
// UTF-8 boundaries, and its end (finish, fail, release, reap). The step itself is in
// frontend_step.cpp.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

// Where text may be cut without splitting a UTF-8 character: back from `end` past continuation
// bytes.
size_t utf8_boundary(const std::string& text, size_t end) {
  while (end > 0 && end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80)
    --end;
  return end;
}

flatbuffers::Offset<fbc::TokenProb> token_prob(flatbuffers::FlatBufferBuilder& fbb, int32_t id,
                                               float logprob, const std::string& bytes) {
  return fbc::CreateTokenProb(
      fbb, id, logprob,
      fbb.CreateVector(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

}  // namespace

// The log-probabilities of r.generated[from, end) that r holds (its last token_logprobs.size()
// ids have them), as schemas/client.fbs TokenLogprob tables; null when the request asked for none.
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fbc::TokenLogprob>>>
Frontend::logprobs_of(flatbuffers::FlatBufferBuilder& fbb, const Request& r, size_t from) const {
  if (r.logprobs < 0) return 0;
  const size_t first = r.generated.size() - r.token_logprobs.size();  // the first with one
  auto prob = [&](int32_t id, float logprob) {
    return token_prob(fbb, id, logprob, tokenizer_.token_bytes(id));
  };
  std::vector<flatbuffers::Offset<fbc::TokenLogprob>> out;
  for (size_t i = std::max(from, first); i < r.generated.size(); ++i) {
    const TokenLogprobs& lp = r.token_logprobs[i - first];
    std::vector<flatbuffers::Offset<fbc::TokenProb>> top;
    for (const auto& [id, logprob] : lp.top) top.push_back(prob(id, logprob));
    const auto chosen = prob(lp.id, lp.logprob);
    out.push_back(fbc::CreateTokenLogprob(fbb, chosen, fbb.CreateVector(top)));
  }
  return fbb.CreateVector(out);
}

// Done.prompt_logprobs: every prompt token (its text: its part of the prompt's decoded text),
// the first without a logprob (NaN); null when the request asked for none.
flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fbc::TokenLogprob>>>
Frontend::prompt_logprobs_of(flatbuffers::FlatBufferBuilder& fbb, const Request& r) const {
  if (!r.prompt_logprobs) return 0;
  const std::vector<std::string> texts = tokenizer_.token_texts(r.prompt);
  std::vector<flatbuffers::Offset<fbc::TokenLogprob>> out;
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    std::vector<flatbuffers::Offset<fbc::TokenProb>> top;
    float logprob = std::numeric_limits<float>::quiet_NaN();
    if (i > 0 && i - 1 < r.prompt_token_logprobs.size()) {
      const TokenLogprobs& lp = r.prompt_token_logprobs[i - 1];
      logprob = lp.logprob;
      for (const auto& [id, l] : lp.top)
        top.push_back(token_prob(fbb, id, l, tokenizer_.token_bytes(id)));
    }
    const auto chosen = token_prob(fbb, r.prompt[i], logprob, texts[i]);
    out.push_back(fbc::CreateTokenLogprob(fbb, chosen, fbb.CreateVector(top)));
  }
  return fbb.CreateVector(out);
}

// Device restarts the engine has seen ("restarts" in its status; 0 when it does not say).
uint64_t engine_restarts(const Engine& e) {
  try {
    const nlohmann::json s = e.status();
    auto it = s.find("restarts");
    return it != s.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  } catch (const std::exception&) {
    return 0;  // a status the engine cannot give now must not end a request
  }
}

void Frontend::close_seq_of(Request& r) {
  if (r.proactive_lane && parked_batch_) {
    bool parked = false;
    for (StepPart& p : parked_batch_->parts)
      if (p.request == &r) {
        p.request = nullptr;
        parked = true;
      }
    if (parked) {
      // Its KV is part of the parked step: freed once that step is over.
      deferred_close_.push_back(r.seq_id);
      return;
    }
  }
  engine_of(r).close_seq(r.seq_id);
}

void Frontend::apply_part(const StepPart& part, std::span<const float> logits,
                          const StepStats& stats, double now) {
  Request& r = *part.request;
  r.pos += static_cast<int32_t>(part.n_tokens);
  r.flag_wait_us += stats.flag_wait_us;
  r.kv_bytes_copied += stats.kv_bytes_copied;
  if (part.decode) {
    r.modeled_decode_us += stats.modeled_us;
    ++r.modeled_decode_steps;
    r.next_token.reset();
  } else {
    r.n_prefilled += part.n_tokens;
    r.modeled_prefill_us += stats.modeled_us;
  }
  if (r.kind == RequestKind::eval) {
    r.eval_logits.insert(r.eval_logits.end(), logits.begin(), logits.end());
    if (!r.prefilling()) finish(r, "length");
    return;
  }
  if (part.n_logit_rows == 0) {  // a prefill chunk before the last
    journal_progress(r);
    return;
  }
  if (r.prompt_logprobs && !part.decode) {
    // A row per prompt position: row k predicts prompt[first + k + 1]; the prompt's last row,
    // if this part holds it, is the first generated token's.
    const size_t n_vocab = logits.size() / part.n_logit_rows;
    const size_t first = r.n_prefilled - part.n_tokens;
    const int top = std::max(r.logprobs, 0);
    for (size_t k = 0; k < part.n_logit_rows && first + k + 1 < r.prompt.size(); ++k)
      r.prompt_token_logprobs.push_back(
          token_logprobs(logits.subspan(k * n_vocab, n_vocab), r.prompt[first + k + 1], top));
    if (r.prefilling()) return;
    logits = logits.subspan((part.n_logit_rows - 1) * n_vocab, n_vocab);
    if (r.max_tokens == 0) {
      finish(r, "length");
      return;
    }
  }
  const int32_t token = r.sampler->sample(logits);
  if (r.logprobs < 0) {
    accept_token(r, token, now);
    return;
  }
  const TokenLogprobs lp = token_logprobs(logits, token, r.logprobs);
  accept_token(r, token, now, &lp);
}

void Frontend::accept_token(Request& r, int32_t token, double now, const TokenLogprobs* lp) {
  if (r.first_token_ms == 0) r.first_token_ms = now;
  r.last_token_ms = now;
  r.next_token = token;
  if (tokenizer_.is_eog(token) && !r.ignore_eos) {  // EOS, EOT and the vocab's other ends
    finish(r, "eos");
    return;
  }
  const size_t scan_from = r.text_sent;  // text before it was released: no stop string there
  r.generated.push_back(token);
  if (lp) r.token_logprobs.push_back(*lp);
  r.text += r.decoder->push(token);
  if (!r.stop.empty()) {
    size_t cut = std::string::npos;
    for (const auto& s : r.stop) cut = std::min(cut, r.text.find(s, scan_from));
    if (cut != std::string::npos) {
      r.text.resize(cut);
      finish(r, "stop");
      return;
    }
  }
  if (static_cast<int>(r.generated.size()) >= r.max_tokens) {
    finish(r, "length");
    return;
  }
  // Journaled before it is streamed: a token a client has is always in the journal, so a
  // restarted frontend can resume from whatever the client got.
  journal_progress(r);
  if (r.stream) stream_out(r);
}

void Frontend::stream_out(Request& r) {
  if (r.awaiting_resume) return;  // adopted: its client's Resume says where its stream stands
  // Text that may still turn out to start a stop string is held back until it cannot.
  const bool over = !r.finish_reason.empty();
  const size_t hold = over || r.max_stop_bytes == 0 ? 0 : r.max_stop_bytes - 1;
  const size_t end = utf8_boundary(r.text, r.text.size() > hold ? r.text.size() - hold : 0);
  if (end <= r.text_sent && r.ids_sent >= r.generated.size()) return;
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<int32_t> ids(r.generated.begin() + static_cast<std::ptrdiff_t>(r.ids_sent),
                           r.generated.end());
  const std::string text =
      end > r.text_sent ? r.text.substr(r.text_sent, end - r.text_sent) : std::string();
  const auto logprobs = logprobs_of(fbb, r, r.ids_sent);
  auto body = fbc::CreateTokenChunk(fbb, r.client_request_id, fbb.CreateVector(ids),
                                    fbb.CreateString(text), logprobs);
  fbb.Finish(
      fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::TokenChunk, body.Union()),
      fbc::ClientMessageIdentifier());
  r.ids_sent = r.generated.size();
  r.text_sent = std::max(r.text_sent, end);
  deliver(r, msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
}

msg::Bytes Frontend::make_done(const Request& r) const {
  flatbuffers::FlatBufferBuilder fbb;
  const double ttft = r.first_token_ms > 0 ? r.first_token_ms - r.arrived_ms : 0;
  const size_t sampled = r.generated.size() - r.adopted_tokens + (r.finish_reason == "eos" ? 1 : 0);
  const double tpot = sampled > 1 ? (r.last_token_ms - r.first_token_ms) / double(sampled - 1) : 0;
  const double queue = r.admitted_ms > 0 ? r.admitted_ms - r.arrived_ms : 0;
  const double modeled_tpot =
      r.modeled_decode_steps ? r.modeled_decode_us / r.modeled_decode_steps / 1000.0 : 0;
  const uint64_t restarts = engine_restarts(*engine_);
  const Engine& ran = r.proactive_lane && proactive_engine_ ? *proactive_engine_ : *engine_;
  auto stats = fbc::CreateStatsDirect(
      fbb, r.prompt_tokens, static_cast<uint32_t>(r.generated.size()), ttft, tpot, queue,
      r.modeled_prefill_us / 1000.0, modeled_tpot, r.flag_wait_us / 1000.0, r.kv_bytes_copied,
      static_cast<uint32_t>(restarts > r.restarts_at_start ? restarts - r.restarts_at_start : 0),
      engine_->plan_name().c_str(), r.finish_reason.c_str(), ran.executed_plan().c_str(),
      ran.modeled_plan().c_str());
  const auto logprobs = logprobs_of(fbb, r, 0);
  auto body =
      fbc::CreateDone(fbb, r.client_request_id, fbb.CreateString(r.text),
                      fbb.CreateVector(r.generated), stats, logprobs, prompt_logprobs_of(fbb, r));
  fbb.Finish(
      fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::Done, body.Union()),
      fbc::ClientMessageIdentifier());
  return msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

void Frontend::finish(Request& r, const std::string& reason) {
  r.finish_reason = reason;
  if (r.kind == RequestKind::eval && reason == "length") {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fbc::CreateEvalReplyDirect(
        fbb, r.prompt_tokens, static_cast<uint32_t>(tokenizer_.n_vocab()), &r.eval_logits);
    fbb.Finish(fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::EvalReply,
                                        body.Union()),
               fbc::ClientMessageIdentifier());
    deliver(r, msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
    ++metrics_.completed;
  } else if (r.kind == RequestKind::eval) {
    deliver(r,
            msg::make_client_error(r.client_request_id, Errc::cancelled,
                                   "eval " + std::to_string(r.client_request_id) + " " + reason));
    ++(reason == "disconnected" ? metrics_.reaped : metrics_.cancelled);
  } else {
    if (reason != "stop") r.text += r.decoder->flush();
    journal_progress(r);  // before anything of it goes out (accept_token)
    if (r.stream) stream_out(r);
    if (!r.awaiting_resume) deliver(r, make_done(r));  // else at its Resume (frontend_resume.cpp)
    if (reason == "cancelled")
      ++metrics_.cancelled;
    else if (reason == "disconnected")
      ++metrics_.reaped;
    else
      ++metrics_.completed;
    metrics_.prompt_tokens += r.prompt_tokens;
    metrics_.generated_tokens += r.generated.size();
    if (r.first_token_ms > 0) {
      metrics_.ttft_ms_sum += r.first_token_ms - r.arrived_ms;
      ++metrics_.ttft_n;
      if (r.modeled_prefill_us > 0) {
        metrics_.modeled_ttft_ms_sum += r.modeled_prefill_us / 1000.0;
        ++metrics_.modeled_ttft_n;
      }
    }
    const size_t sampled = r.generated.size() - r.adopted_tokens + (reason == "eos" ? 1 : 0);
    if (sampled > 1) {
      metrics_.tpot_ms_sum += (r.last_token_ms - r.first_token_ms) / double(sampled - 1);
      ++metrics_.tpot_n;
    }
    if (r.modeled_decode_steps) {
      metrics_.modeled_tpot_ms_sum += r.modeled_decode_us / r.modeled_decode_steps / 1000.0;
      ++metrics_.modeled_tpot_n;
    }
  }
  if (r.admitted_ms > 0) {
    metrics_.queue_ms_sum += r.admitted_ms - r.arrived_ms;
    ++metrics_.queue_n;
  }
  const uint64_t restarts = engine_restarts(*engine_);
  if (restarts > r.restarts_at_start) metrics_.restarts_seen += restarts - r.restarts_at_start;
  release(r);
}

void Frontend::fail(Request& r, Errc code, const std::string& message) {
  r.finish_reason = "error";
  deliver(r, msg::make_client_error(r.client_request_id, code, message));
  journal_progress(r);
  ++metrics_.failed;
  if (r.session) {
    // The session's KV may hold half a step: it cannot be trusted for the next turn.
    auto it = sessions_.find(r.session);
    if (it != sessions_.end()) {
      if (it->second.open) engine_->close_seq(it->second.seq_id);
      sessions_.erase(it);
    }
    r.seq_open = false;
  }
  release(r);
}

void Frontend::release(Request& r) {
  if (!r.released) {
    r.released = true;
    scheduler_.remove(&r);
    if (r.session) {
      auto it = sessions_.find(r.session);
      if (it != sessions_.end()) {
        Session& s = it->second;
        s.busy = false;
        s.last_used_ms = now_ms();
        if (r.n_prefilled > 0) {
          s.n_past = r.pos;
          // The last sampled token is not in the KV yet: the next turn appends it first.
          s.pending = r.prefilling() ? std::nullopt : r.next_token;
          if (r.chat_turn && r.prefilling()) s.chat_cut = true;
          if (r.chat_turn && !r.prefilling()) {
            if (s.kind == Session::Kind::unset) s.kind = Session::Kind::chat;
            s.chat.family = r.chat_family;
            s.chat.messages.insert(s.chat.messages.end(), r.chat_messages.begin(),
                                   r.chat_messages.end());
            s.chat.messages.push_back({"assistant", r.text});
          }
        }  // else the turn appended nothing and the session stays as it was
        if (!s.open) sessions_.erase(it);  // never admitted: nothing to keep
      }
    } else if (r.seq_open) {
      close_seq_of(r);
    }
    r.seq_open = false;
  }
  // Messages the client has not taken yet still go out; the request is kept until they do, or
  // (adopted) until its client resumes it.
  if ((!r.outbox.empty() || r.awaiting_resume) && !r.vanished) return;
  requests_.erase({peer_key(r.routing), r.client_request_id});
}

void Frontend::reap(double now) {
  last_reap_ms_ = now;
  std::vector<Request*> gone, drained;
  for (auto& [key, r] : requests_) {
    if (r->awaiting_resume && now - r->adopted_ms > options_.resume_wait_ms) {
      r->vanished = true;  // adopted, and its client never came back for it
      if (!r->finish_reason.empty()) {
        drained.push_back(r.get());
        continue;
      }
      gone.push_back(r.get());
      continue;
    }
    if (!r->finish_reason.empty()) {
      // Finished, waiting for its outbox: forget it once delivered or its client is gone.
      if ((r->outbox.empty() && !r->awaiting_resume) || r->vanished) drained.push_back(r.get());
      continue;
    }
    // The client beats three times per period (core/ipc/client.h): three periods of silence is
    // gone.
    const double limit = 3.0 * r->heartbeat_ms + 20.0;
    if (r->vanished || (r->heartbeat_ms > 0 && now - r->last_seen_ms > limit))
      gone.push_back(r.get());
  }
  for (Request* r : gone) {
    // A client that stopped its KeepAlives may still be listening (a stalled thread, a loop that
    // only reads events): it learns why its request ended instead of waiting for a Done forever.
    if (!r->vanished)
      reply_error(r->routing, r->client_request_id, Errc::timeout,
                  "request " + std::to_string(r->client_request_id) + ": no KeepAlive for " +
                      std::to_string(static_cast<int64_t>(now - r->last_seen_ms)) +
                      " ms (heartbeat_ms " + std::to_string(r->heartbeat_ms) + "): cancelled");
    r->vanished = true;
    finish(*r, "disconnected");
  }
  for (Request* r : drained) release(*r);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (!it->second.busy && now - it->second.last_used_ms > options_.session_idle_ms) {
      if (it->second.open) engine_->close_seq(it->second.seq_id);
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace duet::frontend
