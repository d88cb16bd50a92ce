#pragma once
// What the agent tests' engines share: the tiny model, the options of an engine that always
// executes one plan (a test's proactive and main engines differ in their tag, sequences and
// context), the engine over in-process interpreters, and prompts. Header-only.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "services/frontend/program_engine.h"
#include "tests/support/local_flags.h"

namespace duet::frontend::agent_testing {

inline std::string model_path() {
  return test_support::tiny_fortune_path("q8_0");
}

// An engine of the tiny model for stack `stack_id` whose every step runs `plan`, its programs
// built for 4- and 32-token steps.
inline ProgramEngineOptions pinned_plan_options(const std::string& stack_id, const std::string& tag,
                                                const Plan& plan, uint32_t max_seqs,
                                                uint32_t max_ctx) {
  ProgramEngineOptions o;
  o.model_path = model_path();
  o.stack_id = stack_id;
  o.segment_tag = tag;
  o.plan_name = plan.name;
  o.plan_for = [plan](uint32_t) { return plan; };
  o.buckets = {4, 32};
  o.max_seqs = max_seqs;
  o.max_ctx = max_ctx;
  return o;
}

// The engine with both devices' halves run by the program interpreter in this process.
inline std::unique_ptr<ProgramEngine> interpreted_engine(const ProgramEngineOptions& o) {
  return std::make_unique<ProgramEngine>(o, LlamaModel::load(o.model_path),
                                         make_interpreter_link("gpu"),
                                         make_interpreter_link("npu"));
}

// BOS and n - 1 token ids in [3, 253), different for each salt.
inline std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p{1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 11) % 250);
  return p;
}

inline int32_t argmax(const float* v, size_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

}  // namespace duet::frontend::agent_testing
