// Frontend restart resumes requests (issue 22): the request journal's writes, the adoption of
// what a killed frontend left in it, and Resume from clients.
//
// What a generate request needs to continue is in the journal (request_journal.h), written when
// it is queued and after every step that changes it; its KV is in the stack's KV pool, whose
// allocator state lives in the segment (shm/kv_pages.h). A restarted frontend (main.cpp) recovers
// the journal's valid records before building its engines, builds them over the pool as it was
// (adopt_kv) and here rebuilds each Request: prompt, generated ids, the sampler at its draw
// count, the text decoded again, stop strings, limits. A request that had KV re-opens its
// sequence (Engine::adopt_seq: pages_of(seq) already holds positions 0..pos-1) and runs again
// from the step that was in flight: the next step appends the same token at the same position,
// so the tokens are the undisturbed run's. One that was queued is queued again. Anything that
// does not validate (vocabulary, positions against counts, pages against positions) is dropped
// and its pages are reclaimed with the killed frontend's others (reclaim_unadopted).
//
// An adopted request streams nothing until its client's Resume{ids, text bytes received} says
// where its stream stands; then it sends the rest (or an empty TokenChunk: the Resume's ack) and
// goes on. Finished records are adopted too for a client that missed its Done. A request no
// client resumes within resume_wait_ms is dropped, like a vanished client's.
#include <algorithm>
#include <chrono>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

namespace fbc = fb::client;

