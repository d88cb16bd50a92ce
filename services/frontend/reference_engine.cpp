#include "services/frontend/reference_engine.h"

#include <chrono>
#include <string>

#include "core/base/error.h"

namespace duet::frontend {

ReferenceEngine::ReferenceEngine(const LlamaModel& model, ReferenceEngineOptions options)
    : model_(model), options_(options) {
  if (options_.max_step_tokens <= 0)
    throw Error(Errc::invalid_argument, "ReferenceEngine: max_step_tokens must be > 0, got " +
                                            std::to_string(options_.max_step_tokens));
}

uint64_t ReferenceEngine::kv_bytes_for(int max_positions) const {
  const LlamaHparams& hp = model_.hp();
  const uint64_t row = uint64_t(hp.n_head_kv) * uint64_t(hp.head_dim) * sizeof(float);
  return 2 * uint64_t(hp.n_layer) * uint64_t(max_positions) * row;
}

void ReferenceEngine::open_seq(uint64_t seq_id, int max_positions) {
  if (seqs_.count(seq_id))
    throw Error(Errc::internal,
                "open_seq: sequence " + std::to_string(seq_id) + " is already open");
  if (max_positions <= 0 || max_positions > model_.hp().n_ctx)
    throw Error(Errc::out_of_range, "open_seq: max_positions " + std::to_string(max_positions) +
                                        " outside [1, " + std::to_string(model_.hp().n_ctx) + "]");
  const uint64_t bytes = kv_bytes_for(max_positions);
  if (kv_bytes_in_use_ + bytes > options_.max_kv_bytes)
    throw Error(Errc::busy, "KV cache full: " + std::to_string(kv_bytes_in_use_) + " of " +
                                std::to_string(options_.max_kv_bytes) + " bytes in use, " +
                                std::to_string(bytes) + " more needed");
  Seq s;
  s.forward = std::make_unique<ReferenceForward>(model_, max_positions);
  s.forward->set_kv_type(options_.kv_type);
  s.max_positions = max_positions;
  s.kv_bytes = bytes;
  seqs_.emplace(seq_id, std::move(s));
  kv_bytes_in_use_ += bytes;
}

void ReferenceEngine::close_seq(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  kv_bytes_in_use_ -= it->second.kv_bytes;
  seqs_.erase(it);
}

ReferenceEngine::Seq& ReferenceEngine::seq(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end())
    throw Error(Errc::not_found, "sequence " + std::to_string(seq_id) + " is not open");
  return it->second;
}

const ReferenceEngine::Seq& ReferenceEngine::seq(uint64_t seq_id) const {
  return const_cast<ReferenceEngine*>(this)->seq(seq_id);
}

int ReferenceEngine::position(uint64_t seq_id) const {
  return seq(seq_id).forward->position();
}

void ReferenceEngine::truncate_seq(uint64_t seq_id, int n_past) {
  seq(seq_id).forward->truncate(n_past);
}

std::vector<float> ReferenceEngine::step(const std::vector<SeqStep>& batch, StepStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n_vocab = static_cast<size_t>(model_.hp().n_vocab);
  std::vector<float> out;
  uint32_t n_tokens = 0;
  for (size_t i = 0; i < batch.size();) {
    // A run of entries of one sequence, each starting where the previous ended, is one forward
    // pass with every row kept; the rows of the entries that want logits are picked from it.
    size_t j = i + 1;
    size_t run_tokens = batch[i].tokens.size();
    while (j < batch.size() && batch[j].seq_id == batch[i].seq_id &&
           batch[j].pos0 == batch[j - 1].pos0 + static_cast<int32_t>(batch[j - 1].tokens.size())) {
      run_tokens += batch[j].tokens.size();
      ++j;
    }
    Seq& s = seq(batch[i].seq_id);
    if (batch[i].pos0 > s.forward->position())
      throw Error(Errc::internal, "step: sequence " + std::to_string(batch[i].seq_id) + " has " +
                                      std::to_string(s.forward->position()) +
                                      " positions, the step starts at " +
                                      std::to_string(batch[i].pos0));
    if (batch[i].pos0 < 0)
      throw Error(Errc::invalid_argument,
                  "step: negative position " + std::to_string(batch[i].pos0));
    if (batch[i].pos0 + static_cast<int64_t>(run_tokens) > s.max_positions)
      throw Error(Errc::out_of_range, "step: sequence " + std::to_string(batch[i].seq_id) +
                                          " would pass its " + std::to_string(s.max_positions) +
                                          " positions");
    s.forward->truncate(batch[i].pos0);
    std::vector<int32_t> tokens;
    tokens.reserve(run_tokens);
    for (size_t k = i; k < j; ++k) {
      if (batch[k].tokens.empty())
        throw Error(Errc::invalid_argument, "step: an entry of sequence " +
                                                std::to_string(batch[k].seq_id) + " has no tokens");
      tokens.insert(tokens.end(), batch[k].tokens.begin(), batch[k].tokens.end());
    }
    const bool one_entry = (j == i + 1);
    const std::vector<float> logits = s.forward->forward(tokens, !one_entry);
    size_t row_end = 0;  // rows (tokens) consumed so far in this run
    for (size_t k = i; k < j; ++k) {
      row_end += batch[k].tokens.size();
      if (!batch[k].want_logits) continue;
      const size_t row = one_entry ? 0 : row_end - 1;
      out.insert(out.end(), logits.begin() + static_cast<std::ptrdiff_t>(row * n_vocab),
                 logits.begin() + static_cast<std::ptrdiff_t>((row + 1) * n_vocab));
    }
    n_tokens += static_cast<uint32_t>(run_tokens);
    i = j;
  }
  ++steps_;
  tokens_ += n_tokens;
  if (stats) {
    *stats = StepStats{};
    stats->measured_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    stats->n_tokens = n_tokens;
  }
  return out;
}

nlohmann::json ReferenceEngine::status() const {
  return {{"plan", plan_name()},
          {"open_seqs", seqs_.size()},
          {"kv_bytes_in_use", kv_bytes_in_use_},
          {"max_kv_bytes", options_.max_kv_bytes},
          {"max_step_tokens", options_.max_step_tokens},
          {"kv_type", std::string(dtype_name(options_.kv_type))},
          {"steps", steps_},
          {"tokens", tokens_}};
}

}  // namespace duet::frontend
