// Admission: opening a request's sequence and reserving the KV it can grow to.
#include <algorithm>
#include <string>

#include "core/base/error.h"
#include "services/frontend/frontend.h"

namespace duet::frontend {

void Frontend::open_request(Request* r) {
  // Admission reserves the KV the request can grow to (its positions so far, its prompt and
  // max_tokens; issue 20): pages are still taken as it grows and returned when it ends, but a
  // running request never finds the pool empty, so it is never failed or recomputed for lack of
  // KV. A request the pool cannot promise that to now waits in its queue (busy), reactive ones
  // first (the scheduler admits them before proactive work). Chosen over preempt-and-recompute:
  // every request knows its extent at admission, so nothing is ever thrown away and tokens are
  // the ones it gets alone; the cost is pages promised but not yet used while a long max_tokens
  // runs.
  const int64_t extent =
      int64_t{r->pos} + static_cast<int64_t>(r->prompt.size()) + int64_t{r->max_tokens};
  const int reserve = static_cast<int>(std::min<int64_t>(extent, r->max_positions));
  // Prefix sharing (issue 20 item 4): a sequence that starts empty borrows the KV of the whole
  // blocks its prompt shares with what earlier requests computed (a system prompt, a chat's first
  // turns, an agent's tool schema) and prefills from there. Not for eval: it wants every
  // position's logits. Borrowed pages count towards the reservation, so it promises less.
  const bool may_share = !r->every_position() && r->pos == 0 && r->n_prefilled == 0;
  int shared = 0;
  if (r->session) {
    Session& s = sessions_.at(r->session);
    const bool fresh = !s.open;
    if (fresh) {
      engine_->open_seq(s.seq_id, r->max_positions);
      s.open = true;
    }
    try {
      if (fresh && may_share) shared = engine_->share_prefix(s.seq_id, r->prompt);
      engine_->reserve_seq(s.seq_id, reserve);
    } catch (const Error&) {
      if (fresh) {
        engine_->close_seq(s.seq_id);
        s.open = false;
      }
      throw;
    }
  } else {
    r->proactive_lane = scheduler_.lane_of(*r) == Lane::proactive;
    Engine& engine = engine_of(*r);
    engine.open_seq(r->seq_id, r->max_positions);
    try {
      if (may_share) shared = engine.share_prefix(r->seq_id, r->prompt);
      engine.reserve_seq(r->seq_id, reserve);
    } catch (const Error&) {
      engine.close_seq(r->seq_id);
      throw;
    }
  }
  r->n_prefilled = static_cast<size_t>(shared);
  r->pos += shared;
  r->shared_prefix_tokens = static_cast<uint32_t>(shared);
  r->seq_open = true;
  r->admitted_ms = now_ms();
  // The proactive engine is its worker's while an overlapped step runs: ask the main one then.
  r->restarts_at_start =
      engine_restarts(r->proactive_lane && async_.running() ? *engine_ : engine_of(*r));
}

}  // namespace duet::frontend
