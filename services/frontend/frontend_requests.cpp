// Frontend's client requests: decoding a message and checking it (model, plan, sampling, prompt
// and its UTF-8, limits), then Generate, Eval, Cancel and CloseSession. Replies and status are in
// frontend.cpp.
#include <algorithm>
#include <array>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include "core/base/error.h"
#include "core/ipc/stack_models.h"
#include "services/frontend/frontend.h"
#include "services/frontend/stack_engines.h"

namespace duet::frontend {

namespace fbc = fb::client;

size_t invalid_utf8_at(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = s[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    static constexpr std::array<uint32_t, 5> kMin = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

// A request naming a model: this frontend's, or an error naming it (a router of several models
// sends each request to its model, so this refuses only a direct client's wrong name).
void Frontend::check_model(const flatbuffers::String* model) const {
  if (!model || model->size() == 0 || model->string_view() == options_.model_name) return;
  throw Error(Errc::not_found, unknown_model_message(model->string_view(), options_.model_name));
}

void Frontend::handle(msg::Envelope& env) {
  std::vector<std::string> routing;
  for (auto& f : env.routing) routing.emplace_back(static_cast<const char*>(f.data()), f.size());
  const fbc::ClientMessage* m = nullptr;
  try {
    m = msg::verify_client(env.payload);
  } catch (const Error& e) {
    ++metrics_.rejected;
    reply_error(routing, 0, e.code(), e.what());
    return;
  }
  const uint64_t id = m->request_id();
  try {
    switch (m->body_type()) {
      case fbc::ClientBody::Generate:
        on_generate(routing, id, *m->body_as_Generate());
        return;
      case fbc::ClientBody::Eval:
        on_eval(routing, id, *m->body_as_Eval());
        return;
      case fbc::ClientBody::Cancel: {
        const uint64_t target = m->body_as_Cancel()->request_id();
        on_cancel(routing, id, target ? target : id);
        return;
      }
      case fbc::ClientBody::KeepAlive: {
        const uint64_t target = m->body_as_KeepAlive()->request_id();
        auto it = requests_.find({peer_key(routing), target ? target : id});
        if (it != requests_.end()) {
          it->second->last_seen_ms = now_ms();
        } else {
          // chaos fix: a client whose frontend was killed and restarted would otherwise wait for
          // a request this process never saw until its whole deadline; tell it now.
          reply_error(routing, target ? target : id, Errc::unavailable,
                      "request " + std::to_string(target ? target : id) +
                          " is not running on this frontend (it finished, was cancelled, or the "
                          "frontend restarted); resubmit it");
        }
        return;
      }
      case fbc::ClientBody::Resume:
        on_resume(routing, id, *m->body_as_Resume());
        return;
      case fbc::ClientBody::CloseSession:
        check_model(m->body_as_CloseSession()->model());
        on_close_session(routing, id, m->body_as_CloseSession()->session());
        return;
      case fbc::ClientBody::Tokenize:
        on_tokenize(routing, id, *m->body_as_Tokenize());
        return;
      case fbc::ClientBody::Detokenize:
        on_detokenize(routing, id, *m->body_as_Detokenize());
        return;
      case fbc::ClientBody::Trace:
        on_trace(routing, id, *m->body_as_Trace());
        return;
      case fbc::ClientBody::Warmup:
        on_warmup(routing, id, *m->body_as_Warmup());
        return;
      case fbc::ClientBody::Status: {
        flatbuffers::FlatBufferBuilder fbb;
        auto body = fbc::CreateStatusReplyDirect(fbb, status().dump().c_str());
        fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::StatusReply, body.Union()),
                   fbc::ClientMessageIdentifier());
        (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
        return;
      }
      default:
        throw Error(Errc::invalid_argument,
                    std::string("the frontend does not accept ") +
                        fbc::EnumNameClientBody(m->body_type()) +
                        " from clients (send Generate, Cancel, Status, Eval, KeepAlive, "
                        "CloseSession, Tokenize, Detokenize, Resume, Trace or Warmup)");
    }
  } catch (const Error& e) {
    ++metrics_.rejected;
    reply_error(routing, id, e.code(), e.what());
  } catch (const std::exception& e) {
    ++metrics_.rejected;
    reply_error(routing, id, Errc::internal, std::string("frontend: ") + e.what());
  }
}

void Frontend::check_plan(const flatbuffers::String* plan) const {
  if (!plan || plan->size() == 0 || plan->string_view() == "auto") return;
  const std::string_view p = plan->string_view();
  if (p == engine_->plan_name()) return;
  // Plans any duet stack may run; a request naming another is a typo, one of these that this
  // stack does not run is a mismatch. Both are errors that say which.
  if (!is_stack_plan(p))
    throw Error(Errc::invalid_argument,
                "unknown plan '" + std::string(p) + "' (plans: " + stack_plan_list() + ")");
  throw Error(Errc::unsupported, "this stack runs plan '" + engine_->plan_name() + "', not '" +
                                     std::string(p) +
                                     "'; start a stack with that plan or ask for 'auto'");
}

void Frontend::on_generate(const std::vector<std::string>& routing, uint64_t id,
                           const fbc::Generate& g) {
  Key key{peer_key(routing), id};
  if (requests_.count(key))
    throw Error(Errc::invalid_argument,
                "request id " + std::to_string(id) + " is already in flight on this connection");
  check_model(g.model());
  check_plan(g.plan());
  if (static_cast<uint8_t>(g.priority()) > static_cast<uint8_t>(fbc::Priority::MAX))
    throw Error(Errc::invalid_argument, "unknown priority " +
                                            std::to_string(static_cast<int>(g.priority())) +
                                            " (reactive = 0, proactive = 1)");
  SamplingParams sp;
  if (const auto* s = g.sampling()) {
    sp.temperature = s->temperature();
    sp.top_k = s->top_k();
    sp.top_p = s->top_p();
    sp.seed = s->seed();
  }
  sp.validate();
  const int ctx = options_.max_context;
  // 0 only for the prompt's log-probabilities alone (OpenAI's echo with max_tokens 0).
  if (g.max_tokens() < (g.prompt_logprobs() ? 0 : 1))
    throw Error(Errc::invalid_argument,
                "max_tokens must be > 0, got " + std::to_string(g.max_tokens()) +
                    (g.prompt_logprobs() ? "" : " (0 only with prompt_logprobs)"));
  if (g.max_tokens() > ctx)
    throw Error(Errc::out_of_range, "max_tokens " + std::to_string(g.max_tokens()) +
                                        " exceeds the context of " + std::to_string(ctx) +
                                        " positions");
  auto r = std::make_unique<Request>();
  r->routing = routing;
  r->client_request_id = id;
  r->priority = static_cast<Priority>(g.priority());
  r->max_tokens = g.max_tokens();
  r->stream = g.stream();
  r->heartbeat_ms = g.heartbeat_ms();
  r->ignore_eos = g.ignore_eos();
  if (g.logprobs() < -1 || g.logprobs() > kMaxTopLogprobs)
    throw Error(Errc::invalid_argument,
                "logprobs must be -1 (none) or 0 to " + std::to_string(kMaxTopLogprobs) +
                    " likeliest tokens, not " + std::to_string(g.logprobs()));
  r->logprobs = g.logprobs();
  r->prompt_logprobs = g.prompt_logprobs();
  if (r->prompt_logprobs && g.session() != 0)
    throw Error(Errc::invalid_argument,
                "prompt_logprobs is not available for a chat session's turns (their context is "
                "the session's, not the prompt's)");
  r->arrived_ms = r->last_seen_ms = now_ms();
  r->number = ++requests_numbered_;
  if (const auto* stops = g.stop()) {
    if (stops->size() > options_.max_stop_strings)
      throw Error(Errc::invalid_argument,
                  "too many stop strings: " + std::to_string(stops->size()) + " (at most " +
                      std::to_string(options_.max_stop_strings) + ")");
    for (const auto* s : *stops) {
      if (!s || s->size() == 0 || s->size() > options_.max_stop_bytes)
        throw Error(Errc::invalid_argument, "a stop string must have 1 to " +
                                                std::to_string(options_.max_stop_bytes) + " bytes");
      r->stop.push_back(s->str());
      r->max_stop_bytes = std::max<size_t>(r->max_stop_bytes, s->size());
    }
  }

  // The session, if any: its turn appends to the KV it kept.
  Session* session = nullptr;
  bool new_session = false;
  if (g.session() != 0) {
    auto it = sessions_.find(g.session());
    if (it == sessions_.end()) {
      if (static_cast<int>(sessions_.size()) >= options_.max_sessions)
        throw Error(Errc::busy, "too many chat sessions open (" +
                                    std::to_string(options_.max_sessions) +
                                    "); close one (CloseSession) or retry later");
      new_session = true;
    } else if (it->second.busy) {
      throw Error(Errc::busy,
                  "session " + std::to_string(g.session()) + " already has a turn in flight");
    } else {
      session = &it->second;
    }
  }
  const int32_t n_past = session ? session->n_past : 0;
  const bool has_pending = session && session->pending.has_value();
  if (has_pending) r->prompt.push_back(*session->pending);
  const bool add_special = n_past == 0 && !has_pending;  // the sequence is empty

  const bool chat = g.messages() && g.messages()->size() > 0;
  if (session && session->kind != Session::Kind::unset &&
      (session->kind == Session::Kind::chat) != chat)
    throw Error(Errc::invalid_argument,
                "session " + std::to_string(g.session()) + " is a " + (chat ? "prompt" : "chat") +
                    " session; its turns must all send " + (chat ? "a prompt" : "chat messages"));
  if (chat) {
    const std::vector<ChatMessage> msgs = read_chat_messages(g, options_.max_prompt_bytes);
    const std::string family = resolve_chat_template(
        g.chat_template() ? g.chat_template()->string_view() : std::string_view(),
        model_chat_template_);
    const ChatHistory* history = nullptr;
    if (session && session->kind == Session::Kind::chat) {
      if (session->chat_cut)
        throw Error(Errc::invalid_argument, "session " + std::to_string(g.session()) +
                                                " lost a turn inside its prompt; close it and "
                                                "start a new one");
      if (session->chat.family != family)
        throw Error(Errc::invalid_argument, "session " + std::to_string(g.session()) +
                                                " is formatted with the '" + session->chat.family +
                                                "' template, not '" + family + "'");
      history = &session->chat;
    }
    const auto ids = chat_turn_ids(tokenizer_, family, history,
                                   session ? session->pending : std::nullopt, msgs, add_special);
    r->prompt.insert(r->prompt.end(), ids.begin(), ids.end());
    if (g.session() != 0) {
      r->chat_turn = true;
      r->chat_messages = msgs;
      r->chat_family = family;
    }
  } else if (g.prompt_ids() && g.prompt_ids()->size() > 0) {
    if (g.prompt_ids()->size() > static_cast<size_t>(ctx))
      throw Error(Errc::out_of_range, "prompt of " + std::to_string(g.prompt_ids()->size()) +
                                          " tokens is longer than the context of " +
                                          std::to_string(ctx));
    for (const int32_t t : *g.prompt_ids()) {
      if (t < 0 || t >= tokenizer_.n_vocab())
        throw Error(Errc::invalid_argument, "prompt id " + std::to_string(t) +
                                                " is outside the vocabulary [0, " +
                                                std::to_string(tokenizer_.n_vocab()) + ")");
      r->prompt.push_back(t);
    }
  } else if (g.prompt()) {
    const std::string_view text = g.prompt()->string_view();
    if (text.size() > options_.max_prompt_bytes)
      throw Error(Errc::out_of_range, "prompt of " + std::to_string(text.size()) +
                                          " bytes exceeds the limit of " +
                                          std::to_string(options_.max_prompt_bytes));
    if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
      throw Error(Errc::invalid_argument,
                  "prompt is not valid UTF-8 (bad byte at offset " + std::to_string(bad) + ")");
    const TextSpan whole{0, text.size()};
    const auto ids = g.parse_special()
                         ? tokenizer_.encode_with_special_spans(text, add_special, {&whole, 1})
                         : tokenizer_.encode(text, add_special);
    r->prompt.insert(r->prompt.end(), ids.begin(), ids.end());
  } else {
    throw Error(Errc::invalid_argument,
                "Generate needs a prompt (text, prompt_ids or chat messages)");
  }
  if (r->prompt.empty()) {
    // An empty text still starts a generation from BOS, where the vocab has one (Qwen's has not).
    if (tokenizer_.bos() < 0)
      throw Error(Errc::invalid_argument,
                  "the prompt is empty and this model's vocab has no BOS token to start from");
    r->prompt.push_back(tokenizer_.bos());
  }
  const int64_t need = int64_t(n_past) + int64_t(r->prompt.size()) + r->max_tokens;
  if (need > ctx)
    throw Error(Errc::out_of_range, "the request needs " + std::to_string(need) + " positions (" +
                                        (session ? "session " + std::to_string(g.session()) +
                                                       "'s " + std::to_string(n_past) + " held, "
                                                 : std::string("")) +
                                        "a prompt of " + std::to_string(r->prompt.size()) +
                                        " tokens, max_tokens " + std::to_string(r->max_tokens) +
                                        "), more than the context of " + std::to_string(ctx));
  r->prompt_tokens = static_cast<uint32_t>(r->prompt.size());
  r->sampler = std::make_unique<Sampler>(sp);
  r->decoder =
      std::make_unique<Tokenizer::StreamDecoder>(tokenizer_, tokenizer_.ends_in_text(r->prompt));
  r->pos = n_past;
  r->session = g.session();
  if (r->session) {
    r->owns_seq = false;
    r->max_positions = ctx;
    r->seq_id = session ? session->seq_id : next_seq_id_++;
  } else {
    r->max_positions = static_cast<int>(std::min<int64_t>(ctx, need));
    r->seq_id = next_seq_id_++;
  }
  scheduler_.enqueue(r.get());  // throws busy when the queue is full
  if (new_session) {
    Session s;
    s.seq_id = r->seq_id;
    s.kind = chat ? Session::Kind::chat : Session::Kind::raw;
    if (chat) s.chat.family = r->chat_family;
    session = &sessions_.emplace(r->session, s).first->second;
  }
  if (session) {
    session->busy = true;
    session->last_used_ms = r->arrived_ms;
  }
  ++metrics_.received;
  journal_begin(*r);
  requests_.emplace(std::move(key), std::move(r));
}

void Frontend::on_eval(const std::vector<std::string>& routing, uint64_t id, const fbc::Eval& e) {
  Key key{peer_key(routing), id};
  if (requests_.count(key))
    throw Error(Errc::invalid_argument,
                "request id " + std::to_string(id) + " is already in flight on this connection");
  const bool other_plan = e.plan() && e.plan()->size() > 0 && e.plan()->string_view() != "auto" &&
                          e.plan()->string_view() != engine_->plan_name() && options_.make_engine;
  check_model(e.model());
  if (!other_plan) check_plan(e.plan());
  if (e.model_path() && e.model_path()->size() > 0) {
    namespace fs = std::filesystem;
    std::error_code ec1, ec2;
    const auto asked = fs::weakly_canonical(fs::path(e.model_path()->str()), ec1);
    const auto served = fs::weakly_canonical(fs::path(engine_->model().file().path()), ec2);
    if (ec1 || ec2 || asked != served)
      throw Error(Errc::invalid_argument, "model '" + e.model_path()->str() +
                                              "' is not this stack's model '" +
                                              engine_->model().file().path() + "'");
  }
  if (!e.ids() || e.ids()->size() == 0)
    throw Error(Errc::invalid_argument, "Eval needs at least one token id");
  if (e.ids()->size() > static_cast<size_t>(options_.max_context))
    throw Error(Errc::out_of_range, "Eval of " + std::to_string(e.ids()->size()) +
                                        " tokens is longer than the context of " +
                                        std::to_string(options_.max_context));
  auto r = std::make_unique<Request>();
  r->kind = RequestKind::eval;
  r->routing = routing;
  r->client_request_id = id;
  r->arrived_ms = r->last_seen_ms = now_ms();
  r->number = ++requests_numbered_;
  for (const int32_t t : *e.ids()) {
    if (t < 0 || t >= tokenizer_.n_vocab())
      throw Error(Errc::invalid_argument, "token id " + std::to_string(t) +
                                              " is outside the vocabulary [0, " +
                                              std::to_string(tokenizer_.n_vocab()) + ")");
    r->prompt.push_back(t);
  }
  if (other_plan) {
    eval_on_plan(routing, id, e.plan()->str(), r->prompt);
    return;
  }
  r->prompt_tokens = static_cast<uint32_t>(r->prompt.size());
  r->max_positions = static_cast<int>(r->prompt.size());
  r->seq_id = next_seq_id_++;
  r->eval_logits.reserve(r->prompt.size() * size_t(tokenizer_.n_vocab()));
  scheduler_.enqueue(r.get());
  ++metrics_.received;
  requests_.emplace(std::move(key), std::move(r));
}

void Frontend::eval_on_plan(const std::vector<std::string>& routing, uint64_t id,
                            const std::string& plan, const std::vector<int32_t>& ids) {
  if (!is_stack_plan(plan))
    throw Error(Errc::invalid_argument,
                "unknown plan '" + plan + "' (plans: " + stack_plan_list() + ")");
  auto& engine = plan_engines_[plan];
  if (!engine) engine = options_.make_engine(plan);
  // Every position's logits: one-token entries of the one sequence, in chunks a step can take
  // (the engines take max_running entries a step, as the scheduler's eval chunks).
  const uint64_t seq = next_seq_id_++;
  engine->open_seq(seq, static_cast<int>(ids.size()));
  std::vector<float> logits;
  try {
    const size_t chunk =
        static_cast<size_t>(std::max(1, std::min(engine->max_step_tokens(), options_.max_running)));
    for (size_t p = 0; p < ids.size(); p += chunk) {
      std::vector<SeqStep> batch;
      for (size_t q = p; q < std::min(ids.size(), p + chunk); ++q)
        batch.push_back({seq, {ids[q]}, static_cast<int32_t>(q), true});
      const std::vector<float> out = engine->step(batch, nullptr);
      logits.insert(logits.end(), out.begin(), out.end());
    }
  } catch (...) {
    engine->close_seq(seq);
    throw;
  }
  engine->close_seq(seq);
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fbc::CreateEvalReplyDirect(fbb, static_cast<uint32_t>(ids.size()),
                                         static_cast<uint32_t>(tokenizer_.n_vocab()), &logits);
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::EvalReply, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing,
                msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
  ++metrics_.completed;
}

void Frontend::on_cancel(const std::vector<std::string>& routing, uint64_t id, uint64_t target) {
  auto it = requests_.find({peer_key(routing), target});
  if (it == requests_.end() || !it->second->finish_reason.empty())
    throw Error(Errc::not_found, "no request " + std::to_string(target) +
                                     " in flight on this connection to cancel (cancel " +
                                     std::to_string(id) + ")");
  finish(*it->second, "cancelled");
}

void Frontend::on_close_session(const std::vector<std::string>& routing, uint64_t id,
                                uint64_t session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end())
    throw Error(Errc::not_found, "no chat session " + std::to_string(session));
  if (it->second.busy)
    throw Error(Errc::busy, "session " + std::to_string(session) +
                                " has a turn in flight; cancel it before closing the session");
  if (it->second.open) engine_->close_seq(it->second.seq_id);
  sessions_.erase(it);
  flatbuffers::FlatBufferBuilder fbb;
  auto stats = fbc::CreateStatsDirect(fbb, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                      engine_->plan_name().c_str(), "closed");
  auto body = fbc::CreateDoneDirect(fbb, id, "", nullptr, stats);
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::Done, body.Union()),
             fbc::ClientMessageIdentifier());
  (void)send_to(routing, std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()));
}

}  // namespace duet::frontend
