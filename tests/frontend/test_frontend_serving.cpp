// The serving path through a real socket: what clients get equals the oracle, alone or sixteen
// at once; streaming, stop strings, cancel, vanished clients, eval, chat sessions, priorities.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

using client::Chunk;
using client::GenerateRequest;

GenerateRequest greedy(std::string prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  return r;
}

TEST_F(FrontendTest, GreedyGenerationEqualsReferenceForwardAndStreamsConcatenate) {
  start();
  auto c = connect();
  const std::string prompt = "The man who";
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  const auto r = c->generate(greedy(prompt, 40), [&](const Chunk& ch) {
    streamed += ch.text;
    streamed_ids.insert(streamed_ids.end(), ch.ids.begin(), ch.ids.end());
    return true;
  });
  const std::vector<int32_t> prompt_ids = tiny_tokenizer().encode(prompt, true);
  const auto expected = reference_greedy(prompt_ids, 40);
  EXPECT_EQ(r.ids, expected);
  // The text continues the prompt: prompt + text is the decoded whole (its leading space kept).
  std::vector<int32_t> whole = prompt_ids;
  whole.insert(whole.end(), expected.begin(), expected.end());
  EXPECT_EQ(prompt + r.text, tiny_tokenizer().decode(whole));
  EXPECT_EQ(streamed, r.text);
  EXPECT_EQ(streamed_ids, r.ids);
  EXPECT_EQ(r.stats.prompt_tokens, tiny_tokenizer().encode(prompt, true).size());
  EXPECT_EQ(r.stats.generated_tokens, expected.size());
  EXPECT_EQ(r.stats.finish_reason, expected.size() == 40 ? "length" : "eos");
  EXPECT_EQ(r.stats.plan, "reference");
  EXPECT_GT(r.stats.ttft_ms, 0);
  EXPECT_EQ(r.stats.kv_bytes_copied, 0u);

  // Without streaming: no chunks, the same Done.
  GenerateRequest quiet = greedy(prompt, 40);
  quiet.stream = false;
  int chunks = 0;
  const auto q = c->generate(quiet, [&](const Chunk&) { return ++chunks, true; });
  EXPECT_EQ(chunks, 0);
  EXPECT_EQ(q.ids, r.ids);
  EXPECT_EQ(q.text, r.text);
}

TEST_F(FrontendTest, PromptIdsAreUsedAsGiven) {
  start();
  auto c = connect();
  GenerateRequest req;
  req.prompt_ids = {1, 703, 1975};
  req.max_tokens = 16;
  EXPECT_EQ(c->generate(req).ids, reference_greedy(req.prompt_ids, 16));
}

