// Agent.xpu in the serving loop (issue 9), through the real stack: `duet stack up` (supervisor,
// frontend, gpu_svc, npu_svc, solver_svc as processes). A proactive request runs on the
// frontend's proactive engine; a reactive request arriving during its long prefill preempts it at
// the next op boundary, gets its first token within a bound, and the proactive request then
// resumes where it stopped: its tokens equal an undisturbed run's, no KV byte is copied, and the
// frontend's status counts the preemption. Reactive requests never preempt each other.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "tests/chaos/chaos_fixture.h"

namespace duet::chaos {
namespace {

class AgentServingStack : public ChaosStack {
 protected:
  static client::GenerateRequest request(client::Priority priority, std::vector<int32_t> ids,
                                         int max_tokens) {
    client::GenerateRequest r;
    r.prompt_ids = std::move(ids);
    r.max_tokens = max_tokens;
    r.priority = priority;
    r.ignore_eos = true;  // fixed lengths: the runs compare token for token
    // The tests read submitted requests' events in loops that send no KeepAlive: on a loaded
    // machine a run past 3 s would be reaped as a silent client.
    r.heartbeat_ms = 0;
    return r;
  }
  // A prompt of n ids the tiny model's vocabulary holds (BOS first).
  static std::vector<int32_t> prompt(int n, int salt) {
    std::vector<int32_t> p{1};
    for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 101) % 250);
    return p;
  }
  // A submitted request's Done (its chunks skipped), or its error thrown; a timeout when nothing
  // comes for 120 s.
  static client::GenerateResult done_of(client::Client& c, uint64_t id) {
    for (;;) {
      auto ev = c.next_event(120s);
      if (!ev) throw Error(Errc::timeout, "no reply");
      if (ev->request_id == id && ev->kind == client::Event::Kind::done) return ev->done;
      if (ev->request_id == id && ev->kind == client::Event::Kind::error)
        throw Error(ev->code, ev->message);
    }
  }
  nlohmann::json agent_status() {
    client::Client c(endpoint());
    return c.status()["agent"];
  }
  // Waits until the frontend reports a proactive request half-way through its prefill (some of
  // its prompt done, not all): the moment to send the reactive request.
  bool wait_prefilling(size_t prompt_tokens, std::chrono::milliseconds limit) {
    client::Client c(endpoint());
    const auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      const nlohmann::json st = c.status();
      if (std::getenv("AGENT_TEST_DEBUG")) std::printf("%s\n", st["running"].dump().c_str());
      for (const auto& r : st["running"])
        if (r["priority"] == "proactive" && r["prefilled"].get<size_t>() > 0 &&
            r["prefilled"].get<size_t>() < prompt_tokens)
          return true;
      std::this_thread::sleep_for(1ms);
    }
    return false;
  }
};

