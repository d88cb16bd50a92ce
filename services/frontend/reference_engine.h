#pragma once
// The oracle as an Engine: one core ReferenceForward (fp32, its own KV cache) per open sequence,
// in this process. It makes the whole serving path work and testable without the device
// services, and it is what every other engine's tokens are compared against (plan "reference").
#include <cstdint>
#include <map>
#include <memory>

#include "core/model/forward.h"
#include "services/frontend/engine.h"

namespace duet::frontend {

struct ReferenceEngineOptions {
  // KV cache budget over all open sequences; open_seq beyond it is Error(busy).
  uint64_t max_kv_bytes = uint64_t{256} << 20;
  // Tokens one step may carry (the frontend chunks longer prefills).
  int max_step_tokens = 128;
  // KV rows rounded to what a stack's --kv-type stores (f16 its default, q8_0); F32: the oracle.
  DType kv_type = DType::F32;
};

class ReferenceEngine : public Engine {
 public:
  // The model must outlive the engine.
  explicit ReferenceEngine(const LlamaModel& model, ReferenceEngineOptions options = {});

  const LlamaModel& model() const override { return model_; }
  std::string plan_name() const override { return "reference"; }
  void open_seq(uint64_t seq_id, int max_positions) override;
  void close_seq(uint64_t seq_id) override;
  void truncate_seq(uint64_t seq_id, int n_past) override;
  // Entries are applied in order; consecutive entries of one sequence run as one forward pass.
  std::vector<float> step(const std::vector<SeqStep>& batch, StepStats* stats) override;
  int max_step_tokens() const override { return options_.max_step_tokens; }
  nlohmann::json status() const override;

  // Bytes of KV cache one sequence of max_positions holds (K and V, every layer, fp32).
  uint64_t kv_bytes_for(int max_positions) const;
  uint64_t kv_bytes_in_use() const { return kv_bytes_in_use_; }
  size_t open_seqs() const { return seqs_.size(); }
  // The next position of a sequence (throws not_found for an unknown id).
  int position(uint64_t seq_id) const;

 private:
  struct Seq {
    std::unique_ptr<ReferenceForward> forward;
    int max_positions = 0;
    uint64_t kv_bytes = 0;
  };
  Seq& seq(uint64_t seq_id);
  const Seq& seq(uint64_t seq_id) const;

  const LlamaModel& model_;
  ReferenceEngineOptions options_;
  std::map<uint64_t, Seq> seqs_;
  uint64_t kv_bytes_in_use_ = 0;
  uint64_t steps_ = 0;
  uint64_t tokens_ = 0;
};

}  // namespace duet::frontend