TEST_F(FrontendTest, SixteenConcurrentClientsEachGetWhatTheyWouldGetAlone) {
  FrontendOptions o;
  o.max_running = 16;
  start(o, ReferenceEngineOptions{uint64_t{256} << 20, 32});  // small steps: many share each
  const std::vector<std::string> words = {
      "Love",   "A fool", "Never", "Time",  "The cat", "Why", "Money", "If you",
      "Beware", "Life",   "Every", "To be", "Do not",  "Man", "She",   "When the"};
  std::vector<std::vector<int32_t>> got(16);
  std::vector<std::string> errors(16);
  std::vector<std::thread> clients;
  for (size_t i = 0; i < 16; ++i)
    clients.emplace_back([&, i] {
      try {
        auto c = connect();
        got[i] = c->generate(greedy(words[i], 12 + int(i))).ids;
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(errors[i], "") << "client " << i;
    EXPECT_EQ(got[i], reference_greedy(tiny_tokenizer().encode(words[i], true), 12 + int(i)))
        << "client " << i << " (" << words[i] << ")";
  }
  const auto s = connect()->status();
  EXPECT_EQ(s["metrics"]["requests"]["completed"], 16);
  EXPECT_EQ(s["engine"]["kv_bytes_in_use"], 0);
}

TEST_F(FrontendTest, StopStringCutsTheTextAndIsNeverStreamed) {
  start();
  auto c = connect();
  const auto full = c->generate(greedy("The man who", 40));
  ASSERT_GT(full.text.size(), 12u);
  const std::string stop = full.text.substr(8, 3);
  GenerateRequest req = greedy("The man who", 40);
  req.stop = {stop, "no such text anywhere"};
  std::string streamed;
  const auto r = c->generate(req, [&](const Chunk& ch) { return streamed += ch.text, true; });
  EXPECT_EQ(r.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_EQ(r.stats.finish_reason, "stop");
  EXPECT_EQ(streamed, r.text);
}

TEST_F(FrontendTest, CancelFreesTheKvAtOnce) {
  start();
  auto c = connect();
  int chunks = 0;
  // Returning false from the chunk callback cancels the request.
  const auto r = c->generate(greedy("Never", 400), [&](const Chunk&) { return ++chunks < 3; });
  EXPECT_EQ(r.stats.finish_reason, "cancelled");
  EXPECT_LT(r.ids.size(), 400u);
  const auto s = c->status();  // answered after the cancel: the KV is already gone
  EXPECT_EQ(s["engine"]["kv_bytes_in_use"], 0);
  EXPECT_EQ(s["engine"]["open_seqs"], 0);
  EXPECT_EQ(s["metrics"]["requests"]["cancelled"], 1);
  c->cancel(12345);  // nothing by that id: an Error naming it comes back
  const auto e = c->next_event(std::chrono::seconds(5));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->kind, client::Event::Kind::error);
  EXPECT_EQ(e->code, Errc::not_found);
  EXPECT_EQ(e->request_id, 12345u);
}

// A long generation: hot sampling keeps it away from EOS (deterministic for the seed).
GenerateRequest long_generation() {
  GenerateRequest r;
  r.prompt = "Life";
  r.max_tokens = 480;
  r.sampling.temperature = 3;
  r.sampling.seed = 3;  // 480 tokens without an EOS (duet generate --local agrees)
  return r;
}

TEST_F(FrontendTest, ClientThatVanishesMidStreamIsReaped) {
  start();
  {
    auto c = connect();
    GenerateRequest req = long_generation();
    req.heartbeat_ms = 0;  // only the failed send can tell
    const uint64_t id = c->submit(req);
    auto e = c->next_event(std::chrono::seconds(5));
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->request_id, id);
    EXPECT_EQ(e->kind, client::Event::Kind::chunk);
  }  // the socket closes here
  const auto s = wait_status([](const nlohmann::json& j) {
    return j["metrics"]["requests"]["reaped"] == 1 && j["running"].empty();
  });
  EXPECT_EQ(s["engine"]["kv_bytes_in_use"], 0);
  EXPECT_EQ(s["metrics"]["requests"]["completed"], 0);
}

TEST_F(FrontendTest, SilentClientWithoutKeepAlivesIsReaped) {
  start({}, ReferenceEngineOptions{uint64_t{256} << 20, 1});  // a slow prefill: one token a step
  auto c = connect();
  GenerateRequest req;
  req.prompt_ids.assign(500, 300);
  req.max_tokens = 4;
  req.stream = false;
  req.heartbeat_ms = 20;
  const uint64_t id = c->submit(req);  // and never a KeepAlive: the client is alive but silent
  const auto s = wait_status([](const nlohmann::json& j) {
    return j["metrics"]["requests"]["reaped"] == 1 && j["engine"]["open_seqs"] == 0;
  });
  EXPECT_EQ(s["metrics"]["requests"]["completed"], 0);
  // Still listening, the client hears why (a loop waiting for its Done would otherwise hang).
  const auto e = c->next_event(std::chrono::seconds(5));
  ASSERT_TRUE(e.has_value()) << "the reaped request's client got no word";
  EXPECT_EQ(e->request_id, id);
  ASSERT_EQ(e->kind, client::Event::Kind::error);
  EXPECT_EQ(e->code, Errc::timeout);
  EXPECT_NE(e->message.find("no KeepAlive"), std::string::npos) << e->message;
  // The same request with its KeepAlives (the client sends them while it waits) completes. A
  // roomier period: a client thread held off the CPU for 80 ms (3 periods + 20 ms) on a loaded
  // machine would be reaped too.
  req.heartbeat_ms = 500;
  EXPECT_EQ(c->generate(req).ids, reference_greedy(req.prompt_ids, 4));
}

TEST_F(FrontendTest, EvalGivesEveryPositionsLogits) {
  start();
  auto c = connect();
  const std::vector<int32_t> ids = {1, 703, 1975, 9, 300, 12};
  const auto r = c->eval(ids, "reference", kModelPath);
  ASSERT_EQ(r.n_tokens, ids.size());
  ASSERT_EQ(r.n_vocab, 2048u);
  ReferenceForward f(tiny_model());
  EXPECT_EQ(r.logits, f.forward(ids, true));
  try {
    c->eval(ids, "", DUET_SOURCE_DIR "/tests/data/tiny-fortune/fortune-q4_0.gguf");
    FAIL() << "eval accepted a model the stack does not serve";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("is not this stack's model"), std::string::npos);
  }
}

