// gpu_svc's copies mode (discrete GPUs: buffers copied in and out around each step instead of
// mapped; services/gpu_svc/gpu_runner.h) through a real stack, forced on this host
// (DUET_GPU_FORCE_COPIES=1): a step uploads only the tables and the KV pages its sequences hold
// and brings back only what the frontend and the NPU read, so every path that shares or revisits
// KV pages must still give the tokens of a stack whose gpu_svc maps host memory: a long prompt
// (prefill, then decode across pages), a second prompt whose prefix pages are shared, requests
// decoding together, and a plan that hands off between gpu_svc and npu_svc within a step.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/ipc/run_dir.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class CopiesModeStack : public test_support::StackFixture {
 protected:
  CopiesModeStack() : StackFixture("cp_", 14) {}
  void TearDown() override {
    test_support::tear_down_stack(copies_, default_run_dir(copies_));
    StackFixture::TearDown();
  }
  // The same model and plan on a mapped stack (id_) and a copies one.
  void up_both(const std::string& plan) {
    const std::string args = " --model '" DUET_SOURCE_DIR
                             "/tests/data/tiny-fortune/fortune-q8_0.gguf' --kv-memory 48M --plan " +
                             plan;
    CliResult up = run_duet("stack up --stack " + id_ + args);
    ASSERT_EQ(up.rc, 0) << up.out;
    CliResult copies = run_duet("stack up --stack " + copies_ + args, "DUET_GPU_FORCE_COPIES=1");
    ASSERT_EQ(copies.rc, 0) << copies.out;
    std::ifstream log(std::filesystem::path(default_run_dir(copies_)) / "gpu_svc.log");
    std::stringstream text;
    text << log.rdbuf();
    ASSERT_NE(text.str().find("copies: true"), std::string::npos) << "gpu_svc maps memory";
  }
  std::vector<int> ids(const std::string& stack, const std::string& prompt, int max_tokens) {
    const nlohmann::json j = test_support::generate_json(
        stack, prompt, max_tokens, dir_ / ("prompt" + std::to_string(files_++)));
    if (!j.is_object() || !j.contains("ids")) {
      ADD_FAILURE() << "no ids: " << j.dump().substr(0, 2000);
      return {};
    }
    return j["ids"].get<std::vector<int>>();
  }

  const std::string copies_ = id_ + "_c";
  test_support::TempDir tmp_{"duet-copies"};
  const std::filesystem::path dir_ = tmp_.path();
  int files_ = 0;
};

const std::string kPrefix =
    "Once upon a time there was a little fox who lived in the forest near the river. Every "
    "morning she walked to the water, looked at the stones and the clouds, and listened to the "
    "birds. One day an old owl told her a story about a hidden garden beyond the hills, ";

TEST_F(CopiesModeStack, GivesTheTokensOfMappedMemoryAcrossPagesSharedPrefixesAndBatches) {
  up_both("gpu-only");
  // Prefill of ~70 tokens, then decode across five more pages.
  EXPECT_EQ(ids(copies_, kPrefix + "and she", 80), ids(id_, kPrefix + "and she", 80));
  // The prefix's pages computed above are shared: this prompt's step reads them, uploaded.
  EXPECT_EQ(ids(copies_, kPrefix + "so the fox", 24), ids(id_, kPrefix + "so the fox", 24));
  // Three requests decoding together: several sequences' page tables in one step.
  const std::string gen = "'" DUET_BINARY_DIR "/bin/duet' generate --stack " + copies_ +
                          " --max-tokens 40 --ignore-eos --json ";
  std::string all = "cd '" + dir_.string() + "' && (";
  const std::vector<std::string> suffixes = {"the garden", "a river stone", "and the owl"};
  for (size_t i = 0; i < suffixes.size(); ++i)
    all += "timeout 120 " + gen + "'" + kPrefix + suffixes[i] + "' > out" + std::to_string(i) +
           " 2>&1 & ";
  all += "wait)";
  ASSERT_EQ(std::system(all.c_str()), 0);
  for (size_t i = 0; i < suffixes.size(); ++i) {
    SCOPED_TRACE(suffixes[i]);
    std::ifstream f(dir_ / ("out" + std::to_string(i)));
    const nlohmann::json got = nlohmann::json::parse(f, nullptr, false);
    ASSERT_FALSE(got.is_discarded()) << "request " << i << " failed";
    EXPECT_EQ(got["ids"].get<std::vector<int>>(), ids(id_, kPrefix + suffixes[i], 40));
  }
}

// The solver's tensor plan for sd8gen3 splits matmuls between gpu_svc and npu_svc within a step:
// its gpu_svc programs wait on the NPU, so they take the whole arena and bring back every output.
TEST_F(CopiesModeStack, GivesTheTokensOfMappedMemoryWhenAStepHandsOffToTheNpu) {
  up_both("tensor");
  EXPECT_EQ(ids(copies_, kPrefix + "and she", 24), ids(id_, kPrefix + "and she", 24));
  EXPECT_EQ(ids(copies_, "The owl", 24), ids(id_, "The owl", 24));
}

}  // namespace
}  // namespace duet
