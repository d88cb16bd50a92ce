#pragma once
// One client request as the frontend tracks it from arrival to its Done: where to reply, what to
// prefill, what it generated so far, what is still to be sent, and its timings.
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ipc/messaging.h"
#include "core/model/chat_template.h"
#include "core/model/sampling.h"
#include "core/model/tokenizer.h"

namespace duet::frontend {

enum class Priority : uint8_t { reactive = 0, proactive = 1 };
enum class RequestKind : uint8_t { generate, eval };

struct Request {
  // Routing: the ROUTER identity frames of the client, and the id the client gave the request.
  std::vector<std::string> routing;
  uint64_t client_request_id = 0;
  uint64_t number = 0;  // the frontend's count of requests at its arrival (`duet trace --request`)
  uint64_t seq_id = 0;  // the engine sequence holding its KV
  RequestKind kind = RequestKind::generate;
  Priority priority = Priority::reactive;
  uint64_t session = 0;   // 0 = none; else the KV outlives the request
  bool owns_seq = true;   // false for a session turn: the session's seq stays open at the end
  bool seq_open = false;  // admitted: the engine holds a sequence for it
  // Its KV lives on the proactive engine (Agent.xpu): its steps are preemptible there, apart
  // from the reactive ones. Set at admission; a request never changes engines.
  bool proactive_lane = false;
  // Part of the proactive step parked at an op boundary: no other step may touch its sequence
  // until that step resumes and ends.
  bool in_parked_step = false;
  int max_positions = 0;  // what open_seq reserved

  std::vector<int32_t> prompt;        // tokens still to be appended before decoding starts
  size_t n_prefilled = 0;             // of prompt
  int32_t pos = 0;                    // next position of the sequence (tokens in its KV)
  uint32_t prompt_tokens = 0;         // for Stats: the new tokens of this request
  uint32_t shared_prefix_tokens = 0;  // of prompt: borrowed from earlier requests' KV, not computed

  // generate
  int max_tokens = 0;
  std::vector<std::string> stop;
  size_t max_stop_bytes = 0;
  bool stream = true;
  bool ignore_eos = false;  // EOS is kept as a token; only length, stop or cancel end it
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<Tokenizer::StreamDecoder> decoder;
  std::optional<int32_t> next_token;  // sampled, not yet appended to the KV
  std::vector<int32_t> generated;     // ids (EOS excluded)
  // Generate.logprobs (-1 none, else the likeliest tokens' count) and, when asked for, the
  // generated ids' log-probabilities: those of its last token_logprobs.size() ids (an adopted
  // request's tokens from before the restart have none).
  int logprobs = -1;
  std::vector<TokenLogprobs> token_logprobs;
  // Generate.prompt_logprobs: prompt_token_logprobs[i] is prompt[i + 1]'s, from the logits of
  // every prompt position (the prompt runs as eval's, an entry per position).
  bool prompt_logprobs = false;
  std::vector<TokenLogprobs> prompt_token_logprobs;
  std::string text;           // decoded so far (cut at a stop string)
  size_t text_sent = 0;       // bytes of text already streamed
  size_t ids_sent = 0;        // ids already streamed
  std::string finish_reason;  // set when it is over
  // a chat session's turn: its messages and template, added with the reply to the session's
  // conversation when the turn ends
  bool chat_turn = false;
  std::vector<ChatMessage> chat_messages;
  std::string chat_family;

  // eval: logits of every prompt position
  std::vector<float> eval_logits;

  // liveness: > 0 when the client promised a KeepAlive at least this often
  uint32_t heartbeat_ms = 0;
  double last_seen_ms = 0;
  bool vanished = false;  // a send found the client gone
  bool released = false;  // its KV was freed or handed back to its session

  // timings (monotonic ms) and accumulated step figures
  double arrived_ms = 0;  // steady clock
  double admitted_ms = 0;
  double first_token_ms = 0;  // absolute, 0 = none yet
  double last_token_ms = 0;
  double modeled_prefill_us = 0;
  double modeled_decode_us = 0;
  uint32_t modeled_decode_steps = 0;
  double flag_wait_us = 0;
  uint64_t kv_bytes_copied = 0;
  uint64_t restarts_at_start = 0;

  // the request journal (request_journal.h): its slot when journaled; adopted by a restarted
  // frontend, it streams nothing until its client's Resume says what it already has
  std::optional<uint32_t> journal_slot;
  bool awaiting_resume = false;
  double adopted_ms = 0;
  size_t adopted_tokens = 0;  // generated before the adoption (not in this frontend's timings)

  // messages that could not be sent yet (the client's queue was full), oldest first
  std::deque<msg::Bytes> outbox;

  bool prefilling() const { return n_prefilled < prompt.size(); }
  // Its prompt needs every position's logits: a step entry (and logit row) per token.
  bool every_position() const { return kind == RequestKind::eval || prompt_logprobs; }
  bool decoding() const { return !prefilling() && next_token.has_value() && finish_reason.empty(); }
};

}  // namespace duet::frontend
