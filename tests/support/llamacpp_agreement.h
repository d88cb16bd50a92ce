#pragma once
// An engine held to llama.cpp's teacher-forced answers (tests/data/llamacpp/logits-*.json, made
// by tools/llamacpp-oracle): the answer's ids fed as a short prefill and then one decode step per
// id, and at every position where llama.cpp's top-1 leads its runner-up by more than a margin
// its activation quantisation cannot move (tests/support/llamacpp_tolerance.h), the engine's
// top-1 must be llama.cpp's. Header-only.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "services/frontend/engine.h"
#include "tests/support/llamacpp_kl.h"
#include "tests/support/llamacpp_tolerance.h"
#include "tests/support/teacher_forced.h"

namespace duet::test_support {

struct LlamacppAgreement {
  int clear = 0;        // positions where llama.cpp's margin exceeds llamacpp_clear_margin
  int agree = 0;        // of those, where the engine's top-1 is llama.cpp's
  std::string flipped;  // one line per disagreement
  double kl_sum = 0;    // KL(llama.cpp || engine) summed over every checked position
  int positions = 0;
  double mean_kl() const { return positions ? kl_sum / positions : 0; }
};

inline LlamacppAgreement llamacpp_teacher_forced(frontend::Engine& e, const nlohmann::json& answer,
                                                 uint64_t seq, int n_prefill = 4) {
  const std::vector<int32_t> ids = answer.at("ids");
  const double clear_margin = llamacpp_tolerance(answer);
  const int V = e.model().hp().n_vocab;
  LlamacppAgreement a;
  auto check = [&](const std::vector<float>& logits, size_t pos) {
    const auto& p = answer.at("positions").at(pos);
    a.kl_sum += kl_topk(p, logits.data(), static_cast<size_t>(V));
    ++a.positions;
    if (p.at("margin").get<double>() <= clear_margin) return;
    ++a.clear;
    const auto ours = std::max_element(logits.begin(), logits.begin() + V) - logits.begin();
    const auto theirs = p.at("top_ids").at(0).get<int64_t>();
    if (ours == theirs)
      ++a.agree;
    else
      a.flipped += "\n  position " + std::to_string(pos) + ": ours " + std::to_string(ours) +
                   ", llama.cpp " + std::to_string(theirs) + " (margin " +
                   std::to_string(p.at("margin").get<double>()) + ")";
  };
  const size_t n0 = std::min(ids.size(), static_cast<size_t>(n_prefill));
  e.open_seq(seq, static_cast<int>(ids.size()) + 1);
  check(e.step({{seq, std::vector<int32_t>(ids.begin(), ids.begin() + n0), 0, true}}, nullptr),
        n0 - 1);
  for (size_t p = n0; p < ids.size(); ++p)
    check(e.step({{seq, {ids[p]}, static_cast<int32_t>(p), true}}, nullptr), p);
  e.close_seq(seq);
  return a;
}

}  // namespace duet::test_support
