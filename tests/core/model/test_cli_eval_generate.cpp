// `duet eval` and `duet generate --local` run as a user runs them (the built binary).
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "core/model/forward.h"
#include "core/model/model.h"
#include "reference_data.h"

namespace duet {
namespace {

const std::string kDuet = std::string(DUET_BINARY_DIR) + "/bin/duet";

struct RunResult {
  int exit_code;
  std::string out;  // stdout and stderr together
};

RunResult run(const std::string& args) {
  const std::string cmd = kDuet + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return {-1, "popen failed"};
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(CliEval, WritesTheSameLogitsAsTheInProcessForwardPass) {
  const std::string model = testdata::fortune_model("q4_0");
  const std::string out =
      (std::filesystem::temp_directory_path() / ("duet-eval-" + std::to_string(::getpid())))
          .string();
  const std::vector<int32_t> ids = {1, 1342, 347, 1283, 262, 573};
  const RunResult r = run("eval --model " + model +
                          " --ids \"1 1342 347 1283 262 573\" --threads 2 --logits-out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto written = testdata::load_f32(out);
  std::filesystem::remove(out);
  const auto m = LlamaModel::load(model);
  ReferenceForward fwd(*m);
  EXPECT_EQ(written, fwd.forward(ids, true));  // bit for bit: thread count never changes results
}

TEST(CliEval, RejectsBadIdsWithAClearError) {
  const std::string model = testdata::fortune_model("q4_0");
  RunResult r = run("eval --model " + model + " --ids \"1 12x\" --logits-out /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("\"12x\" is not a token id"), std::string::npos) << r.out;
  r = run("eval --model " + model + " --ids \"1 5000\" --logits-out /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("token id 5000"), std::string::npos) << r.out;
  r = run("eval --model /nonexistent.gguf --ids 1 --logits-out /dev/null");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("/nonexistent.gguf: cannot open"), std::string::npos) << r.out;
}

TEST(CliGenerate, GreedyLocalContinuesLikeHfAndReportsSpeed) {
  const auto& prompt = testdata::hf_reference()["q8_0"]["prompts"][0];
  // HF decodes the continuation alone, dropping its first piece's "▁" as sentencepiece's dummy
  // prefix; printed after the prompt it is the space between them (llama.cpp prints it too).
  const std::string expect = " " + prompt["greedy48_text"].get<std::string>().substr(0, 20);
  const RunResult r = run("generate --model " + testdata::fortune_model("q8_0") +
                          " --local --max-tokens 8 \"" + prompt["text"].get<std::string>() + "\"");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.substr(0, expect.size()), expect) << r.out;
  EXPECT_NE(r.out.find("prompt: 6 tokens, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("generated: 8 tokens, "), std::string::npos) << r.out;
}

TEST(CliGenerate, RejectsInvalidSampling) {
  const RunResult r = run("generate --local --top-p 1.5 hello");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("top_p must be in (0, 1]"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace duet
