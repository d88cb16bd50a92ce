// Prefix sharing of KV pages through a real stack (issue 20 item 4): a request whose prompt starts
// with 1k tokens an earlier request computed reaches its first token in a fraction of the time,
// with the tokens of a stack that shares nothing (DUET_KV_PREFIX=off); concurrent sharers decode
// from the same read-only pages; chat sessions with one system prompt share it; and no page
// outlives its last user (status and the KV segment itself say so).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/ipc/run_dir.h"
#include "shm/kv_pages.h"
#include "shm/segment.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class KvPrefixStack : public test_support::StackFixture {
 protected:
  KvPrefixStack() : StackFixture("px_", 14) {}
  void TearDown() override {
    test_support::tear_down_stack(off_, default_run_dir(off_));
    StackFixture::TearDown();
  }
  // tiny-llama3's shape with a long trained context: room for a 1k-token prefix.
  std::string long_context_model() {
    const std::string path = (dir_ / "long-ctx.gguf").string();
    CliResult r = run_duet("mkmodel --shape tiny-llama3 --type f16 --ctx 8192 --out " + path);
    EXPECT_EQ(r.rc, 0) << r.out;
    return path;
  }
  static std::string words(int n, int salt) {
    const std::vector<std::string> w = {"alpha", "beta",  "gamma", "delta", "river",
                                        "stone", "cloud", "music", "paper", "light"};
    std::string s;
    for (int i = 0; i < n; ++i) s += w[(i * 7 + i / 10 + salt) % 10] + " ";
    return s;
  }
  nlohmann::json generate(const std::string& stack, const std::string& prompt, int max_tokens) {
    return test_support::generate_json(stack, prompt, max_tokens,
                                       dir_ / ("prompt" + std::to_string(files_++)));
  }
  nlohmann::json engine_status(const std::string& stack) {
    CliResult r = run_duet("status --stack " + stack + " --json");
    EXPECT_EQ(r.rc, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_discarded() ? nlohmann::json::object() : j["frontend"]["engine"];
  }
  // The segment's own account: no live sequence holds or borrows a page.
  void expect_segment_holds_nothing(const std::string& stack) {
    std::string kv;
    for (const std::string& s : shm::list_stack_segments(stack))
      if (s.find("kv") != std::string::npos) kv = s;
    ASSERT_FALSE(kv.empty()) << "no KV segment";
    shm::Segment seg = shm::Segment::open(kv, shm::Access::read_only);
    const shm::KvPages pages = shm::KvPages::attach(seg);
    EXPECT_TRUE(pages.owners().empty()) << "sequences still hold pages";
    const shm::KvPages::Counts c = pages.counts();
    EXPECT_EQ(c.used, 0u);
    EXPECT_EQ(c.shared, 0u);
    EXPECT_EQ(c.free + c.cached, pages.n_pages());
  }
  void up_both(const std::string& model, const std::string& plan = "auto") {
    const std::string args = " --model " + model + " --kv-memory 96M --plan " + plan;
    CliResult up = run_duet("stack up --stack " + id_ + args);
    ASSERT_EQ(up.rc, 0) << up.out;
    CliResult off = run_duet("stack up --stack " + off_ + args, "DUET_KV_PREFIX=off");
    ASSERT_EQ(off.rc, 0) << off.out;
    // The first request builds each engine: out of the TTFTs compared below.
    generate(id_, "hello", 2);
    generate(off_, "hello", 2);
  }

  const std::string off_ = id_ + "_off";
  test_support::TempDir tmp_{"duet-kvprefix"};
  const std::filesystem::path dir_ = tmp_.path();
  int files_ = 0;
};

TEST_F(KvPrefixStack, SecondRequestWithA1kTokenPrefixSkipsItsPrefillWithIdenticalTokens) {
  up_both(long_context_model());
  const std::string prefix = words(400, 0);  // ~1.1k tokens
  const nlohmann::json first = generate(id_, prefix + "river one", 16);
  const nlohmann::json second = generate(id_, prefix + "stone two", 16);
  const nlohmann::json unshared = generate(off_, prefix + "stone two", 16);
  ASSERT_GE(first["stats"]["prompt_tokens"].get<int>(), 1024);
  EXPECT_EQ(second["ids"], unshared["ids"]) << "sharing changed the tokens";
  EXPECT_EQ(second["ids"].size(), 16u);
  const double ttft1 = first["stats"]["ttft_ms"], ttft2 = second["stats"]["ttft_ms"];
  const double ttft_off = unshared["stats"]["ttft_ms"];
  std::printf(
      "[ prefix ] %d-token prompt: TTFT %.1f ms computed, %.1f ms with its prefix shared "
      "(%.0f%%), %.1f ms on the stack without sharing\n",
      second["stats"]["prompt_tokens"].get<int>(), ttft1, ttft2, 100 * ttft2 / ttft1, ttft_off);
  EXPECT_LT(ttft2, 0.2 * ttft1);

  const nlohmann::json e = engine_status(id_);
  EXPECT_GE(e["kv_prefix"]["hit_tokens"].get<int>(), 1024) << e.dump();
  EXPECT_EQ(e["kv_prefix"]["hits"], 1) << e.dump();
  EXPECT_EQ(e["kv_pages_used"], 0) << "a page outlived its last user: " << e.dump();
  EXPECT_EQ(e["kv_pages_shared"], 0) << e.dump();
  EXPECT_GE(e["kv_pages_cached"].get<int>(), 64) << "the prefix stays cached: " << e.dump();
  EXPECT_EQ(e["kv_pages_free"], e["kv_pages_total"]) << e.dump();
  EXPECT_EQ(engine_status(off_)["kv_prefix"]["hits"], 0);
  expect_segment_holds_nothing(id_);
  CliResult text = run_duet("status --stack " + id_);
  EXPECT_NE(text.out.find("KV prefix sharing on"), std::string::npos) << text.out;
}

