// The KV pool of a real stack (issue 20): sized by `stack up --kv-memory`, a model's full trained
// context accepted by default, a setting the stack cannot serve refused at `stack up` with the
// reason, and no request ever left without an answer.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/ipc/run_dir.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class KvPoolStack : public test_support::StackFixture {
 protected:
  KvPoolStack() : StackFixture("kv20_", 18) {}
  // tiny-llama3's shape with its trained context of 131072 positions.
  std::string long_context_model() {
    const std::string path = (dir_ / "long-ctx.gguf").string();
    CliResult r = run_duet("mkmodel --shape tiny-llama3 --type f16 --ctx 131072 --out " + path);
    EXPECT_EQ(r.rc, 0) << r.out;
    return path;
  }
  // A prompt of n_words plain words (about 2.8 tokens each) in a file; returns the shell
  // expression that reads it as one argument.
  std::string long_prompt_arg(int n_words) {
    const std::vector<std::string> words = {"alpha", "beta",  "gamma", "delta", "river",
                                            "stone", "cloud", "music", "paper", "light"};
    std::string prompt;
    for (int i = 0; i < n_words; ++i) prompt += words[(i * 7 + i / 10) % 10] + " ";
    const std::string file = (dir_ / "prompt.txt").string();
    std::ofstream(file) << prompt;
    return "\"$(cat " + file + ")\"";
  }
  // Runs the prompts (shell words) as concurrent `duet generate` clients, then each alone, and
  // expects the same ids; afterwards no page is used or promised, and admission did wait for
  // KV at least once (else the pool was never pressed and the test shows nothing).
  void expect_together_as_alone(const std::vector<std::string>& prompts, int max_tokens,
                                int pages_total) {
    const std::string gen = "generate --stack " + id_ + " --max-tokens " +
                            std::to_string(max_tokens) + " --ignore-eos --json ";
    std::string all = "cd '" + dir_.string() + "' && (";
    for (size_t i = 0; i < prompts.size(); ++i)
      all += "timeout 120 '" DUET_BINARY_DIR "/bin/duet' " + gen + prompts[i] + " > together" +
             std::to_string(i) + " 2>&1 & ";
    all += "wait)";
    ASSERT_EQ(std::system(all.c_str()), 0);
    for (size_t i = 0; i < prompts.size(); ++i) {
      SCOPED_TRACE("request " + std::to_string(i));
      std::ifstream f(dir_ / ("together" + std::to_string(i)));
      const nlohmann::json together = nlohmann::json::parse(f, nullptr, false);
      ASSERT_FALSE(together.is_discarded()) << "request " << i << " gave no JSON";
      CliResult alone = run_duet(gen + prompts[i], "timeout 60");
      ASSERT_EQ(alone.rc, 0) << alone.out.substr(0, 2000);
      const nlohmann::json want = nlohmann::json::parse(alone.out)["ids"];
      ASSERT_EQ(want.size(), static_cast<size_t>(max_tokens));
      EXPECT_EQ(together["ids"], want);
    }
    const nlohmann::json engine = frontend_status()["frontend"]["engine"];
    EXPECT_EQ(engine["kv_pages_used"], 0) << engine.dump();
    EXPECT_EQ(engine["kv_pages_total"], pages_total) << engine.dump();
    EXPECT_EQ(engine["kv_pages_promised"], 0) << engine.dump();
    EXPECT_GT(engine["kv_reserve_refusals"].get<int>(), 0)
        << "no admission ever waited for KV: the test did not press the pool";
  }
  nlohmann::json frontend_status() {
    CliResult r = run_duet("status --stack " + id_ + " --json");
    EXPECT_EQ(r.rc, 0) << r.out;
    return nlohmann::json::parse(r.out, nullptr, false);
  }

  test_support::TempDir tmp_{"duet-kvpool"};
  const std::filesystem::path dir_ = tmp_.path();
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
  CliResult text = run_duet("status --stack " + id_);
  EXPECT_NE(text.out.find("KV pages: 0 used"), std::string::npos) << text.out;
}

