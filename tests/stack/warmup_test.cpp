// The warm-up at `duet stack up` (services/frontend/frontend_warmup.cpp): once the stack is
// healthy its engines are built and run one step per token bucket on a scratch sequence, so the
// first request does not pay for them; none of it shows in the request metrics or the trace
// ring, and it holds no KV page. `--no-warmup` leaves the build to the first request, a restart
// of the frontend or a device service warms up again, and a warm-up while requests run is
// skipped.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "core/ipc/client.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

using namespace std::chrono_literals;
using test_support::CliResult;
using test_support::run_duet;

class WarmupStack : public test_support::StackFixture {
 protected:
  WarmupStack() : StackFixture("wu_", 14) {}
  CliResult up(const std::string& extra = "") {
    CliResult r = run_duet("stack up --timeout 120 --stack " + id_ + " " + extra);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r;
  }
  nlohmann::json frontend_status() {
    const CliResult r = run_duet("status --json --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(j.is_object() && j.contains("frontend")) << r.out;
    return j.is_object() ? j.value("frontend", nlohmann::json::object()) : nlohmann::json{};
  }
  CliResult generate() {
    return run_duet("generate --stack " + id_ + " --max-tokens 6 --ignore-eos 'Once upon a'",
                    "timeout 120");
  }
};

TEST_F(WarmupStack, UpRunsEveryBucketOnceOutsideTheMetricsHoldingNoKvPage) {
  const CliResult r = up();
  EXPECT_NE(r.out.find("warmed up in"), std::string::npos) << r.out;

  const nlohmann::json f = frontend_status();
  const nlohmann::json& w = f["warmup"];
  ASSERT_TRUE(w.contains("engines")) << w.dump();
  const nlohmann::json& main = w["engines"][0];
  EXPECT_EQ(main["engine"], "main");
  // One step per token bucket (64, 16, 4), then a decode.
  ASSERT_EQ(main["steps"].size(), 4u) << main.dump();
  const int tokens[] = {64, 16, 4, 1};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(main["steps"][i]["tokens"], tokens[i]) << main.dump();
    EXPECT_EQ(main["steps"][i]["decode"], i == 3) << main.dump();
  }
  // The engine is built (its programs registered), and the scratch sequence left nothing behind
  // but evictable cached blocks: no request counted, no page used or promised.
  const nlohmann::json& engine = f["engine"];
  ASSERT_TRUE(engine.contains("registration")) << engine.dump();
  EXPECT_EQ(f["metrics"]["requests"]["received"], 0) << f["metrics"].dump();
  EXPECT_EQ(f["metrics"]["steps"], 0) << f["metrics"].dump();
  EXPECT_EQ(engine["kv_pages_used"], 0) << engine.dump();
  EXPECT_EQ(engine["kv_pages_promised"], 0) << engine.dump();
  // Cached blocks count as free: evictable whenever a request needs the page.
  EXPECT_EQ(engine["kv_pages_free"], engine["kv_pages_total"]) << engine.dump();
  EXPECT_EQ(engine["open_sequences"], 0) << engine.dump();
  const CliResult trace = run_duet("trace --stack " + id_ + " --last --out /dev/null");
  EXPECT_NE(trace.rc, 0) << "the warm-up's steps are not a request's: " << trace.out;

  // The first request runs on the engine the warm-up built.
  const nlohmann::json registration = engine["registration"];
  const CliResult g = generate();
  ASSERT_EQ(g.rc, 0) << g.out;
  const nlohmann::json after = frontend_status();
  EXPECT_EQ(after["engine"]["registration"], registration) << after["engine"].dump();
  EXPECT_EQ(after["metrics"]["requests"]["completed"], 1) << after["metrics"].dump();
}

// A restarted gpu_svc holds none of the engine's programs until a step registers them again: the
// restart warms the engine up once more, so the new gpu_svc has run steps before any request.
TEST_F(WarmupStack, RestartingADeviceServiceWarmsTheEnginesUpAgain) {
  up();
  const CliResult r = run_duet("stack restart --timeout 60 --stack " + id_ + " gpu_svc");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("warmed up in"), std::string::npos) << r.out;
  const CliResult st = run_duet("status --json --stack " + id_);
  ASSERT_EQ(st.rc, 0) << st.out;
  const nlohmann::json j = nlohmann::json::parse(st.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << st.out;
  EXPECT_GT(j["devices"]["gpu_svc"].value("steps", 0), 0) << j["devices"].dump();
  EXPECT_EQ(j["frontend"]["metrics"]["requests"]["received"], 0);
  // solver_svc holds no engine: nothing to warm.
  const CliResult solver = run_duet("stack restart --timeout 60 --stack " + id_ + " solver_svc");
  ASSERT_EQ(solver.rc, 0) << solver.out;
  EXPECT_EQ(solver.out.find("warmed up"), std::string::npos) << solver.out;
  const CliResult g = generate();
  EXPECT_EQ(g.rc, 0) << g.out;
}

TEST_F(WarmupStack, NoWarmupLeavesTheBuildToTheFirstRequest) {
  const CliResult r = up("--no-warmup");
  EXPECT_EQ(r.out.find("warmed up"), std::string::npos) << r.out;
  const nlohmann::json f = frontend_status();
  EXPECT_TRUE(f["warmup"].is_null()) << f["warmup"].dump();
  EXPECT_FALSE(f["engine"].contains("registration")) << f["engine"].dump();
  EXPECT_NE(f["engine"].value("engine", "").find("not built yet"), std::string::npos)
      << f["engine"].dump();
  // A restart of a stack that runs without the warm-up does not warm it either.
  const CliResult restart = run_duet("stack restart --timeout 60 --stack " + id_ + " frontend");
  ASSERT_EQ(restart.rc, 0) << restart.out;
  EXPECT_EQ(restart.out.find("warmed up"), std::string::npos) << restart.out;
  const CliResult g = generate();
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_TRUE(frontend_status()["engine"].contains("registration"));
}

TEST_F(WarmupStack, AWarmupWhileARequestRunsIsSkippedAndAnUnknownModelRefused) {
  up("--no-warmup");
  client::Client c(client::stack_endpoint(id_));
  client::GenerateRequest req;
  req.prompt = "Once upon a time";
  req.max_tokens = 480;  // long enough to outlast the second client's warm-up call
  req.ignore_eos = true;
  req.heartbeat_ms = 0;
  const uint64_t id = c.submit(req);
  // The request is in flight once its first chunk arrives.
  for (;;) {
    const auto e = c.next_event(60s);
    ASSERT_TRUE(e) << "no event within 60 s";
    ASSERT_NE(e->kind, client::Event::Kind::error) << e->message;
    ASSERT_NE(e->kind, client::Event::Kind::done) << "done before the warm-up was sent";
    if (e->request_id == id && e->kind == client::Event::Kind::chunk) break;
  }
  client::Client other(client::stack_endpoint(id_));
  const nlohmann::json w = other.warmup(60s);
  EXPECT_EQ(w.value("skipped", ""), "requests are running") << w.dump();
  c.cancel(id);

  other.set_model("no-such-model");
  try {
    other.warmup(10s);
    ADD_FAILURE() << "a warm-up of an unknown model was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace duet
