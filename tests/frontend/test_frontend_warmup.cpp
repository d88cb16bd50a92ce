// The frontend's Warmup (frontend_warmup.cpp) over its real client socket: one step per token
// bucket on a scratch sequence, outside the metrics, advanced one unit per pump; a request that
// arrives meanwhile ends it and is served as if no warm-up had run.
#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "tests/frontend/frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

using namespace std::chrono_literals;

// The reference engine, its first `slow_steps` steps held for `step_ms` each: the warm-up lasts
// long enough for a request to arrive in the middle of it.
class SlowEngine : public ReferenceEngine {
 public:
  SlowEngine(int step_ms, int slow_steps)
      : ReferenceEngine(tiny_model()), step_ms_(step_ms), slow_steps_(slow_steps) {}
  std::vector<float> step(const std::vector<SeqStep>& batch, StepStats* stats) override {
    if (steps++ < slow_steps_) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms_));
    return ReferenceEngine::step(batch, stats);
  }
  std::atomic<int> steps{0};

 private:
  int step_ms_, slow_steps_;
};

class FrontendWarmup : public FrontendTest {
 protected:
  // A frontend over a SlowEngine; engine_ stays readable from the test's thread.
  void start_slow(int step_ms, int slow_steps = 1 << 30) {
    serve_on_thread([this, step_ms, slow_steps](const std::function<void()>& ready) {
      auto engine = std::make_unique<SlowEngine>(step_ms, slow_steps);
      engine_ = engine.get();
      Frontend fe(std::move(engine), run_dir_);
      ready();
      fe.serve(stop_, std::chrono::milliseconds(5));
    });
  }
  SlowEngine* engine_ = nullptr;
};

TEST_F(FrontendWarmup, RunsEachBucketOnceAndCountsNoRequest) {
  start_slow(0);
  auto c = connect();
  const nlohmann::json w = c->warmup(30s);
  ASSERT_EQ(w["engines"].size(), 1u) << w.dump();
  const nlohmann::json& steps = w["engines"][0]["steps"];
  ASSERT_EQ(steps.size(), 4u) << w.dump();
  EXPECT_EQ(steps[0]["tokens"], 64);
  EXPECT_EQ(steps[1]["tokens"], 16);
  EXPECT_EQ(steps[2]["tokens"], 4);
  EXPECT_EQ(steps[3]["tokens"], 1);
  EXPECT_TRUE(steps[3]["decode"].get<bool>());
  EXPECT_EQ(engine_->steps.load(), 4);
  const nlohmann::json s = c->status();
  EXPECT_EQ(s["warmup"], w);
  EXPECT_EQ(s["metrics"]["requests"]["received"], 0) << s["metrics"].dump();
  EXPECT_EQ(s["metrics"]["steps"], 0) << s["metrics"].dump();
  EXPECT_EQ(s["engine"]["open_seqs"], 0) << s["engine"].dump();
  // A second warm-up runs again (a client may ask after a device restart, say).
  EXPECT_EQ(c->warmup(30s)["engines"][0]["steps"].size(), 4u);
}

TEST_F(FrontendWarmup, ARequestArrivingMidWarmupEndsItAndIsServedAsAlone) {
  start_slow(500, 4);  // the first 4 steps, the warm-up's: 2 s
  auto warmer = connect();
  auto warm = std::async(std::launch::async, [&] { return warmer->warmup(30s); });
  // Once the warm-up is under way (and before it ends), a request.
  wait_status([](const nlohmann::json& s) {
    return s["warmup"].is_object() && s["warmup"].value("running", false);
  });
  auto c = connect();
  client::GenerateRequest req;
  req.prompt = "Once upon a time";
  req.max_tokens = 8;
  const client::GenerateResult r = c->generate(req, {}, 60s);
  const nlohmann::json w = warm.get();
  EXPECT_EQ(w.value("interrupted", ""), "a request arrived") << w.dump();
  EXPECT_EQ(r.ids, reference_greedy(tiny_tokenizer().encode("Once upon a time", true), 8));
  const nlohmann::json s = c->status();
  const int request_steps = s["metrics"]["steps"].get<int>();
  EXPECT_LT(engine_->steps.load() - request_steps, 4)
      << "the warm-up ran all its steps: " << w.dump();
  // The scratch sequence is gone: only the request's was open, and it is closed too.
  EXPECT_EQ(s["engine"]["open_seqs"], 0) << s["engine"].dump();
}

TEST_F(FrontendWarmup, AWarmupWhileARequestRunsIsSkipped) {
  start_slow(50);
  auto c = connect();
  client::GenerateRequest req;
  req.prompt = "Once upon a time";
  req.max_tokens = 40;
  req.ignore_eos = true;
  req.heartbeat_ms = 0;
  const uint64_t id = c->submit(req);
  wait_status([](const nlohmann::json& s) { return !s["running"].empty(); });
  auto other = connect();
  const nlohmann::json w = other->warmup(30s);
  EXPECT_EQ(w.value("skipped", ""), "requests are running") << w.dump();
  c->cancel(id);
}

}  // namespace
}  // namespace duet::frontend::testing
