#pragma once
// The reference gate of issues 7 and 8, shared by the tests that hold an engine to it and the
// bench that sweeps settings against it: teacher-forced top-1 agreement with HF transformers'
// logits (tests/data/tiny-fortune/teacher-forced/<variant>.{json,logits.f32}) at every position
// where the reference's top-1 leads its runner-up by more than kClearMargin. Header-only.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "services/frontend/engine.h"

namespace duet::test_support {

inline constexpr float kClearMargin = 0.05f;

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::not_found, "cannot read " + path);
  return nlohmann::json::parse(in);
}

inline std::vector<float> load_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(Errc::not_found, "cannot read " + path);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

struct Disagreement {
  size_t reference_row = 0;
  float reference_margin = 0;
  int64_t ours = 0, reference = 0;  // the two top-1 tokens
};

struct Agreement {
  int clear = 0;  // positions whose reference margin > kClearMargin
  int agree = 0;  // of those, where our top-1 is the reference's
  std::vector<Disagreement> flipped;
};

// The flipped positions, one line each, for a failure message.
inline std::string describe(const Agreement& a) {
  std::string out = std::to_string(a.agree) + " of " + std::to_string(a.clear) + " agree";
  for (const Disagreement& d : a.flipped)
    out += "\n  reference row " + std::to_string(d.reference_row) + " (margin " +
           std::to_string(d.reference_margin) + "): ours " + std::to_string(d.ours) +
           ", reference " + std::to_string(d.reference);
  return out;
}

// Each reference sequence through `e`: the prompt as one prefill step, then every reference
// token one decode step at a time (sequence ids from 1, max_positions positions each).
inline Agreement teacher_forced(frontend::Engine& e, const std::string& data_dir,
                                const std::string& variant, int max_positions = 128) {
  const nlohmann::json j = load_json(data_dir + "teacher-forced/" + variant + ".json");
  const std::vector<float> ref = load_f32(data_dir + "teacher-forced/" + variant + ".logits.f32");
  const int V = e.model().hp().n_vocab;
  Agreement a;
  size_t row = 0;
  uint64_t seq = 1;
  for (const auto& s : j["sequences"]) {
    const std::vector<int32_t> ids = s["ids"];
    const int n_prompt = s["n_prompt"];
    if ((row + ids.size()) * static_cast<size_t>(V) > ref.size())
      throw Error(Errc::bad_format, "teacher-forced/" + variant + ": fewer logits rows than ids");
    e.open_seq(seq, max_positions);
    auto check = [&](const std::vector<float>& logits, size_t ref_row) {
      const float* r = &ref[ref_row * V];
      std::vector<float> sorted(r, r + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] <= kClearMargin) return;
      ++a.clear;
      const auto top = [&](const float* v) { return std::max_element(v, v + V) - v; };
      if (top(logits.data()) == top(r))
        ++a.agree;
      else
        a.flipped.push_back({ref_row, sorted[0] - sorted[1], top(logits.data()), top(r)});
    };
    const std::vector<int32_t> prompt(ids.begin(), ids.begin() + n_prompt);
    check(e.step({{seq, prompt, 0, true}}, nullptr), row + n_prompt - 1);
    for (size_t p = n_prompt; p < ids.size(); ++p)
      check(e.step({{seq, {ids[p]}, static_cast<int32_t>(p), true}}, nullptr), row + p);
    e.close_seq(seq++);
    row += ids.size();
  }
  return a;
}

}  // namespace duet::test_support