// A 16k-token prompt through the stack on a small shape with a long trained context (issue 20's
// CI form of the 1B at 16k): it prefills in pages taken as it grows, answers, and returns them.
TEST_F(KvPoolStack, SixteenThousandTokenPromptGeneratesThroughTheStack) {
  const std::string model = long_context_model();
  CliResult up = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 64M");
  ASSERT_EQ(up.rc, 0) << up.out;
  CliResult gen = run_duet(
      "generate --stack " + id_ + " --max-tokens 4 --ignore-eos --json " + long_prompt_arg(6000),
      "timeout 150");
  ASSERT_EQ(gen.rc, 0) << gen.out.substr(0, 2000);
  const nlohmann::json j = nlohmann::json::parse(gen.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << gen.out.substr(0, 2000);
  EXPECT_GE(j["stats"]["prompt_tokens"].get<int>(), 16384);
  EXPECT_EQ(j["ids"].size(), 4u);
  std::printf("[ kv ] %d-token prompt: TTFT %.0f ms\n", j["stats"]["prompt_tokens"].get<int>(),
              j["stats"]["ttft_ms"].get<double>());
  EXPECT_EQ(frontend_status()["frontend"]["engine"]["kv_pages_used"], 0);
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
  // sequence 32. Each request: a short prompt + 120 tokens = 8 pages, 256 pages for the 32: at
  // most 5 run at once, the rest wait for pages.
  CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 2M");
  ASSERT_EQ(up.rc, 0) << up.out;
  ASSERT_NE(up.out.find("42 pages"), std::string::npos) << up.out;
  const std::vector<std::string> starts = {"The man who", "Once upon", "A cat", "Life is",
                                           "Never",       "In the",    "Why",   "She said"};
  std::vector<std::string> prompts;
  for (int i = 0; i < 32; ++i)
    prompts.push_back("'" + starts[i % 8] + " " + std::to_string(i) + "'");
  expect_together_as_alone(prompts, 120, 42);
}

// The issue's own form: 32 concurrent ~2k-token prompts on a long-context shape, whose KV (124
// pages each, 3968 in all) is nearly four times the pool (1024 pages: 8 such sequences at once).
// Each prompt starts with its own number, so no two share a block and the prefix cache cannot
// relieve the pool.
TEST_F(KvPoolStack, ThirtyTwoTwoThousandTokenRequestsLargerThanThePoolAllFinishWithTheirOwnTokens) {
  const std::string model = long_context_model();
  CliResult up = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 8M",
                          "DUET_MAX_CTX=4096");
  ASSERT_EQ(up.rc, 0) << up.out;
  ASSERT_NE(up.out.find("1024 pages"), std::string::npos) << up.out;
  const std::string words = long_prompt_arg(700);  // ~1960 tokens
  std::vector<std::string> prompts;
  for (int i = 0; i < 32; ++i) prompts.push_back("\"" + std::to_string(i) + " \"" + words);
  const nlohmann::json probe = nlohmann::json::parse(
      run_duet("generate --stack " + id_ + " --max-tokens 1 --json " + prompts[0], "timeout 60")
          .out,
      nullptr, false);
  ASSERT_FALSE(probe.is_discarded());
  EXPECT_GE(probe["stats"]["prompt_tokens"].get<int>(), 1900);
  expect_together_as_alone(prompts, 8, 1024);
}

