// ProgramEngine's sequences and their KV pages (program_engine.h, kv_share.h): open, reserve,
// grow page by page as steps append, truncate, close.
#include <algorithm>
#include <string>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"

namespace duet::frontend {

void ProgramEngine::attach_kv(uint32_t n_pages, uint64_t page_bytes) {
  const bool adopt = options_.adopt_kv && options_.adopt_kv->load();
  if (options_.kv_share) {
    kv_ = join_kv_pool(*options_.kv_share, kv_name(options_.stack_id, options_.kv_share->tag),
                       n_pages, page_bytes, options_.page_tokens, adopt);
  } else {
    const std::string name = kv_name(options_.stack_id, options_.segment_tag);
    if (adopt) kv_ = KvPool::attach_existing(name, n_pages, page_bytes, options_.page_tokens);
    if (!kv_) {
      try {
        shm::Segment::open(name).unlink();
      } catch (const Error&) {
      }
      kv_ = KvPool::create(name, n_pages, page_bytes, options_.page_tokens);
    }
  }
  std::lock_guard lock(kv_->mu);
  kv_->sharing = kv_->sharing && options_.prefix_sharing;
}

int ProgramEngine::share_prefix(uint64_t seq_id, std::span<const int32_t> prompt) {
  std::lock_guard lock(kv_->mu);
  kv_->check_not_held(seq_id, "share_prefix");
  return kv_->share_prefix(seq_id, prompt);
}

void ProgramEngine::adopt_seq(uint64_t seq_id, int max_positions, int n_past) {
  if (seq_id == shm::KvPages::kFree)
    throw Error(Errc::invalid_argument, "sequence id 0 is reserved");
  if (max_positions <= 0 || static_cast<uint32_t>(max_positions) > options_.max_ctx || n_past < 0 ||
      n_past > max_positions)
    throw Error(Errc::out_of_range,
                "adopt: sequence " + std::to_string(seq_id) + " of " + std::to_string(n_past) +
                    " of " + std::to_string(max_positions) +
                    " positions does not fit the context of " + std::to_string(options_.max_ctx));
  std::lock_guard lock(kv_->mu);
  if (kv_->seqs.count(seq_id))
    throw Error(Errc::invalid_argument, "sequence " + std::to_string(seq_id) + " is open");
  const auto pages = static_cast<uint32_t>(kv_->pages->pages_of(seq_id).size());
  const uint32_t need =
      (static_cast<uint32_t>(n_past) + options_.page_tokens - 1) / options_.page_tokens;
  const uint32_t most =
      (static_cast<uint32_t>(max_positions) + options_.page_tokens - 1) / options_.page_tokens;
  if (pages < need || pages > most)
    throw Error(Errc::bad_format,
                "adopt: sequence " + std::to_string(seq_id) + " holds " + std::to_string(pages) +
                    " KV pages; its " + std::to_string(n_past) + " positions need " +
                    std::to_string(need) + " (at most " + std::to_string(most) + ")");
  kv_->adopt_seq(seq_id, max_positions, n_past);
}

uint32_t ProgramEngine::reclaim_unadopted() {
  std::lock_guard lock(kv_->mu);
  std::vector<uint64_t> live;
  for (const auto& [id, seq] : kv_->seqs) live.push_back(id);
  return kv_->pages->reclaim_except(live);
}

void ProgramEngine::open_seq(uint64_t seq_id, int max_positions) {
  if (seq_id == shm::KvPages::kFree)
    throw Error(Errc::invalid_argument, "sequence id 0 is reserved");
  if (max_positions <= 0 || static_cast<uint32_t>(max_positions) > options_.max_ctx)
    throw Error(Errc::out_of_range, "a sequence of " + std::to_string(max_positions) +
                                        " positions exceeds the context of " +
                                        std::to_string(options_.max_ctx));
  std::lock_guard lock(kv_->mu);
  if (kv_->seqs.count(seq_id))
    throw Error(Errc::invalid_argument, "sequence " + std::to_string(seq_id) + " is open");
  kv_->seqs[seq_id] = KvPool::Sequence{max_positions, 0};
}

void ProgramEngine::close_seq(uint64_t seq_id) {
  std::lock_guard lock(kv_->mu);
  kv_->check_not_held(seq_id, "close_seq");
  if (kv_->seqs.erase(seq_id)) kv_->pages->free_owner(seq_id);
}

void ProgramEngine::reserve_seq(uint64_t seq_id, int positions) {
  if (positions <= 0 || static_cast<uint32_t>(positions) > options_.max_ctx)
    throw Error(Errc::out_of_range, "reserve: " + std::to_string(positions) +
                                        " positions, the context is " +
                                        std::to_string(options_.max_ctx));
  std::lock_guard lock(kv_->mu);
  kv_->reserve(
      seq_id, (static_cast<uint32_t>(positions) + options_.page_tokens - 1) / options_.page_tokens);
}

void ProgramEngine::truncate_seq(uint64_t seq_id, int n_past) {
  std::lock_guard lock(kv_->mu);
  kv_->check_not_held(seq_id, "truncate_seq");
  kv_->truncate(seq_id, n_past);
}

void ProgramEngine::ensure_pages(uint64_t seq_id, int positions) {
  const uint32_t need =
      (static_cast<uint32_t>(positions) + options_.page_tokens - 1) / options_.page_tokens;
  KvPool::Sequence& seq = kv_->seqs.at(seq_id);
  if (need <= seq.pages) return;
  // A sequence may take only pages nobody else was promised (its own promise is among them).
  const uint32_t own_promise = seq.reserved > seq.pages ? seq.reserved - seq.pages : 0;
  const uint32_t others = kv_->promised_not_taken() - own_promise;
  if (kv_->pages->available() < others + (need - seq.pages))
    throw Error(Errc::busy, "KV cache full: sequence " + std::to_string(seq_id) + " needs " +
                                std::to_string(need - seq.pages) +
                                " more pages than are free and not promised to others");
  kv_->pages->alloc(need - seq.pages, seq_id);  // Error(busy) when the cache is full
  seq.pages = need;
}

}  // namespace duet::frontend