// Six requests decode at once from one borrowed 1k-token prefix. prepare() refuses a step that
// would write a page its sequence does not own alone (Errc::internal), so every one finishing,
// with the unshared stack's tokens, shows that no shared page was written.
TEST_F(KvPrefixStack, ConcurrentSharersReadOnePrefixAndWriteOnlyTheirOwnPages) {
  // npu-only: its decode (3-6 ms a token here) keeps the six running long enough for the status
  // watcher below to see them share; the default plan's GPU decode (~0.5 ms) can end them between
  // two looks.
  up_both(long_context_model(), "npu-only");
  const std::string prefix = words(400, 3);
  generate(id_, prefix + "seed", 1);  // computes and publishes the prefix
  constexpr int kSharers = 6;
  const std::string gen = "'" DUET_BINARY_DIR "/bin/duet' generate --stack " + id_ +
                          " --max-tokens 64 --ignore-eos --json ";
  std::string all = "cd '" + dir_.string() + "' && (";
  for (int i = 0; i < kSharers; ++i) {
    std::ofstream(dir_ / ("p" + std::to_string(i))) << prefix + "question " + words(i + 1, i);
    all += "timeout 120 " + gen + "\"$(cat p" + std::to_string(i) + ")\" > out" +
           std::to_string(i) + " 2>&1 & ";
  }
  all += "wait)";
  // Watch the pool while they run: their prefix pages are shared, counted once.
  std::string watch = "for i in $(seq 400); do '" DUET_BINARY_DIR "/bin/duet' status --stack " +
                      id_ + " --json; sleep 0.02; done > '" + (dir_ / "watch").string() +
                      "' 2>/dev/null & echo $! > '" + (dir_ / "watch.pid").string() + "'";
  ASSERT_EQ(std::system(watch.c_str()), 0);
  ASSERT_EQ(std::system(all.c_str()), 0);
  std::system(("kill $(cat '" + (dir_ / "watch.pid").string() + "') 2>/dev/null").c_str());
  int max_shared = 0;
  {
    std::ifstream w(dir_ / "watch");
    // status --json prints one document per call; count the shared pages it reports.
    const std::string key = "\"kv_pages_shared\":";
    std::stringstream all_text;
    all_text << w.rdbuf();
    const std::string text = all_text.str();
    for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
      max_shared = std::max(max_shared, std::atoi(text.c_str() + at + key.size()));
  }
  for (int i = 0; i < kSharers; ++i) {
    SCOPED_TRACE(i);
    std::ifstream f(dir_ / ("out" + std::to_string(i)));
    const nlohmann::json got = nlohmann::json::parse(f, nullptr, false);
    ASSERT_FALSE(got.is_discarded()) << "request " << i << " failed";
    std::ifstream p(dir_ / ("p" + std::to_string(i)));
    std::stringstream prompt;
    prompt << p.rdbuf();
    EXPECT_EQ(got["ids"], generate(off_, prompt.str(), 64)["ids"]);
  }
  const nlohmann::json e = engine_status(id_);
  EXPECT_EQ(e["kv_prefix"]["hits"].get<int>(), kSharers) << e.dump();
  EXPECT_GE(max_shared, 64) << "the sharers were never seen sharing";
  std::printf("[ prefix ] %d concurrent sharers: up to %d pages shared\n", kSharers, max_shared);
  EXPECT_EQ(e["kv_pages_used"], 0) << e.dump();
  expect_segment_holds_nothing(id_);
}

// `duet chat` sessions that start with the same system prompt: the second one borrows it.
TEST_F(KvPrefixStack, ChatSessionsWithOneSystemPromptShareIt) {
  CliResult up = run_duet("stack up --stack " + id_);
  ASSERT_EQ(up.rc, 0) << up.out;
  const std::string system = "You are a fortune teller. " + words(60, 1);
  std::ofstream(dir_ / "system") << system;
  // One user line on stdin, then EOF: the chat ends and closes its session.
  auto chat_sh = [&](const std::string& line) {
    const std::string cmd = "echo '" + line +
                            "' | timeout 60 '" DUET_BINARY_DIR
                            "/bin/duet' chat --chat-template chatml --stack " +
                            id_ + " --system \"$(cat '" + (dir_ / "system").string() + "')\" 2>&1";
    return std::system(cmd.c_str());
  };
  ASSERT_EQ(chat_sh("Tell me a fortune"), 0);
  ASSERT_EQ(chat_sh("What will happen tomorrow"), 0);
  const nlohmann::json e = engine_status(id_);
  EXPECT_EQ(e["kv_prefix"]["hits"], 1) << e.dump();
  EXPECT_GE(e["kv_prefix"]["hit_tokens"].get<int>(), 48) << e.dump();
  EXPECT_EQ(e["kv_pages_used"], 0) << e.dump();
  expect_segment_holds_nothing(id_);
}

}  // namespace
}  // namespace duet