namespace {

double unix_ms_now() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Frontend::journal_begin(Request& r) {
  // Not a prompt_logprobs request either: its prompt entries are in no record, so a restarted
  // frontend could not give them back; unjournaled, its client sends it again.
  if (!options_.journal || r.kind != RequestKind::generate || r.session || r.prompt_logprobs)
    return;
  JournalRecord rec;
  rec.routing = r.routing;
  rec.client_request_id = r.client_request_id;
  rec.seq_id = r.seq_id;
  rec.priority = static_cast<uint8_t>(r.priority);
  rec.stream = r.stream;
  rec.ignore_eos = r.ignore_eos;
  rec.logprobs = static_cast<int8_t>(r.logprobs);
  rec.max_tokens = r.max_tokens;
  rec.max_positions = r.max_positions;
  rec.heartbeat_ms = r.heartbeat_ms;
  rec.sampling = r.sampler->params();
  rec.stop = r.stop;
  rec.prompt = r.prompt;
  r.journal_slot = options_.journal->begin(rec);
  ++(r.journal_slot ? journal_metrics_.journaled : journal_metrics_.unjournaled);
}

void Frontend::journal_progress(Request& r) {
  if (!r.journal_slot) return;
  const uint32_t slot = *r.journal_slot;
  const std::string& reason = r.finish_reason;
  if (reason == "error" || reason == "disconnected") {
    options_.journal->free(slot);  // nothing to resume: its client got (or gets) an error
    r.journal_slot.reset();
    return;
  }
  JournalProgress p;
  p.generated = r.generated;
  p.n_prefilled = static_cast<uint32_t>(r.n_prefilled);
  p.pos = r.pos;
  p.next_token = r.next_token;
  p.draws = r.sampler->draws();
  p.finish_reason = reason;
  options_.journal->update(slot, p);
}

void Frontend::adopt_journal(std::vector<JournalRecord> records) {
  const double t0 = now_ms();
  for (JournalRecord& rec : records) {
    try {
      adopt_record(rec);
    } catch (const std::exception& e) {
      options_.journal->free(rec.slot);
      ++journal_metrics_.dropped;
      if (journal_metrics_.drop_reasons.size() < 8)
        journal_metrics_.drop_reasons.push_back("request " + std::to_string(rec.client_request_id) +
                                                ": " + e.what());
    }
  }
  // The killed frontend's pages that no adopted sequence holds: sequences of requests not
  // adopted, a chat session's KV, pages of a step it was allocating when it died.
  try {
    journal_metrics_.kv_pages_reclaimed = engine_->reclaim_unadopted();
  } catch (const std::exception& e) {
    journal_metrics_.drop_reasons.push_back(std::string("reclaim: ") + e.what());
  }
  if (options_.adopt_kv) options_.adopt_kv->store(false);
  // Their clients' clocks start now, not before the engine build that adoption waited for.
  const double now = now_ms();
  for (auto& [key, r] : requests_)
    if (r->awaiting_resume) r->adopted_ms = r->last_seen_ms = now;
  journal_metrics_.adoption_ms = now - t0;
}

void Frontend::adopt_record(JournalRecord& rec) {
  const int n_vocab = tokenizer_.n_vocab();
  auto in_vocab = [&](const std::vector<int32_t>& ids, const char* what) {
    for (int32_t t : ids)
      if (t < 0 || t >= n_vocab)
        throw Error(Errc::bad_format,
                    std::string(what) + " id " + std::to_string(t) + " is outside the vocabulary");
  };
  in_vocab(rec.prompt, "prompt");
  in_vocab(rec.generated, "generated");
  const bool finished = rec.state == JournalRecord::State::finished;
  const int64_t n_prompt = static_cast<int64_t>(rec.prompt.size());
  const int64_t n_gen = static_cast<int64_t>(rec.generated.size());
  if (rec.routing.empty() || rec.max_tokens <= 0 || rec.max_positions <= 0 ||
      rec.max_positions > options_.max_context || n_prompt + rec.max_tokens > rec.max_positions ||
      n_gen > rec.max_tokens || rec.priority > static_cast<uint8_t>(Priority::proactive) ||
      rec.seq_id == 0)
    throw Error(Errc::bad_format, "its limits do not fit this frontend (max_positions " +
                                      std::to_string(rec.max_positions) + ", context " +
                                      std::to_string(options_.max_context) + ")");
  if (!finished) {
    // What the steps leave: prefilling, pos = prefilled and nothing generated; decoding, the
    // last generated id is the next token and every earlier one is in the KV.
    const bool prefilling = rec.n_prefilled < rec.prompt.size();
    const bool ok =
        prefilling
            ? (rec.pos == static_cast<int32_t>(rec.n_prefilled) && n_gen == 0 && !rec.next_token)
            : (n_gen > 0 && rec.next_token && *rec.next_token == rec.generated.back() &&
               rec.pos == n_prompt + n_gen - 1);
    if (!ok)
      throw Error(Errc::bad_format, "its progress is inconsistent (pos " + std::to_string(rec.pos) +
                                        ", prefilled " + std::to_string(rec.n_prefilled) + " of " +
                                        std::to_string(n_prompt) + ", generated " +
                                        std::to_string(n_gen) + ")");
  } else if (unix_ms_now() - double(rec.finished_unix_ms) > options_.adopt_finished_max_age_ms) {
    throw Error(Errc::timeout, "finished too long ago");
  }
  Key key{peer_key(rec.routing), rec.client_request_id};
  if (requests_.count(key)) throw Error(Errc::bad_format, "a second record of the same request");

  auto r = std::make_unique<Request>();
  r->routing = rec.routing;
  r->client_request_id = rec.client_request_id;
  r->seq_id = rec.seq_id;
  r->priority = static_cast<Priority>(rec.priority);
  r->max_tokens = rec.max_tokens;
  r->max_positions = rec.max_positions;
  r->stream = rec.stream;
  r->ignore_eos = rec.ignore_eos;
  r->logprobs = rec.logprobs;  // the tokens from before the restart keep none
  r->heartbeat_ms = rec.heartbeat_ms;
  r->stop = rec.stop;
  for (const auto& s : r->stop) r->max_stop_bytes = std::max(r->max_stop_bytes, s.size());
  r->prompt = rec.prompt;
  r->prompt_tokens = static_cast<uint32_t>(rec.prompt.size());
  r->n_prefilled = rec.n_prefilled;
  r->pos = rec.pos;
  r->generated = rec.generated;
  r->next_token = rec.next_token;
  r->sampler = std::make_unique<Sampler>(Sampler::restore(rec.sampling, rec.draws));
  r->decoder =
      std::make_unique<Tokenizer::StreamDecoder>(tokenizer_, tokenizer_.ends_in_text(r->prompt));
  for (int32_t t : r->generated) r->text += r->decoder->push(t);
  r->arrived_ms = r->last_seen_ms = r->adopted_ms = now_ms();
  r->number = ++requests_numbered_;
  r->adopted_tokens = r->generated.size();
  r->awaiting_resume = true;
  r->journal_slot = rec.slot;
  next_seq_id_ = std::max(next_seq_id_, rec.seq_id + 1);

  if (finished) {
    // As finish() left it: the text cut at the stop string, or flushed.
    r->finish_reason = rec.finish_reason.empty() ? "length" : rec.finish_reason;
    if (r->finish_reason == "stop") {
      size_t cut = std::string::npos;
      for (const auto& s : r->stop) cut = std::min(cut, r->text.find(s));
      if (cut != std::string::npos) r->text.resize(cut);
    } else {
      r->text += r->decoder->flush();
    }
    r->released = true;
    options_.journal->adopt(rec);
    ++journal_metrics_.adopted_finished;
    requests_.emplace(std::move(key), std::move(r));
    return;
  }
  Request* raw = r.get();
  r->proactive_lane = scheduler_.lane_of(*r) == Lane::proactive;
  if (r->pos > 0) {
    Engine& engine = engine_of(*r);
    engine.adopt_seq(r->seq_id, r->max_positions, r->pos);
    try {
      engine.reserve_seq(r->seq_id, static_cast<int>(std::min<int64_t>(n_prompt + r->max_tokens,
                                                                       r->max_positions)));
    } catch (...) {
      engine.close_seq(r->seq_id);
      throw;
    }
    r->seq_open = true;
    r->admitted_ms = r->arrived_ms;
    r->restarts_at_start = engine_restarts(engine);
    scheduler_.add_running(raw);
  } else {
    // Queued or not stepped yet: admitted again like a new request (its pages, if a step had
    // taken any, are reclaimed).
    r->n_prefilled = 0;
    r->proactive_lane = false;
    scheduler_.enqueue(raw);
  }
  options_.journal->adopt(rec);
  ++journal_metrics_.adopted_live;
  requests_.emplace(std::move(key), std::move(r));
}

void Frontend::on_resume(const std::vector<std::string>& routing, uint64_t id,
                         const fbc::Resume& resume) {
  check_model(resume.model());
  const uint64_t target = resume.request_id() ? resume.request_id() : id;
  auto it = requests_.find({peer_key(routing), target});
  if (it == requests_.end()) {
    ++journal_metrics_.resume_unknown;
    throw Error(Errc::not_found,
                "request " + std::to_string(target) +
                    " is not known to this frontend: it was not in the request journal when the "
                    "frontend restarted (sent just before the restart, a chat-session turn, "
                    "too large for the journal, or already over)");
  }
  Request& r = *it->second;
  r.last_seen_ms = now_ms();
  auto ack = [&] {
    flatbuffers::FlatBufferBuilder fbb;
    auto body = fbc::CreateTokenChunkDirect(fbb, r.client_request_id, nullptr, "");
    fbb.Finish(fbc::CreateClientMessage(fbb, r.client_request_id, fbc::ClientBody::TokenChunk,
                                        body.Union()),
               fbc::ClientMessageIdentifier());
    deliver(r, msg::Bytes(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()));
  };
  // A request this frontend has been streaming all along (its Generate reached this frontend
  // after the client reconnected): every chunk went over the new connection; only the ack.
  if (!r.awaiting_resume) {
    ack();
    return;
  }
  if (resume.ids_received() > r.generated.size() || resume.text_bytes_received() > r.text.size()) {
    r.awaiting_resume = false;
    const std::string what = "resume of request " + std::to_string(target) + ": the client has " +
                             std::to_string(resume.ids_received()) + " ids and " +
                             std::to_string(resume.text_bytes_received()) +
                             " text bytes, the request only " + std::to_string(r.generated.size()) +
                             " and " + std::to_string(r.text.size());
    if (r.finish_reason.empty()) {
      fail(r, Errc::invalid_argument, what);
    } else {
      deliver(r, msg::make_client_error(r.client_request_id, Errc::invalid_argument, what));
      release(r);
    }
    return;
  }
  ++journal_metrics_.resumed;
  r.awaiting_resume = false;
  r.ids_sent = resume.ids_received();
  r.text_sent = resume.text_bytes_received();
  const size_t ids_before = r.ids_sent, text_before = r.text_sent;
  if (r.stream) stream_out(r);
  if (r.finish_reason.empty()) {
    if (r.ids_sent == ids_before && r.text_sent == text_before) ack();
    return;
  }
  deliver(r, make_done(r));  // a finished request: the rest, then its Done
  release(r);
}

nlohmann::json Frontend::journal_status() const {
  const JournalMetrics& m = journal_metrics_;
  if (!options_.journal) return {{"enabled", false}};
  const auto& g = options_.journal->geometry();
  return {{"enabled", true},
          {"slots", g.n_slots},
          {"slot_ids", g.max_ids},
          {"live", options_.journal->live_slots()},
          {"journaled", m.journaled},
          {"unjournaled", m.unjournaled},
          {"adopted_live", m.adopted_live},
          {"adopted_finished", m.adopted_finished},
          {"dropped", m.dropped},
          {"drop_reasons", m.drop_reasons},
          {"resumed", m.resumed},
          {"resume_unknown", m.resume_unknown},
          {"kv_pages_reclaimed", m.kv_pages_reclaimed},
          {"adoption_ms", m.adoption_ms}};
}

}  // namespace duet::frontend
