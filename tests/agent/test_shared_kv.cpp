// Algorithm 2 for real (issue 9): the main and the proactive engine share one KV page pool
// (services/frontend/kv_share.h), so a proactive request prefilled on the preemptible engine
// decodes in the main engine's steps next to reactive requests: its tokens equal a run on one
// engine alone, no KV page moves and no KV byte is copied, a parked step's sequence is refused by
// the other engine, and the pool's segment goes with its last engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <future>
#include <thread>

#include "core/base/error.h"
#include "services/frontend/program_engine.h"
#include "shm/segment.h"
#include "tests/agent/agent_engines.h"
#include "tests/support/local_flags.h"

namespace duet::frontend {
namespace {

using namespace agent_testing;

const std::string kStack = "sharedkv" + std::to_string(getpid());

std::unique_ptr<ProgramEngine> make_engine(const std::string& tag, std::shared_ptr<KvShare> share,
                                           uint32_t max_ctx = 128) {
  // Both devices in every step: both are preempted.
  ProgramEngineOptions o =
      pinned_plan_options(kStack, tag, test_support::activation_split_plan(16), 3, max_ctx);
  o.kv_share = std::move(share);
  if (o.kv_share) o.kv_pages = 2 * o.max_seqs * (max_ctx / o.page_tokens);
  return interpreted_engine(o);
}

bool segment_exists(const std::string& name) {
  try {
    (void)shm::Segment::open(name);
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(SharedKvPool, ProactivePrefillDecodesInTheMainEnginesStepsBitIdenticalWithNoKvCopied) {
  const std::vector<int32_t> prompt = prompt_of(30, 1);
  const int n_new = 8;
  const size_t n_vocab = static_cast<size_t>(LlamaModel::load(model_path())->hp().n_vocab);

  // Undisturbed: prefill and decode on one engine with a KV segment of its own.
  std::vector<int32_t> clean;
  {
    auto solo = make_engine("solo", nullptr);
    solo->open_seq(1, 128);
    std::vector<float> logits = solo->step({{1, prompt, 0, true}}, nullptr);
    for (int k = 0; k < n_new; ++k) {
      clean.push_back(argmax(logits.data(), n_vocab));
      logits = solo->step({{1, {clean.back()}, 30 + k, true}}, nullptr);
    }
  }

  auto share = std::make_shared<KvShare>();
  auto proactive = make_engine("pro", share);
  auto main = make_engine("main", share);
  const std::string pool = ProgramEngine::kv_name(kStack, "shared");
  EXPECT_EQ(proactive->status()["kv_segment"], pool);
  EXPECT_EQ(main->status()["kv_segment"], pool);
  EXPECT_EQ(proactive->kv_share(), main->kv_share());
  EXPECT_FALSE(segment_exists(ProgramEngine::kv_name(kStack, "main"))) << "no KV of its own";
  EXPECT_FALSE(segment_exists(ProgramEngine::kv_name(kStack, "pro"))) << "no KV of its own";

  // The proactive prefill, preempted at op boundaries while a reactive request runs on main.
  main->open_seq(7, 128);
  std::vector<float> reactive_logits = main->step({{7, prompt_of(9, 2), 0, true}}, nullptr);
  int32_t re_pos = 9;
  proactive->open_seq(1, 128);
  // Runs a step on a worker thread, asking for its preemption until it returns.
  auto preempting = [&](std::function<std::optional<std::vector<float>>()> start) {
    std::atomic<bool> done{false};
    auto result = std::async(std::launch::async, [&] {
      auto r = start();
      done = true;
      return r;
    });
    while (!done) {
      proactive->request_preempt();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return result.get();
  };
  std::optional<std::vector<float>> got = preempting([&] {
    return proactive->step_preemptible({{1, prompt, 0, true}}, nullptr);
  });
  const int free_pages = proactive->status()["kv_pages_free"];
  int parks = 0;
  while (!got) {
    ++parks;
    // Its sequence belongs to the parked step: the main engine may neither step nor free it.
    try {
      (void)main->step({{1, {5}, 30, true}}, nullptr);
      ADD_FAILURE() << "the main engine stepped a parked sequence";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::busy) << e.what();
    }
    EXPECT_THROW(main->close_seq(1), Error);
    EXPECT_EQ(main->status()["parked_sequences"], 1);
    reactive_logits =
        main->step({{7, {argmax(reactive_logits.data(), n_vocab)}, re_pos++, true}}, nullptr);
    got = parks < 4 ? preempting([&] { return proactive->resume(nullptr); })
                    : proactive->resume(nullptr);
  }
  EXPECT_EQ(static_cast<int>(main->status()["kv_pages_free"]), free_pages) << "KV pages moved";

  // Decode: the proactive sequence rides in the main engine's steps with the reactive one.
  std::vector<int32_t> rode;
  std::vector<float> pro_logits = *got;
  int32_t re_token = argmax(reactive_logits.data(), n_vocab);
  for (int k = 0; k < n_new; ++k) {
    rode.push_back(argmax(pro_logits.data(), n_vocab));
    StepStats stats;
    const std::vector<float> both =
        main->step({{7, {re_token}, re_pos++, true}, {1, {rode.back()}, 30 + k, true}}, &stats);
    ASSERT_EQ(both.size(), 2 * n_vocab);
    EXPECT_EQ(stats.kv_bytes_copied, 0u);
    re_token = argmax(both.data(), n_vocab);
    pro_logits.assign(both.begin() + static_cast<std::ptrdiff_t>(n_vocab), both.end());
  }
  EXPECT_EQ(rode, clean) << "tokens decoded in the main engine's steps differ from one engine's";
  EXPECT_EQ(proactive->status()["open_sequences"], 2);

  // Either engine frees a sequence of the pool; the pool goes with the last engine.
  main->close_seq(1);
  proactive->close_seq(7);
  EXPECT_EQ(main->status()["open_sequences"], 0);
  EXPECT_EQ(main->status()["kv_pages_free"], main->status()["kv_pages_total"]);
  proactive.reset();
  EXPECT_TRUE(segment_exists(pool)) << "the main engine still uses it";
  main.reset();
  EXPECT_FALSE(segment_exists(pool)) << "the shared KV segment outlived its engines";
  std::printf("proactive prefill parked %d times, decoded %d tokens in shared steps\n", parks,
              n_new);
}

TEST(SharedKvPool, AnEngineOfAnotherGeometryCannotJoinThePool) {
  auto share = std::make_shared<KvShare>();
  auto first = make_engine("geo1", share, 128);
  try {
    auto second = make_engine("geo2", share, 64);
    ADD_FAILURE() << "an engine of another KV geometry joined the pool";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("shared KV pool"), std::string::npos) << e.what();
  }
  // The failed engine removed what it made, and the pool is intact.
  EXPECT_FALSE(segment_exists(ProgramEngine::arena_name(kStack, "geo2")));
  EXPECT_TRUE(segment_exists(ProgramEngine::kv_name(kStack, "shared")));
  first->open_seq(3, 64);
  EXPECT_EQ(first->step({{3, prompt_of(5, 3), 0, true}}, nullptr).size(),
            static_cast<size_t>(first->model().hp().n_vocab));
  first->close_seq(3);
}

}  // namespace
}  // namespace duet::frontend
