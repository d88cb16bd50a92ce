// Bad requests get an Error with a clear code and message, hostile bytes are refused before
// they are read, limits answer busy, and through all of it the frontend keeps serving.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

namespace fbc = fb::client;
using client::GenerateRequest;

// A Generate as raw bytes, with knobs the C++ client would never set wrong.
struct RawGenerate {
  const char* prompt = "Hello";
  int max_tokens = 4;
  float temperature = 0, top_p = 1;
  int top_k = 0;
  uint8_t priority = 0;
  const char* plan = "";
  std::vector<int32_t> ids;
};

std::vector<uint8_t> build(const RawGenerate& g, uint64_t id = 1) {
  flatbuffers::FlatBufferBuilder fbb;
  auto sampling = fbc::CreateSamplingParams(fbb, g.temperature, g.top_k, g.top_p, 0);
  auto body = fbc::CreateGenerateDirect(fbb, g.prompt, g.ids.empty() ? nullptr : &g.ids, sampling,
                                        g.max_tokens, nullptr,
                                        static_cast<fbc::Priority>(g.priority), true, g.plan);
  fbb.Finish(fbc::CreateClientMessage(fbb, id, fbc::ClientBody::Generate, body.Union()),
             fbc::ClientMessageIdentifier());
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

struct Refusal {
  Errc code;
  std::string message;
};

// Sends the bytes and expects an Error back.
Refusal refused(client::Client& c, const std::vector<uint8_t>& bytes) {
  auto reply = c.call_raw(bytes, std::chrono::seconds(5));
  if (!reply) {
    ADD_FAILURE() << "no reply";
    return {Errc::ok, ""};
  }
  const auto* m = msg::verify_client(*reply);
  if (m->body_type() != fbc::ClientBody::Error) {
    ADD_FAILURE() << "expected an Error, got " << fbc::EnumNameClientBody(m->body_type());
    return {Errc::ok, ""};
  }
  return {msg::from_fb_code(static_cast<fb::Code>(m->body_as_Error()->code())),
          m->body_as_Error()->message()->str()};
}

void expect_refused(client::Client& c, const RawGenerate& g, Errc code, const std::string& words) {
  const Refusal r = refused(c, build(g));
  EXPECT_EQ(r.code, code) << r.message;
  EXPECT_NE(r.message.find(words), std::string::npos)
      << "'" << r.message << "' lacks '" << words << "'";
}

TEST_F(FrontendTest, BadGenerateRequestsGetClearErrorsAndServingGoesOn) {
  start();
  auto c = connect();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::string long_prompt;
  for (int i = 0; i < 400; ++i) long_prompt += "fool and money ";
  RawGenerate g;
  g.prompt = long_prompt.c_str();
  expect_refused(*c, g, Errc::out_of_range, "more than the context of 512");
  g = {};
  g.max_tokens = 0;
  expect_refused(*c, g, Errc::invalid_argument, "max_tokens must be > 0");
  g.max_tokens = -5;
  expect_refused(*c, g, Errc::invalid_argument, "max_tokens must be > 0");
  g.max_tokens = 1 << 30;
  expect_refused(*c, g, Errc::out_of_range, "exceeds the context");
  g = {};
  g.temperature = nan;
  expect_refused(*c, g, Errc::invalid_argument, "temperature");
  g.temperature = -1;
  expect_refused(*c, g, Errc::invalid_argument, "temperature");
  g = {};
  for (float p : {0.0f, 1.5f, -0.1f, nan}) {
    g.top_p = p;
    expect_refused(*c, g, Errc::invalid_argument, "top_p");
  }
  g = {};
  g.top_k = -3;
  expect_refused(*c, g, Errc::invalid_argument, "top_k");
  g = {};
  g.prompt = "caf\xc3 \xff\xfe";
  expect_refused(*c, g, Errc::invalid_argument, "not valid UTF-8");
  g.prompt = "\xed\xa0\x80";  // a UTF-16 surrogate written as UTF-8
  expect_refused(*c, g, Errc::invalid_argument, "not valid UTF-8");
  g = {};
  g.priority = 7;
  expect_refused(*c, g, Errc::invalid_argument, "unknown priority");
  g = {};
  g.plan = "warp-drive";
  expect_refused(*c, g, Errc::invalid_argument, "unknown plan 'warp-drive'");
  g.plan = "tensor";
  expect_refused(*c, g, Errc::unsupported, "runs plan 'reference'");
  g = {};
  g.prompt = nullptr;
  expect_refused(*c, g, Errc::invalid_argument, "needs a prompt");
  g.ids = {1, 5000};
  expect_refused(*c, g, Errc::invalid_argument, "outside the vocabulary");
  g.ids = {1, -2};
  expect_refused(*c, g, Errc::invalid_argument, "outside the vocabulary");

  // Still serving, with the right answer.
  GenerateRequest ok;
  ok.prompt = "Hello";
  ok.max_tokens = 6;
  EXPECT_EQ(c->generate(ok).ids, reference_greedy(tiny_tokenizer().encode("Hello", true), 6));
  EXPECT_GE(c->status()["metrics"]["requests"]["rejected"].get<int>(), 18);
}

TEST_F(FrontendTest, GarbageAndHostileBuffersAreRefusedBeforeBeingRead) {
  start();
  auto c = connect();
  std::mt19937 rng(7);
  std::vector<uint8_t> garbage(300);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  EXPECT_EQ(refused(*c, garbage).code, Errc::bad_format);
  EXPECT_EQ(refused(*c, {}).code, Errc::bad_format);

  const std::vector<uint8_t> good = build({});
  // Cut short.
  EXPECT_EQ(refused(*c, std::vector<uint8_t>(good.begin(), good.begin() + good.size() / 2)).code,
            Errc::bad_format);
  // Root offset far outside the buffer.
  auto bad_root = good;
  bad_root[0] = bad_root[1] = bad_root[2] = 0xF0;
  EXPECT_EQ(refused(*c, bad_root).code, Errc::bad_format);
  // A string whose length claims 2 GB.
  std::string marker(64, 'Q');
  RawGenerate g;
  g.prompt = marker.c_str();
  auto huge = build(g);
  auto at = std::search(huge.begin(), huge.end(), marker.begin(), marker.end());
  ASSERT_NE(at, huge.end());
  const uint32_t len = 0x7FFFFFF0;
  std::memcpy(&*(at - 4), &len, 4);
  EXPECT_EQ(refused(*c, huge).code, Errc::bad_format);
  // Every single-byte corruption of a valid request: an error or a normal answer, never
  // silence (each on a fresh connection: one that still verifies may start a generation).
  for (size_t i = 0; i < good.size(); i += 3) {
    auto mutated = good;
    mutated[i] ^= 0x5A;
    client::Client probe(endpoint_);
    auto reply = probe.call_raw(mutated, std::chrono::seconds(5));
    ASSERT_TRUE(reply.has_value()) << "no reply to a corruption at byte " << i;
    EXPECT_NO_THROW(msg::verify_client(*reply)) << "the reply to a corruption at byte " << i;
  }
  // A client may not send server-side bodies.
  flatbuffers::FlatBufferBuilder fbb;
  auto done = fbc::CreateDoneDirect(fbb, 1, "x");
  fbb.Finish(fbc::CreateClientMessage(fbb, 1, fbc::ClientBody::Done, done.Union()),
             fbc::ClientMessageIdentifier());
  const Refusal r = refused(*c, {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()});
  EXPECT_EQ(r.code, Errc::invalid_argument);
  EXPECT_NE(r.message.find("does not accept Done"), std::string::npos) << r.message;

  EXPECT_EQ(connect()->status()["service"], "frontend");
}

TEST_F(FrontendTest, LimitsExceededAnswerBusy) {
  FrontendOptions o;
  o.max_running = 1;
  o.max_queue = 1;
  o.max_sessions = 1;
  start(o, ReferenceEngineOptions{uint64_t{256} << 20, 1});  // one token a step: a runs long
  auto c = connect();
  GenerateRequest slow;
  slow.prompt_ids.assign(400, 300);
  slow.max_tokens = 100;
  const uint64_t a = c->submit(slow);
  wait_status([](const nlohmann::json& j) { return j["running"].size() == 1; });
  const uint64_t b = c->submit(slow);  // waits: the one running slot is taken
  const uint64_t d = c->submit(slow);  // no room in a queue of one
  auto e = c->next_event(std::chrono::seconds(20));
  ASSERT_TRUE(e.has_value());
  ASSERT_EQ(e->kind, client::Event::Kind::error);
  EXPECT_EQ(e->request_id, d);
  EXPECT_EQ(e->code, Errc::busy);
  EXPECT_NE(e->message.find("queue is full"), std::string::npos) << e->message;
  // Both others finish (cancelled, or done before the cancel arrived).
  c->cancel(a);
  c->cancel(b);
  std::set<uint64_t> done;
  while (done.size() < 2) {
    e = c->next_event(std::chrono::seconds(20));
    ASSERT_TRUE(e.has_value());
    if (e->kind == client::Event::Kind::done) done.insert(e->request_id);
  }
  EXPECT_EQ(done, (std::set<uint64_t>{a, b}));

  GenerateRequest chat;
  chat.prompt = "Hi";
  chat.max_tokens = 2;
  chat.session = 1;
  c->generate(chat);
  chat.session = 2;
  try {
    c->generate(chat);
    FAIL() << "a second session fit in a limit of one";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy);
    EXPECT_NE(std::string(e.what()).find("too many chat sessions"), std::string::npos);
  }
}