// A pool larger than gpu_svc's largest buffer (made small here, DUET_GPU_KV_MAX_BUFFER) runs as
// one buffer per group of layers with the tokens of one buffer; a buffer too small for one layer
// is refused with the reason, not left hanging.
TEST_F(KvPoolStack, PoolMappedInPiecesGivesTheTokensOfOneBuffer) {
  // tiny-fortune at f16 with 48 MiB: 6 layers of 8 MiB; 17 MiB buffers hold 2 layers each.
  const std::string gen = "generate --stack " + id_ + " --max-tokens 24 --ignore-eos --json ";
  auto ids_of = [&](const std::string& env) {
    CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 48M", env);
    EXPECT_EQ(up.rc, 0) << up.out;
    CliResult r = run_duet(gen + "'The man who'", "timeout 60");
    run_duet("stack down --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_discarded() ? nlohmann::json(r.out) : j["ids"];
  };
  const nlohmann::json one = ids_of("");
  EXPECT_EQ(one.size(), 24u);
  EXPECT_EQ(ids_of("DUET_GPU_KV_MAX_BUFFER=" + std::to_string(17 << 20)), one);
  CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 48M",
                          "DUET_GPU_KV_MAX_BUFFER=" + std::to_string(4 << 20));
  ASSERT_EQ(up.rc, 0) << up.out;
  CliResult r = run_duet(gen + "'The man who'", "timeout 60");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("largest buffer"), std::string::npos) << r.out;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (f.read(reinterpret_cast<char*>(&x), sizeof(x))) v.push_back(x);
  return v;
}

// gpu_svc's f16 KV kernels (the stack's default KV type) against the fp32 oracle (`duet eval`
// without a stack: core ReferenceForward in the CLI): every position's logits within the f16
// gate of ProgramEngine.F16KvPagesStayWithinTheGateOfTheFp32Reference. The stack's own reference
// plan follows its KV type (f16 rows); its distance is printed beside.
TEST_F(KvPoolStack, GpuSvcF16KvLogitsStayWithinTheGateOfTheFp32Reference) {
  constexpr float kGate = 0.02f;
  CliResult up = run_duet("stack up --stack " + id_ + " --kv-memory 64M");
  ASSERT_EQ(up.rc, 0) << up.out;
  EXPECT_NE(up.out.find("of F16"), std::string::npos) << up.out;
  std::string ids = "1";
  for (int i = 0; i < 47; ++i) ids += " " + std::to_string(100 + 37 * i);
  const std::string gpu = (dir_ / "gpu.f32").string(), ref = (dir_ / "ref.f32").string();
  const std::string stack_ref = (dir_ / "stack-ref.f32").string();
  for (const auto& [plan, out] : {std::pair{"gpu-only", gpu}, std::pair{"reference", stack_ref}}) {
    CliResult r = run_duet(
        "eval --stack " + id_ + " --plan " + plan + " --ids '" + ids + "' --logits-out " + out,
        "timeout 120");
    ASSERT_EQ(r.rc, 0) << plan << ": " << r.out;
  }
  CliResult oracle = run_duet("eval --ids '" + ids + "' --logits-out " + ref, "timeout 120");
  ASSERT_EQ(oracle.rc, 0) << oracle.out;
  const std::vector<float> a = read_floats(gpu), b = read_floats(ref), c = read_floats(stack_ref);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(c.size(), b.size());
  ASSERT_GT(a.size(), 48u * 1000);
  float worst = 0, to_f16_reference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    to_f16_reference = std::max(to_f16_reference, std::abs(a[i] - c[i]));
  }
  std::printf(
      "[ kv ] gpu_svc f16 KV, 48 positions: max |logit diff| %.5f to the fp32 oracle, "
      "%.5f to the stack's f16 reference plan\n",
      worst, to_f16_reference);
  EXPECT_LT(worst, kGate);
  EXPECT_GT(worst, 0.0f);
}