TEST_F(AgentServingStack, ReactiveArrivalPreemptsProactivePrefillWhichResumesBitIdentical) {
  // The undisturbed run would publish the prompt's KV and the runs under test borrow it (prefix
  // sharing, issue 20): this test needs prefills that are computed, so none is shared.
  ::setenv("DUET_KV_PREFIX", "off", 1);
  up();
  ::unsetenv("DUET_KV_PREFIX");
  // A long proactive prompt: several prefill steps on the proactive engine (256 tokens each by
  // default, DUET_AGENT_PROACTIVE_STEP_TOKENS).
  const std::vector<int32_t> long_prompt = prompt(448, 1);
  const int pro_tokens = 24;
  client::Client undisturbed(endpoint());
  const client::GenerateResult clean =
      undisturbed.generate(request(client::Priority::proactive, long_prompt, pro_tokens), {}, 120s);
  ASSERT_EQ(clean.ids.size(), size_t(pro_tokens));
  nlohmann::json a0 = agent_status();
  ASSERT_TRUE(a0["proactive_engine"].get<bool>()) << a0.dump();
  ASSERT_TRUE(a0["preemptible"].get<bool>()) << "device links do not support preemption";
  EXPECT_EQ(a0["preemptions"], 0) << "nothing reactive arrived, nothing to preempt";
  // Its step size: the proactive engine's largest token bucket.
  const int step_tokens = a0["engine"]["buckets"].back()["max_tokens"].get<int>();
  EXPECT_GE(a0["proactive_steps"].get<int>(), (448 + step_tokens - 1) / step_tokens);

  // The reactive request alone: its TTFT with no proactive work in the way (after a first
  // reactive request has built the main engine).
  client::Client alone(endpoint());
  (void)alone.generate(request(client::Priority::reactive, prompt(8, 5), 2), {}, 60s);
  const client::GenerateResult re_alone =
      alone.generate(request(client::Priority::reactive, prompt(24, 2), 4), {}, 60s);
  ASSERT_EQ(re_alone.ids.size(), 4u);

  // Disturbed: the reactive request arrives while the proactive prefill runs. If it happens to
  // land between two steps, nothing needs preempting (it simply goes first): try again. The
  // status reply comes between two steps (messages wait while a step runs), so each attempt sends
  // the reactive request a little later into the next one (a step takes a few ms).
  uint64_t preemptions = 0;
  for (int attempt = 0; attempt < 8 && preemptions == 0; ++attempt) {
    client::Client pro(endpoint()), re(endpoint());
    const uint64_t pro_id =
        pro.submit(request(client::Priority::proactive, long_prompt, pro_tokens));
    // Not seeing it half-way (all of it ran between two status polls) only makes this attempt
    // one without a preemption.
    (void)wait_prefilling(long_prompt.size(), 20s);
    std::this_thread::sleep_for(std::chrono::microseconds(500 * attempt));
    const client::GenerateResult fast =
        re.generate(request(client::Priority::reactive, prompt(24, 2), 4), {}, 60s);
    EXPECT_EQ(fast.ids, re_alone.ids) << "the reactive request's tokens";
    // Its first token: the reactive prefill plus at most one op of the proactive step and IPC
    // (generous: a loaded 2-core CI machine), never the rest of a proactive step.
    EXPECT_LT(fast.stats.ttft_ms, re_alone.stats.ttft_ms + 250.0)
        << "alone " << re_alone.stats.ttft_ms << " ms";
    client::GenerateResult resumed;
    for (;;) {
      auto ev = pro.next_event(60s);
      ASSERT_TRUE(ev) << "the proactive request never finished";
      if (ev->request_id != pro_id) continue;
      ASSERT_NE(ev->kind, client::Event::Kind::error) << ev->message;
      if (ev->kind == client::Event::Kind::done) {
        resumed = ev->done;
        break;
      }
    }
    EXPECT_EQ(resumed.ids, clean.ids) << "resumed proactive tokens differ from the undisturbed run";
    EXPECT_EQ(resumed.stats.kv_bytes_copied, 0u);
    const nlohmann::json a = agent_status();
    preemptions = a["preemptions"].get<uint64_t>();
    std::printf("attempt %d: reactive ttft %.1f ms (alone %.1f ms), %s\n", attempt,
                fast.stats.ttft_ms, re_alone.stats.ttft_ms, a.dump().c_str());
    if (preemptions > 0) {
      EXPECT_EQ(a["resumes"], a["preemptions"]) << "every parked step resumed";
      EXPECT_FALSE(a["parked"].get<bool>());
      EXPECT_LT(a["preempt_latency_max_us"].get<double>(), 200000.0) << "one op plus IPC";
      EXPECT_EQ(a["engine"]["open_sequences"], 0) << "the proactive engine freed its KV";
    }
  }
  EXPECT_GT(preemptions, 0u) << "no reactive arrival ever landed inside a proactive step";
}