TEST_F(FrontendTest, KvCacheFullKeepsRequestsQueuedUntilThereIsRoom) {
  FrontendOptions o;
  o.max_running = 8;
  ReferenceEngine probe(tiny_model());
  start(o, ReferenceEngineOptions{probe.kv_bytes_for(40), 64});  // one request's worth
  std::vector<std::vector<int32_t>> got(3);
  std::vector<std::thread> ts;
  for (size_t i = 0; i < 3; ++i)
    ts.emplace_back([&, i] {
      GenerateRequest r;
      r.prompt_ids = {1, static_cast<int32_t>(100 + i)};
      r.max_tokens = 30;
      try {
        got[i] = connect()->generate(r).ids;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(got[i], reference_greedy({1, static_cast<int32_t>(100 + i)}, 30));
}

TEST_F(FrontendTest, ManyClientsThatConnectAndVanishLeaveNothingBehind) {
  start();
  for (int i = 0; i < 200; ++i) {
    client::Client c(endpoint_);
    GenerateRequest r;
    r.prompt = "Beware";
    r.max_tokens = 50;
    r.heartbeat_ms = 0;
    c.submit(r);
  }
  const auto s = wait_status(
      [](const nlohmann::json& j) { return j["running"].empty() && j["queue"]["reactive"] == 0; });
  EXPECT_EQ(s["engine"]["open_seqs"], 0);
  GenerateRequest ok;
  ok.prompt = "Hello";
  ok.max_tokens = 3;
  EXPECT_EQ(connect()->generate(ok).ids.size(),
            reference_greedy(tiny_tokenizer().encode("Hello", true), 3).size());
}

}  // namespace
}  // namespace duet::frontend::testing
