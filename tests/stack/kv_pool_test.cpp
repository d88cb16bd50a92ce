// The KV pool of a real stack (issue 20): sized by `stack up --kv-memory`, a model's full trained
// context accepted by default, a setting the stack cannot serve refused at `stack up` with the
// reason, and no request ever left without an answer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/run_dir.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class KvPoolStack : public ::testing::Test {
 protected:
  void SetUp() override {
    id_ = test_support::unique_stack_id("kv20_", 18);
    run_dir_ = default_run_dir(id_);
    dir_ = std::filesystem::temp_directory_path() / ("duet-kvpool-" + id_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    test_support::tear_down_stack(id_, run_dir_);
    std::filesystem::remove_all(dir_);
  }
  // tiny-llama3's shape with its trained context of 131072 positions.
  std::string long_context_model() {
    const std::string path = (dir_ / "long-ctx.gguf").string();
    CliResult r = run_duet("mkmodel --shape tiny-llama3 --type f16 --ctx 131072 --out " + path);
    EXPECT_EQ(r.rc, 0) << r.out;
    return path;
  }
  nlohmann::json frontend_status() {
    CliResult r = run_duet("status --stack " + id_ + " --json");
    EXPECT_EQ(r.rc, 0) << r.out;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  std::string id_, run_dir_;
  std::filesystem::path dir_;
};

TEST_F(KvPoolStack, FullTrainedContextComesUpAndAnswers) {
  const std::string model = long_context_model();
  // No DUET_MAX_CTX: the model's 131072 positions, in a pool of 160 MiB (one sequence: 128 MiB at
  // f32).
  CliResult up = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 160M");
  ASSERT_EQ(up.rc, 0) << up.out;
  EXPECT_NE(up.out.find("KV pool:"), std::string::npos) << up.out;
  EXPECT_NE(up.out.find("131072 positions"), std::string::npos) << up.out;
  // Before issue 20 this waited forever: `timeout` turns a hang into a failure.
  CliResult gen = run_duet("generate --stack " + id_ + " --max-tokens 4 --ignore-eos --json hello",
                           "timeout 60");
  ASSERT_EQ(gen.rc, 0) << gen.out;
  const nlohmann::json s = frontend_status();
  ASSERT_FALSE(s.is_discarded());
  const nlohmann::json& engine = s["frontend"]["engine"];
  EXPECT_EQ(engine["max_context"], 131072) << engine.dump();
  EXPECT_GT(engine["kv_pages_total"].get<int>(), 0) << engine.dump();
  EXPECT_EQ(engine["kv_pages_used"], 0) << "pages outlived their request: " << engine.dump();
  EXPECT_LE(engine["kv_pool_bytes"].get<uint64_t>(), uint64_t{160} << 20) << engine.dump();
}

TEST_F(KvPoolStack, BudgetBelowOneSequenceIsRefusedAtStackUpWithTheReason) {
  const std::string model = long_context_model();
  CliResult up = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 1M");
  EXPECT_NE(up.rc, 0) << up.out;
  EXPECT_NE(up.out.find("less than one sequence"), std::string::npos) << up.out;
  EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "a refused stack started anyway";
  // The same budget serves a context it can hold.
  CliResult fits = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 1M",
                            "DUET_MAX_CTX=1024");
  EXPECT_EQ(fits.rc, 0) << fits.out;
}