TEST_F(FrontendTest, ChatSessionKeepsTheKvBetweenTurns) {
  start();
  auto c = connect();
  GenerateRequest turn = greedy("A fool", 8);
  turn.session = 77;
  const auto first = c->generate(turn);
  turn.prompt = " and his money";
  const auto second = c->generate(turn);
  // The oracle: one sequence that never forgets; turn two appends the last sampled token of turn
  // one, then its own text (no BOS).
  const Tokenizer& tok = tiny_tokenizer();
  std::vector<int32_t> history = tok.encode("A fool", true);
  ReferenceForward f(tiny_model());
  auto logits = f.forward(history, false);
  Sampler g(SamplingParams{});
  std::vector<int32_t> one, two;
  int32_t t = 0;
  for (int i = 0; i < 8; ++i) {
    t = g.sample(logits);
    ASSERT_NE(t, tok.eos());
    one.push_back(t);
    if (i < 7) logits = f.forward(std::vector<int32_t>{t}, false);
  }
  std::vector<int32_t> next = {t};
  const auto words = tok.encode(" and his money", false);
  next.insert(next.end(), words.begin(), words.end());
  logits = f.forward(next, false);
  for (int i = 0; i < 8; ++i) {
    t = g.sample(logits);
    if (t == tok.eos()) break;
    two.push_back(t);
    logits = f.forward(std::vector<int32_t>{t}, false);
  }
  EXPECT_EQ(first.ids, one);
  EXPECT_EQ(second.ids, two);
  EXPECT_EQ(c->status()["sessions"], 1);
  c->close_session(77);
  const auto s = c->status();
  EXPECT_EQ(s["sessions"], 0);
  EXPECT_EQ(s["engine"]["kv_bytes_in_use"], 0);
}

TEST_F(FrontendTest, ReactiveRequestsOvertakeQueuedProactiveOnes) {
  FrontendOptions o;
  o.max_running = 1;
  start(o, ReferenceEngineOptions{uint64_t{256} << 20, 4});
  // A long eval holds the only running slot while the other two queue.
  std::vector<int32_t> ids(400, 300);
  ids[0] = 1;
  std::thread long_eval([&] {
    try {
      EXPECT_EQ(connect()->eval(ids).n_tokens, ids.size());
    } catch (const std::exception& e) {
      ADD_FAILURE() << "eval: " << e.what();
    }
  });
  wait_status([](const nlohmann::json& j) { return j["running"].size() == 1; });
  auto c = connect();
  GenerateRequest background = greedy("Money", 4), urgent = greedy("Why", 4);
  background.priority = client::Priority::proactive;
  const uint64_t bg = c->submit(background);
  const uint64_t rx = c->submit(urgent);
  std::vector<uint64_t> done_order;
  while (done_order.size() < 2) {
    auto e = c->next_event(std::chrono::seconds(20));
    ASSERT_TRUE(e.has_value());
    ASSERT_NE(e->kind, client::Event::Kind::error) << e->message;
    if (e->kind == client::Event::Kind::done) done_order.push_back(e->request_id);
  }
  long_eval.join();
  EXPECT_EQ(done_order, (std::vector<uint64_t>{rx, bg}));
}

}  // namespace
}  // namespace duet::frontend::testing