// An eval on the stack's own plan goes through the scheduler, which asks for every position's
// logits as one entry per position: 48 positions are three steps' worth of the engine's 16
// sequences (it refused a step of 17 before the scheduler cut an eval's chunk to them).
TEST_F(KvPoolStack, EvalOnTheStacksOwnPlanTakesAsManyPositionsAsAStepHasSequences) {
  CliResult up = run_duet("stack up --stack " + id_ + " --plan gpu-only --kv-memory 64M");
  ASSERT_EQ(up.rc, 0) << up.out;
  std::string ids = "1";
  for (int i = 0; i < 47; ++i) ids += " " + std::to_string(100 + 37 * i);
  const std::string own = (dir_ / "own.f32").string(), ref = (dir_ / "ref.f32").string();
  CliResult r =
      run_duet("eval --stack " + id_ + " --ids '" + ids + "' --logits-out " + own, "timeout 120");
  ASSERT_EQ(r.rc, 0) << r.out;
  CliResult oracle = run_duet("eval --ids '" + ids + "' --logits-out " + ref, "timeout 120");
  ASSERT_EQ(oracle.rc, 0) << oracle.out;
  const std::vector<float> a = read_floats(own), b = read_floats(ref);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 48u * 1000);
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LT(worst, 0.02f);  // GpuSvcF16KvLogitsStayWithinTheGateOfTheFp32Reference's gate
}

// kill -9 of gpu_svc, then of npu_svc, while a ~4000-token prompt prefills (issue 20): the
// supervisor restarts each, the step in flight is run again, the request ends with the tokens of
// an undisturbed run, and no KV page is left held.
TEST_F(KvPoolStack, ServicesKilledDuringALongPrefillLeaveTheTokensAndNoPageHeld) {
  const std::string model = long_context_model();
  // Prefix sharing off: the runs re-send one prompt, and with sharing the undisturbed run and
  // the runs under test would borrow the first run's pages instead of prefilling (TTFT ~6 ms,
  // over before any kill lands).
  CliResult up = run_duet("stack up --stack " + id_ + " --model " + model + " --kv-memory 64M",
                          "DUET_KV_PREFIX=off");
  ASSERT_EQ(up.rc, 0) << up.out;
  const std::string gen =
      "generate --stack " + id_ + " --max-tokens 8 --ignore-eos --json " + long_prompt_arg(1500);
  auto run = [&] {
    CliResult r = run_duet(gen, "timeout 120");
    EXPECT_EQ(r.rc, 0) << r.out.substr(0, 2000);
    return nlohmann::json::parse(r.out, nullptr, false);
  };
  ASSERT_FALSE(run().is_discarded());  // builds the engine and its programs
  const nlohmann::json undisturbed = run();
  ASSERT_FALSE(undisturbed.is_discarded());
  ASSERT_GE(undisturbed["stats"]["prompt_tokens"].get<int>(), 3500);
  const double ttft_ms = undisturbed["stats"]["ttft_ms"].get<double>();
  std::printf("[ kv ] %d-token prompt: TTFT %.0f ms undisturbed\n",
              undisturbed["stats"]["prompt_tokens"].get<int>(), ttft_ms);

  for (const std::string service : {"gpu_svc", "npu_svc"}) {
    SCOPED_TRACE(service);
    auto result = std::async(std::launch::async, run);
    // A third of the way into the prefill.
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(ttft_ms / 3) + 50));
    int pid = 0;
    if (auto s = test_support::stack_status(run_dir_))
      for (const auto& svc : (*s)["services"])
        if (svc["name"] == service) pid = svc["pid"].get<int>();
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    const nlohmann::json disturbed = result.get();
    ASSERT_FALSE(disturbed.is_discarded());
    EXPECT_EQ(disturbed["ids"], undisturbed["ids"]);
    EXPECT_GE(disturbed["stats"]["restarts_seen"].get<int>(), 1)
        << "the kill did not land inside the request: " << disturbed["stats"].dump();
    std::printf("[ kv ] %s killed during prefill: TTFT %.0f ms, tokens identical\n",
                service.c_str(), disturbed["stats"]["ttft_ms"].get<double>());
  }
  const nlohmann::json engine = frontend_status()["frontend"]["engine"];
  EXPECT_EQ(engine["kv_pages_used"], 0) << "pages leaked: " << engine.dump();
  EXPECT_EQ(engine["open_sequences"], 0) << engine.dump();
}

}  // namespace
}  // namespace duet