// Out of pages (issue 20): 32 concurrent requests whose KV together is more than twice the pool
// all finish, each with the tokens it gets alone. Admission reserves what a request can grow to
// and makes the rest wait (services/frontend/frontend_admit.cpp), so no running request ever
// fails or is recomputed for lack of KV.
TEST_F(KvPoolStack, ThirtyTwoRequestsLargerThanThePoolAllFinishWithTheirOwnTokens) {
  // tiny-fortune at f16: 48 KiB pages of 16 tokens; 2 MiB hold 42 pages, one 512-position
  // sequence 32. Each request: a short prompt + 40 tokens = 3 pages, 96 pages for the 32.
  CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 2M");
  ASSERT_EQ(up.rc, 0) << up.out;
  ASSERT_NE(up.out.find("42 pages"), std::string::npos) << up.out;
  const std::vector<std::string> starts = {"The man who", "Once upon", "A cat", "Life is",
                                           "Never",       "In the",    "Why",   "She said"};
  auto prompt = [&](int i) { return starts[i % 8] + " " + std::to_string(i); };
  const std::string gen = "'" DUET_BINARY_DIR "/bin/duet' generate --stack " + id_ +
                          " --max-tokens 40 --ignore-eos --json ";
  std::string all = "cd '" + dir_.string() + "' && (";
  for (int i = 0; i < 32; ++i)
    all += "timeout 120 " + gen + "'" + prompt(i) + "' > together" + std::to_string(i) + " 2>&1 & ";
  all += "wait)";
  ASSERT_EQ(std::system(all.c_str()), 0);
  auto ids_in = [&](const std::string& name) {
    std::ifstream f(dir_ / name);
    const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
    return j.is_discarded() ? nlohmann::json() : j["ids"];
  };
  for (int i = 0; i < 32; ++i) {
    SCOPED_TRACE(prompt(i));
    CliResult alone = run_duet(
        "generate --stack " + id_ + " --max-tokens 40 --ignore-eos --json '" + prompt(i) + "'",
        "timeout 60");
    ASSERT_EQ(alone.rc, 0) << alone.out;
    const nlohmann::json want = nlohmann::json::parse(alone.out)["ids"];
    ASSERT_EQ(want.size(), 40u);
    EXPECT_EQ(ids_in("together" + std::to_string(i)), want);
  }
  const nlohmann::json engine = frontend_status()["frontend"]["engine"];
  EXPECT_EQ(engine["kv_pages_used"], 0) << engine.dump();
  EXPECT_EQ(engine["kv_pages_total"], 42) << engine.dump();
  EXPECT_EQ(engine["kv_pages_promised"], 0) << engine.dump();
  EXPECT_GT(engine["kv_reserve_refusals"].get<int>(), 0)
      << "no admission ever waited for KV: the test did not press the pool";
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (f.read(reinterpret_cast<char*>(&x), sizeof(x))) v.push_back(x);
  return v;
}

// gpu_svc's f16 KV kernels (the stack's default KV type) against the fp32 oracle (the reference
// plan, in the frontend): every position's logits within the f16 gate of
// ProgramEngine.F16KvPagesStayWithinTheGateOfTheFp32Reference.
TEST_F(KvPoolStack, GpuSvcF16KvLogitsStayWithinTheGateOfTheFp32Reference) {
  constexpr float kGate = 0.02f;
  CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 64M");
  ASSERT_EQ(up.rc, 0) << up.out;
  EXPECT_NE(up.out.find("of F16"), std::string::npos) << up.out;
  std::string ids = "1";
  for (int i = 0; i < 47; ++i) ids += " " + std::to_string(100 + 37 * i);
  const std::string gpu = (dir_ / "gpu.f32").string(), ref = (dir_ / "ref.f32").string();
  for (const auto& [plan, out] : {std::pair{"gpu-only", gpu}, std::pair{"reference", ref}}) {
    CliResult r = run_duet(
        "eval --stack " + id_ + " --plan " + plan + " --ids '" + ids + "' --logits-out " + out,
        "timeout 120");
    ASSERT_EQ(r.rc, 0) << plan << ": " << r.out;
  }
  const std::vector<float> a = read_floats(gpu), b = read_floats(ref);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 48u * 1000);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  std::printf("[ kv ] gpu_svc f16 KV vs fp32 oracle, 48 positions: max |logit diff| %.5f\n", worst);
  EXPECT_LT(worst, kGate);
}

}  // namespace
}  // namespace duet
