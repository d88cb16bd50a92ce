// Two models behind one ModelRouter (model_router.h), in process: tiny-fortune twice on
// ReferenceEngines, "hi" ranked before "lo" with an aging so slow that lo steps only when hi has
// no work. A model waiting for its turn still keeps its deadlines: lo's request whose client
// stops its KeepAlives is reaped while hi's long request runs, because the router reads and reaps
// every model on every turn and only the step waits. Once hi is done, lo's work runs, with the
// tokens it has alone.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "core/base/error.h"
#include "services/frontend/model_router.h"
#include "tests/frontend/frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class ModelRouterTest : public FrontendTest {
 protected:
  void SetUp() override {
    serve_on_thread([this](const std::function<void()>& ready) {
      ModelRouter router(run_dir_);
      for (const char* name : {"lo", "hi"})
        router.add(std::make_unique<Frontend>(std::make_unique<ReferenceEngine>(tiny_model()),
                                              run_dir_, router.options_for({}, name)));
      router.set_priorities({1, 0}, 1 << 20);
      ready();
      while (!stop_.load()) {
        if (router.pump()) continue;
        zmq::pollitem_t item{static_cast<void*>(router.socket()), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, 5ms);
      }
    });
  }
};

TEST_F(ModelRouterTest, AModelWaitingForItsTurnKeepsItsDeadlinesAndRunsOnceTheOtherIsDone) {
  const std::string prompt = "Once upon a time";
  client::Client busy(endpoint_), silent(endpoint_), later(endpoint_);
  client::GenerateRequest long_hi;
  long_hi.model = "hi";
  long_hi.prompt = prompt;
  long_hi.max_tokens = 400;
  long_hi.ignore_eos = true;
  long_hi.heartbeat_ms = 0;
  const uint64_t hi_id = busy.submit(long_hi);
  // hi is running before lo's requests arrive: from here on lo has a step to run and waits.
  const auto first = busy.next_event(10s);
  ASSERT_TRUE(first && first->kind == client::Event::Kind::chunk) << "hi did not start";

  client::GenerateRequest lo = long_hi;
  lo.model = "lo";
  lo.max_tokens = 8;
  lo.ignore_eos = false;  // as reference_greedy, which stops at EOS
  lo.heartbeat_ms = 10;   // and `silent` never sends a KeepAlive
  (void)silent.submit(lo);
  lo.heartbeat_ms = 0;
  const uint64_t later_id = later.submit(lo);

  std::optional<Clock::time_point> reaped, hi_done, later_done;
  std::vector<int32_t> later_ids;
  const auto deadline = Clock::now() + 60s;
  while ((!reaped || !hi_done || !later_done) && Clock::now() < deadline) {
    if (!reaped)
      if (const auto e = silent.next_event(1ms); e && e->kind == client::Event::Kind::error) {
        EXPECT_EQ(e->code, Errc::timeout) << e->message;
        EXPECT_NE(e->message.find("no KeepAlive"), std::string::npos) << e->message;
        reaped = Clock::now();
      }
    if (!hi_done)
      while (const auto e = busy.next_event(1ms))
        if (e->kind == client::Event::Kind::done && e->request_id == hi_id) hi_done = Clock::now();
    if (!later_done)
      while (const auto e = later.next_event(1ms))
        if (e->kind == client::Event::Kind::done && e->request_id == later_id) {
          later_done = Clock::now();
          later_ids = e->done.ids;
        }
  }
  ASSERT_TRUE(reaped && hi_done && later_done) << "not every request ended within 60 s";
  EXPECT_LT(*reaped, *hi_done) << "lo's silent client was reaped only after hi's work was done";
  EXPECT_GT(*later_done, *hi_done) << "lo stepped while hi, ranked first, had work";
  EXPECT_EQ(later_ids, reference_greedy(tiny_tokenizer().encode(prompt, true), 8));
}

}  // namespace
}  // namespace duet::frontend::testing
