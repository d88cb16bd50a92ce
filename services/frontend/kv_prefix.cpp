// KvPool's prefix sharing (kv_share.h): matching a new sequence's prompt against published
// blocks, remembering the tokens steps write, publishing complete blocks, truncation.
#include <algorithm>
#include <string>

#include "core/base/error.h"
#include "services/frontend/kv_share.h"

namespace duet::frontend {

std::shared_ptr<KvPool> KvPool::attach(const std::string& name) {
  auto pool = std::make_shared<KvPool>();
  pool->name = name;
  pool->segment = shm::Segment::open(name);
  pool->pages.emplace(shm::KvPages::attach(pool->segment));
  pool->n_pages = pool->pages->n_pages();
  pool->page_bytes = pool->pages->page_bytes();
  pool->page_tokens = pool->pages->page_tokens();
  for (const auto& [hash, page] : pool->pages->published()) pool->index[hash] = page;
  return pool;
}

void KvPool::adopt_seq(uint64_t seq_id, int max_positions, int n_past) {
  if (seqs.count(seq_id))
    throw Error(Errc::invalid_argument,
                "adopt_seq: sequence " + std::to_string(seq_id) + " is open");
  std::vector<uint32_t> table = pages->pages_of(seq_id);
  if (n_past < 0 || static_cast<uint64_t>(n_past) > uint64_t{table.size()} * page_tokens)
    throw Error(Errc::out_of_range, "adopt_seq: sequence " + std::to_string(seq_id) + " holds " +
                                        std::to_string(table.size()) + " pages, not " +
                                        std::to_string(n_past) + " positions");
  // A step publishes the block it completes before the frontend journals the step's token: a
  // frontend killed between the two leaves a journal at n_past inside (or at the start of) a
  // block it published, and the step re-run from the journal writes there again (prepare()
  // refuses a write into a published page: the 10-minute chaos run's "does not own alone"
  // errors). Forget positions >= n_past as truncate() does: that page unpublished when nobody
  // borrowed it yet, or cached when n_past is its start. The re-run writes the same rows.
  const uint32_t write_block = static_cast<uint32_t>(n_past) / page_tokens;
  if (write_block < table.size() && pages->hash_of(table[write_block]) != 0 &&
      pages->owner_of(table[write_block]) == seq_id &&
      (n_past % page_tokens == 0 || pages->refs_of(table[write_block]) == 0)) {
    pages->truncate(seq_id, static_cast<uint32_t>(n_past));
    table = pages->pages_of(seq_id);
  }
  Sequence seq{max_positions, n_past};
  seq.pages = static_cast<uint32_t>(table.size());
  while (seq.blocks_done < table.size() && pages->hash_of(table[seq.blocks_done]) != 0)
    ++seq.blocks_done;
  seq.publishable = int64_t{seq.blocks_done} * page_tokens == n_past;
  seqs[seq_id] = std::move(seq);
}

int KvPool::share_prefix(uint64_t seq_id, std::span<const int32_t> prompt) {
  auto it = seqs.find(seq_id);
  if (it == seqs.end())
    throw Error(Errc::not_found,
                "share_prefix: sequence " + std::to_string(seq_id) + " is not open");
  Sequence& seq = it->second;
  if (!sharing || seq.n_past != 0 || seq.pages != 0 || prompt.size() < 2) return 0;
  ++prefix.lookups;
  // Whole blocks, leaving at least one prompt token to compute: its logits sample the first
  // token, and the sequence's first write lands in a fresh page of its own.
  const size_t max_blocks = (prompt.size() - 1) / page_tokens;
  std::vector<uint32_t> chain;
  uint64_t hash = 0;
  // Borrowing a cached (evictable) page takes it out of what admission may promise: only while
  // enough stays free for the promises already made.
  uint32_t spare = pages->available();
  const uint32_t promised = promised_not_taken();
  for (size_t b = 0; b < max_blocks; ++b) {
    const std::span<const int32_t> block = prompt.subspan(b * page_tokens, page_tokens);
    hash = shm::KvPages::block_hash(hash, block);
    auto hint = index.find(hash);
    if (hint == index.end()) break;
    const uint32_t parent = chain.empty() ? shm::KvPages::kNoPage : chain.back();
    const uint32_t page = pages->find_block(hash, parent, block, hint->second);
    if (page == shm::KvPages::kNoPage) {
      index.erase(hint);  // evicted or unpublished since
      break;
    }
    if (pages->owner_of(page) == shm::KvPages::kCached && pages->refs_of(page) == 0) {
      if (spare <= promised) {
        ++prefix.kept_free;
        break;
      }
      --spare;
    }
    chain.push_back(page);
  }
  if (chain.empty()) return 0;
  pages->borrow(seq_id, chain);
  const int positions = static_cast<int>(chain.size() * page_tokens);
  seq.pages = static_cast<uint32_t>(chain.size());
  seq.n_past = positions;
  seq.blocks_done = static_cast<uint32_t>(chain.size());
  seq.tail.clear();
  ++prefix.hits;
  prefix.hit_blocks += chain.size();
  prefix.hit_tokens += static_cast<uint64_t>(positions);
  return positions;
}

void KvPool::record_tokens(uint64_t seq_id, int pos0, std::span<const int32_t> tokens) {
  Sequence& seq = seqs.at(seq_id);
  if (!sharing || !seq.publishable) return;
  const int64_t base = int64_t{seq.blocks_done} * page_tokens;
  if (pos0 < base || pos0 - base > static_cast<int64_t>(seq.tail.size())) {
    seq.publishable = false;  // a rewrite of published positions is refused by prepare()
    return;
  }
  seq.tail.resize(static_cast<size_t>(pos0 - base));
  seq.tail.insert(seq.tail.end(), tokens.begin(), tokens.end());
}

void KvPool::publish_done(uint64_t seq_id, int n_past) {
  auto it = seqs.find(seq_id);
  if (it == seqs.end() || !sharing) return;
  Sequence& seq = it->second;
  if (!seq.publishable || (int64_t{seq.blocks_done} + 1) * page_tokens > n_past) return;
  const std::vector<uint32_t> table = pages->pages_of(seq_id);
  while (seq.publishable && (int64_t{seq.blocks_done} + 1) * page_tokens <= n_past &&
         seq.tail.size() >= page_tokens && seq.blocks_done < table.size()) {
    const uint32_t page = table[seq.blocks_done];
    const uint32_t parent =
        seq.blocks_done == 0 ? shm::KvPages::kNoPage : table[seq.blocks_done - 1];
    if (pages->owner_of(page) != seq_id || pages->hash_of(page) != 0 ||
        (parent != shm::KvPages::kNoPage && pages->hash_of(parent) == 0)) {
      seq.publishable = false;  // not a chain this sequence can extend
      break;
    }
    const uint64_t hash =
        pages->publish(seq_id, page, parent, std::span(seq.tail).first(page_tokens));
    index[hash] = page;
    ++prefix.published;
    // Evicted blocks leave their entries behind until a lookup trips on them: past twice the
    // pool's pages, start again from what the segment has published.
    if (index.size() > 2 * size_t{n_pages}) {
      index.clear();
      for (const auto& [h, p] : pages->published()) index[h] = p;
    }
    seq.tail.erase(seq.tail.begin(), seq.tail.begin() + page_tokens);
    ++seq.blocks_done;
  }
}

void KvPool::truncate(uint64_t seq_id, int n_past) {
  auto it = seqs.find(seq_id);
  if (it == seqs.end()) return;
  Sequence& seq = it->second;
  const int keep = std::clamp(n_past, 0, seq.n_past);
  pages->truncate(seq_id, static_cast<uint32_t>(keep));
  seq.n_past = keep;
  seq.pages = static_cast<uint32_t>(pages->pages_of(seq_id).size());
  const uint32_t whole = static_cast<uint32_t>(keep) / page_tokens;
  if (whole < seq.blocks_done) {
    // Its blocks past the cut are unpublished or dropped; the tokens of a partial one are gone.
    seq.blocks_done = whole;
    seq.tail.clear();
    seq.publishable = keep % static_cast<int>(page_tokens) == 0;
  } else if (seq.publishable) {
    seq.tail.resize(std::min(seq.tail.size(),
                             static_cast<size_t>(keep) - size_t{seq.blocks_done} * page_tokens));
  }
}

}  // namespace duet::frontend