// Algorithm 2 in the serving loop: the main and the proactive engine share one KV pool, so
// proactive requests that finished their prefill (on the proactive engine) decode in the main
// engine's steps, with the reactive requests while those run: they keep decoding (the frontend
// counts the shared steps, and their tokens arrive while a reactive request is in flight), never
// more than the cap of them in a step with reactive work, their tokens equal undisturbed runs
// and no KV byte is copied.
// The slack rule (DUET_AGENT_RIDER_SLACK) would keep most riders out of reactive steps on this
// CPU backend (a rider costs a step ~1 ms here): the test raises it to inf so that the cap is what
// bounds the riders, as the check below expects. The slack rule itself is covered in
// agent_scheduler_tests with measured step times. Carrying (DUET_AGENT_PROACTIVE_CARRY, off by
// default) is on here: the proactive requests submitted together decode in the proactive prefill
// steps of the others, and their tokens must still equal their undisturbed runs.
TEST_F(AgentServingStack, ProactiveDecodeRidesInReactiveStepsUnderTheCap) {
  ::setenv("DUET_AGENT_RIDER_SLACK", "inf", 1);
  ::setenv("DUET_AGENT_PROACTIVE_CARRY", "on", 1);  // off by default; its tokens are checked here
  // Carrying needs the five prompts (210 tokens) to take several proactive prefill steps: at the
  // default step size (256) they fit in one and nothing is left to carry.
  ::setenv("DUET_AGENT_PROACTIVE_STEP_TOKENS", "64", 1);
  ::setenv("DUET_KV_PREFIX", "off", 1);  // the prompts re-sent after their clean runs prefill again
  up();
  ::unsetenv("DUET_KV_PREFIX");
  ::unsetenv("DUET_AGENT_RIDER_SLACK");
  ::unsetenv("DUET_AGENT_PROACTIVE_CARRY");
  ::unsetenv("DUET_AGENT_PROACTIVE_STEP_TOKENS");
  const int pro_tokens = 80, re_tokens = 16;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(prompt(24 + 9 * i, 20 + i));
  const std::vector<int32_t> re_prompt = prompt(40, 30);
  client::Client c(endpoint());
  std::vector<std::vector<int32_t>> clean;
  for (const auto& p : prompts) {
    const client::GenerateResult r =
        c.generate(request(client::Priority::proactive, p, pro_tokens), {}, 120s);
    ASSERT_EQ(r.ids.size(), size_t(pro_tokens));
    clean.push_back(r.ids);
  }
  const client::GenerateResult re_clean =
      c.generate(request(client::Priority::reactive, re_prompt, re_tokens), {}, 60s);
  const nlohmann::json a0 = agent_status();
  ASSERT_TRUE(a0["riding"].get<bool>()) << "the engines do not share their KV: " << a0.dump();
  EXPECT_GT(a0["ride_tokens"].get<uint64_t>(), 0u) << "proactive decode runs on the main engine";
  EXPECT_EQ(a0["shared_steps"], 0) << "no proactive request ran beside a reactive one yet";

  client::Client pro(endpoint()), re(endpoint());
  std::map<uint64_t, size_t> index;
  for (size_t i = 0; i < prompts.size(); ++i)
    index[pro.submit(request(client::Priority::proactive, prompts[i], pro_tokens))] = i;
  // Every proactive request decoding (its prefill done on the proactive engine).
  {
    client::Client st(endpoint());
    const auto deadline = Clock::now() + 60s;
    for (;;) {
      const nlohmann::json status = st.status();
      ASSERT_LT(Clock::now(), deadline)
          << "the proactive requests never all decoded: " << status.dump();
      size_t decoding = 0;
      for (const auto& r : status["running"])
        if (r["priority"] == "proactive" && r["generated"].get<size_t>() > 0) ++decoding;
      if (decoding == prompts.size()) break;
      std::this_thread::sleep_for(1ms);
    }
  }
  // Reactive requests one after another while they decode; proactive tokens that arrive while
  // a reactive request is in flight were decoded in its steps (the proactive lane is gated).
  std::map<size_t, client::GenerateResult> done;
  size_t tokens_beside_reactive = 0;
  auto take_proactive = [&](std::chrono::milliseconds wait, bool beside) {
    auto ev = pro.next_event(wait);
    if (!ev) return;
    ASSERT_NE(ev->kind, client::Event::Kind::error) << ev->message;
    if (ev->kind == client::Event::Kind::chunk && beside)
      tokens_beside_reactive += ev->chunk.ids.size();
    if (ev->kind == client::Event::Kind::done) done[index.at(ev->request_id)] = ev->done;
  };
  int reactive_sent = 0;
  for (; reactive_sent < 3 && done.empty(); ++reactive_sent) {
    const uint64_t id = re.submit(request(client::Priority::reactive, re_prompt, re_tokens));
    for (const auto deadline = Clock::now() + 60s;;) {
      ASSERT_LT(Clock::now(), deadline)
          << "reactive request " << reactive_sent << " never finished";
      take_proactive(1ms, true);
      auto ev = re.next_event(1ms);
      if (!ev || ev->request_id != id) continue;
      ASSERT_NE(ev->kind, client::Event::Kind::error) << ev->message;
      if (ev->kind != client::Event::Kind::done) continue;
      EXPECT_EQ(ev->done.ids, re_clean.ids) << "the reactive request's tokens";
      break;
    }
  }
  const auto deadline = Clock::now() + 120s;
  while (done.size() < prompts.size() && Clock::now() < deadline) take_proactive(100ms, false);
  ASSERT_EQ(done.size(), prompts.size()) << "proactive requests never finished";
  for (const auto& [i, r] : done) {
    EXPECT_EQ(r.ids, clean[i]) << "proactive request " << i << " differs from its undisturbed run";
    EXPECT_EQ(r.stats.kv_bytes_copied, 0u);
  }
  const nlohmann::json a = agent_status();
  std::printf("proactive tokens beside reactive requests: %zu; %s\n", tokens_beside_reactive,
              a.dump().c_str());
  // More than the one step per proactive request that may have been in flight at each arrival.
  EXPECT_GT(tokens_beside_reactive, prompts.size() * static_cast<size_t>(reactive_sent))
      << "proactive decode stopped while reactive work ran";
  EXPECT_GT(a["shared_steps"].get<uint64_t>(), 0u);
  EXPECT_GT(a["shared_tokens"].get<uint64_t>(), 0u);
  EXPECT_GE(a["max_proactive_in_reactive_step"].get<int>(), 1);
  EXPECT_TRUE(a["rider_slack"].is_null()) << "the stack did not take DUET_AGENT_RIDER_SLACK=inf";
  EXPECT_GT(a["carried_tokens"].get<uint64_t>(), 0u)
      << "no proactive decoder went in another request's proactive prefill step";
  EXPECT_LE(a["max_proactive_in_reactive_step"].get<int>(), a["decode_cap"].get<int>())
      << "more proactive decoders than the cap in a step with reactive work";
  EXPECT_FALSE(a["parked"].get<bool>());
  EXPECT_EQ(a["engine"]["open_sequences"], 0) << "the shared pool freed every sequence";
  EXPECT_EQ(a["engine"]["kv_pages_free"], a["engine"]["kv_pages_total"]);
}

// Overlap (DUET_AGENT_OVERLAP=all, §4.5 ① compute slack) with the proactive engine on the NPU
// (DUET_AGENT_PROACTIVE_PLAN=npu-only, §4.3 ①): a proactive prompt submitted while a reactive
// request decodes is prefilled on the NPU beside the reactive decode steps on the GPU, in another
// thread of the frontend: its prefill makes progress before the reactive request is done (with
// overlap off the lane is gated until then), the reactive request keeps decoding meanwhile, and
// both requests' tokens equal their runs alone on the same stack, with no KV byte copied.
TEST_F(AgentServingStack, OverlappedProactivePrefillProgressesWhileAReactiveRequestDecodes) {
  ::setenv("DUET_AGENT_OVERLAP", "all", 1);
  ::setenv("DUET_AGENT_PROACTIVE_PLAN", "npu-only", 1);
  up();
  ::unsetenv("DUET_AGENT_OVERLAP");
  ::unsetenv("DUET_AGENT_PROACTIVE_PLAN");
  const std::vector<int32_t> pro_prompt = prompt(448, 7), re_prompt = prompt(24, 8);
  const int pro_tokens = 8, re_tokens = 300;
  client::Client c(endpoint());
  const client::GenerateResult pro_clean =
      c.generate(request(client::Priority::proactive, pro_prompt, pro_tokens), {}, 120s);
  const client::GenerateResult re_clean =
      c.generate(request(client::Priority::reactive, re_prompt, re_tokens), {}, 120s);
  ASSERT_EQ(pro_clean.ids.size(), size_t(pro_tokens));
  ASSERT_EQ(re_clean.ids.size(), size_t(re_tokens));
  const nlohmann::json a0 = agent_status();
  ASSERT_EQ(a0["overlap"], "all") << a0.dump();
  ASSERT_EQ(a0["proactive_plan"], "npu-only") << a0.dump();
  ASSERT_TRUE(a0["riding"].get<bool>()) << "overlap needs the shared KV pool: " << a0.dump();

  client::Client re(endpoint()), pro(endpoint()), st(endpoint());
  const uint64_t re_id = re.submit(request(client::Priority::reactive, re_prompt, re_tokens));
  // The reactive request decoding: then the proactive prompt arrives.
  bool reactive_decoding = false;
  for (const auto deadline = Clock::now() + 90s; !reactive_decoding && Clock::now() < deadline;) {
    const nlohmann::json status = st.status();
    if (std::getenv("AGENT_TEST_DEBUG")) std::printf("%s\n", status["running"].dump().c_str());
    for (const auto& r : status["running"])
      if (r["priority"] == "reactive" && r["generated"].get<size_t>() > 0) reactive_decoding = true;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(reactive_decoding) << "the reactive request never started decoding";
  const uint64_t pro_id = pro.submit(request(client::Priority::proactive, pro_prompt, pro_tokens));
  // While the reactive request still runs: the proactive prompt's prefill moves.
  size_t prefilled_beside = 0, reactive_generated = 0;
  bool reactive_seen = false;
  for (const auto deadline = Clock::now() + 60s; Clock::now() < deadline;) {
    bool reactive_running = false;
    size_t prefilled = 0;
    const nlohmann::json status = st.status();
    if (std::getenv("AGENT_TEST_DEBUG")) std::printf("%s\n", status["running"].dump().c_str());
    for (const auto& r : status["running"]) {
      if (r["priority"] == "reactive") {
        reactive_running = true;
        reactive_generated = r["generated"].get<size_t>();
      } else {
        prefilled = r["prefilled"].get<size_t>();
      }
    }
    if (!reactive_running && reactive_seen) break;  // it is done
    reactive_seen = reactive_seen || reactive_running;
    prefilled_beside = std::max(prefilled_beside, prefilled);
    if (prefilled_beside > 0 && reactive_generated < size_t(re_tokens) / 2) break;
    std::this_thread::sleep_for(1ms);
  }
  std::printf(
      "proactive prompt tokens prefilled while the reactive request decoded: %zu of %zu "
      "(reactive at token %zu of %d)\n",
      prefilled_beside, pro_prompt.size(), reactive_generated, re_tokens);
  EXPECT_GT(prefilled_beside, 0u) << "the proactive prefill waited for the reactive request";
  const client::GenerateResult re_done = done_of(re, re_id), pro_done = done_of(pro, pro_id);
  EXPECT_EQ(re_done.ids, re_clean.ids) << "the reactive request's tokens";
  EXPECT_EQ(pro_done.ids, pro_clean.ids) << "the overlapped proactive request's tokens";
  EXPECT_EQ(pro_done.stats.kv_bytes_copied, 0u);
  EXPECT_EQ(re_done.stats.kv_bytes_copied, 0u);
  const nlohmann::json a = agent_status();
  std::printf("%s\n", a.dump().c_str());
  EXPECT_GT(a["proactive_time_ms"]["overlapped"].get<double>(), 0.0);
  EXPECT_FALSE(a["in_flight"].get<bool>());
  EXPECT_FALSE(a["parked"].get<bool>());
  EXPECT_EQ(a["engine"]["open_sequences"], 0) << "the shared pool freed every sequence";
  EXPECT_EQ(a["engine"]["kv_pages_free"], a["engine"]["kv_pages_total"]);
}

TEST_F(AgentServingStack, ReactiveRequestsNeverPreemptEachOtherAndRunFifo) {
  up();
  // The main engine is built by its first request (programs registered, the solver asked): not
  // what the FIFO check measures, so a first request builds it.
  {
    client::Client warm(endpoint());
    (void)warm.generate(request(client::Priority::reactive, prompt(8, 5), 2), {}, 60s);
  }
  client::Client first(endpoint()), second(endpoint()), watcher(endpoint());
  const auto received = [&] {
    return watcher.status()["metrics"]["requests"]["received"].get<uint64_t>();
  };
  const uint64_t received_before = received();
  const auto sent_a = Clock::now();
  const uint64_t a = first.submit(request(client::Priority::reactive, prompt(400, 3), 8));
  // b is sent once the frontend has received a: a fixed 5 ms pause let a loaded
  // host deliver the two in the other order (2026-12-06: b's TTFT 59 ms, a's 77 ms).
  for (const auto deadline = Clock::now() + 10s;
       Clock::now() < deadline && received() == received_before;)
    std::this_thread::sleep_for(1ms);
  const auto sent_b = Clock::now();
  const uint64_t b = second.submit(request(client::Priority::reactive, prompt(300, 4), 8));
  const client::GenerateResult ra = done_of(first, a), rb = done_of(second, b);
  EXPECT_EQ(ra.ids.size(), 8u);
  EXPECT_EQ(rb.ids.size(), 8u);
  // FIFO: the earlier request's prompt is prefilled first, so its first token comes first. A
  // TTFT counts from its own request's arrival, so the first tokens' times are compared on one
  // clock: each send time plus its TTFT (the 5 ms cover the two sends' delivery jitter).
  const double b_after_a_ms = std::chrono::duration<double, std::milli>(sent_b - sent_a).count();
  std::printf("ttft a %.1f ms, b %.1f ms, b sent %.1f ms after a\n", ra.stats.ttft_ms,
              rb.stats.ttft_ms, b_after_a_ms);
  EXPECT_LT(ra.stats.ttft_ms, b_after_a_ms + rb.stats.ttft_ms + 5.0);
  const nlohmann::json s = agent_status();
  EXPECT_EQ(s["preemptions"], 0) << s.dump();
  EXPECT_EQ(s["proactive_steps"], 0) << "reactive requests run on the main engine";
}

}  // namespace
}  // namespace duet::chaos
