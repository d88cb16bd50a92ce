// kill -9 during generation through the real stack: a device or solver death costs time, never
// tokens; a frontend death neither (its successor adopts the requests from the request journal
// and the clients resume their streams: issue 22) and leaks nothing; and a bounded chaos run of
// 8 native and 3 HTTP clients under random kills of every process, the supervisor (adopted by the
// next `up`) and http_svc included, loses and fails no request.
#include <fcntl.h>
#include <poll.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <random>
#include <set>

#include "chaos_fixture.h"
#include "http_chaos_client.h"

namespace duet::chaos {
namespace {

class KillMidGeneration : public ChaosStack, public ::testing::WithParamInterface<const char*> {};

// The run: a greedy 200-token generation (ignore_eos) while gpu_svc, then npu_svc, then
// solver_svc (one per run) is killed with SIGKILL once 100 tokens have streamed. The request
// completes with the undisturbed run's tokens; afterwards no sequence, KV page or segment leaks.
TEST_P(KillMidGeneration, DeviceAndSolverKillsKeepTheTokensIdentical) {
  constexpr size_t kKillAfterTokens = kFixedRunTokens / 2;
  up(GetParam());
  // Tokens the frontend's steps carried: a kill must not make it prefill the prompt again.
  auto step_tokens = [&] {
    return client::Client(endpoint()).status()["metrics"]["step_tokens"].get<uint64_t>();
  };
  const uint64_t before_clean = step_tokens();
  const client::GenerateResult clean = generate(kLongPrompt, kFixedRunTokens, true);
  const uint64_t clean_step_tokens = step_tokens() - before_clean;
  ASSERT_EQ(clean.ids.size(), size_t(kFixedRunTokens));
  ASSERT_EQ(clean.stats.finish_reason, "length");
  ASSERT_LT(generate(kLongPrompt, kFixedRunTokens).ids.size(), clean.ids.size())
      << "the prompt must reach EOS, so that the run goes past it";
  const std::set<std::string> segments_before = segments();

  for (const std::string victim : {"gpu_svc", "npu_svc", "solver_svc"}) {
    SCOPED_TRACE(victim);
    const auto [pid, healthy] = service_state(victim);
    ASSERT_TRUE(pid > 0 && healthy);
    const uint64_t before = step_tokens();
    const MarkedRun run =
        run_with_mark(kKillAfterTokens, [pid = pid] { EXPECT_EQ(kill(pid, SIGKILL), 0); });
    const client::GenerateResult& r = run.result;
    ASSERT_TRUE(run.marked.has_value()) << "generation ended before the kill";
    ASSERT_LT(run.received_at_mark, size_t(kFixedRunTokens))
        << "the kill came after the last token";
    ASSERT_FALSE(run.after.empty());
    EXPECT_EQ(r.ids, clean.ids) << "tokens differ after killing " << victim;
    EXPECT_EQ(r.stats.finish_reason, "length");
    EXPECT_EQ(step_tokens() - before, clean_step_tokens)
        << "the frontend stepped more tokens than the undisturbed run: it recomputed some";
    std::printf(
        "[chaos] plan %s: kill -9 %s after token %zu of %d: first token after the stall %.1f ms "
        "after the kill (TPOT %.2f ms; %zu tokens, restarts seen %u)\n",
        GetParam(), victim.c_str(), run.received_at_mark, kFixedRunTokens, run.ms_to_resumed(),
        r.stats.tpot_ms, r.ids.size(), r.stats.restarts_seen);
    ASSERT_TRUE(wait_all_healthy({pid})) << victim << " did not come back";
    expect_no_kv_held();
    EXPECT_EQ(segments(), segments_before) << "segments piled up or vanished after " << victim;
  }
  EXPECT_EQ(generate(kLongPrompt, kFixedRunTokens, true).ids, clean.ids)
      << "a fresh request after the kills";

  // The CLI's --ignore-eos asks for the same fixed-length run.
  const CliResult cli =
      run_duet("generate --stack " + id_ + " --max-tokens " + std::to_string(kFixedRunTokens) +
               " --ignore-eos --json '" + kLongPrompt + "'");
  ASSERT_EQ(cli.rc, 0) << cli.out;
  const nlohmann::json j = nlohmann::json::parse(cli.out.substr(cli.out.find('{')));
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), clean.ids);
  expect_no_kv_held();
  down_and_expect_nothing_left();
}

INSTANTIATE_TEST_SUITE_P(Plans, KillMidGeneration, ::testing::Values("tensor", "npu-only"),
                         plan_case_name);

using FrontendKill = ChaosStack;

// Issue 22: kill -9 of the frontend after token 100 of a 200-token generation, greedy and seeded
// sampled. The supervisor restarts it, it adopts the request from the request journal (its KV
// pages are still in the pool) and the C++ client resumes the stream: all 200 tokens, identical
// to an undisturbed run, every one exactly once (the chunks' ids and text concatenate to the
// result). Then the CLI, killed under the same way, prints the undisturbed text and exits 0.
// Plan npu-only: its ~2.7 ms decode steps keep the frontend mid-generation when the client's
// 100th token arrives (gpu-only's 0.3 ms ones finish all 200 first; that path, a finished
// record resumed for its Done, is the chaos run's).
TEST_F(FrontendKill, AKilledFrontendsRequestsResumeWithEveryTokenOnce) {
  constexpr size_t kKillAfterTokens = kFixedRunTokens / 2;
  up("npu-only");
  (void)generate(kLongPrompt, 8);  // the engine and its segments exist from here on
  const std::set<std::string> segments_before = segments();
  struct Case {
    const char* name;
    SamplingParams sampling;
  };
  const Case cases[] = {{"greedy", {}},
                        {"seeded", {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .seed = 7}}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    client::GenerateRequest req;
    req.prompt = kLongPrompt;
    req.max_tokens = kFixedRunTokens;
    req.ignore_eos = true;
    req.sampling = k.sampling;
    const client::GenerateResult clean = client::Client(endpoint()).generate(req, {}, 60s);
    ASSERT_EQ(clean.ids.size(), size_t(kFixedRunTokens));

    const auto [pid, healthy] = service_state("frontend");
    ASSERT_TRUE(pid > 0 && healthy);
    client::Client c(endpoint());
    std::vector<int32_t> streamed;
    std::string text;
    size_t received_at_kill = 0;
    std::optional<Clock::time_point> killed_at, resumed_at;
    const client::GenerateResult r = c.generate(
        req,
        [&](const client::Chunk& chunk) {
          streamed.insert(streamed.end(), chunk.ids.begin(), chunk.ids.end());
          text += chunk.text;
          if (killed_at && !resumed_at && c.reconnects() > 0) resumed_at = Clock::now();
          if (!killed_at && streamed.size() >= kKillAfterTokens) {
            EXPECT_EQ(kill(pid, SIGKILL), 0);
            killed_at = Clock::now();
            received_at_kill = streamed.size();
          }
          return true;
        },
        60s);
    ASSERT_TRUE(killed_at.has_value());
    ASSERT_LT(received_at_kill, size_t(kFixedRunTokens)) << "the kill came after the last token";
    EXPECT_EQ(r.ids, clean.ids) << "tokens differ after the frontend's restart";
    EXPECT_EQ(streamed, clean.ids) << "a token streamed twice or never";
    EXPECT_EQ(text, clean.text);
    EXPECT_EQ(r.text, clean.text);
    EXPECT_EQ(r.stats.finish_reason, "length");
    EXPECT_GE(c.reconnects(), 1u);
    EXPECT_GE(c.resumes_sent(), 1u);
    // Kill to the first token of the restarted frontend (chunks the killed one had sent still
    // arrive before the client sees the reconnect).
    ASSERT_TRUE(resumed_at.has_value()) << "no token came after the reconnect";
    std::printf(
        "[chaos] %s: kill -9 frontend after token %zu of %d: first token after the restart %.1f "
        "ms after the kill (TPOT %.2f ms; %zu tokens streamed, each once)\n",
        k.name, received_at_kill, kFixedRunTokens, ms_between(*killed_at, *resumed_at),
        r.stats.tpot_ms, streamed.size());
    ASSERT_TRUE(wait_all_healthy({pid})) << "the frontend did not come back";
    const nlohmann::json journal = c.status()["journal"];
    EXPECT_EQ(journal["adopted_live"], 1) << journal.dump();
    EXPECT_EQ(journal["resumed"], 1) << journal.dump();
    expect_no_kv_held();
  }

  // The CLI mid-stream loses its frontend: it resumes and prints the undisturbed text.
  const client::GenerateResult clean = generate(kLongPrompt, kFixedRunTokens, true);
  const auto [frontend_pid, healthy] = service_state("frontend");
  ASSERT_TRUE(frontend_pid > 0 && healthy);
  int out_pipe[2];
  ASSERT_EQ(pipe(out_pipe), 0);
  const pid_t cli = fork();
  ASSERT_GE(cli, 0);
  if (cli == 0) {
    dup2(out_pipe[1], 1);
    close(out_pipe[0]);
    execl(DUET_BINARY_DIR "/bin/duet", "duet", "generate", "--stack", id_.c_str(), "--max-tokens",
          "200", "--ignore-eos", kLongPrompt.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out_pipe[1]);
  std::string out;
  bool killed = false;
  const auto deadline = Clock::now() + 60s;
  for (;;) {
    pollfd p{out_pipe[0], POLLIN, 0};
    if (Clock::now() > deadline) break;
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    const ssize_t n = read(out_pipe[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (!killed && out.size() >= clean.text.size() / 3) {
      ASSERT_EQ(kill(frontend_pid, SIGKILL), 0);
      killed = true;
    }
  }
  close(out_pipe[0]);
  int st = 0;
  if (Clock::now() > deadline) kill(cli, SIGKILL);
  waitpid(cli, &st, 0);
  ASSERT_TRUE(killed);
  ASSERT_TRUE(WIFEXITED(st)) << "the CLI hung after its frontend died: " << out;
  EXPECT_EQ(WEXITSTATUS(st), 0) << out;
  EXPECT_EQ(out, clean.text + "\n") << "the CLI's text differs from the undisturbed run's";

  ASSERT_TRUE(wait_all_healthy({frontend_pid})) << "the frontend did not come back";
  EXPECT_EQ(generate(kLongPrompt).ids, generate(kLongPrompt).ids) << "requests after the restart";
  EXPECT_EQ(segments(), segments_before) << "segments piled up or vanished across the restarts";
  expect_no_kv_held();
  down_and_expect_nothing_left();
}

// A Resume for a request the frontend does not know gets a clear error naming it, at once.
TEST_F(FrontendKill, AResumeOfAnUnknownRequestIsAClearError) {
  up();
  client::Client c(endpoint());
  flatbuffers::FlatBufferBuilder fbb;
  auto body = fb::client::CreateResume(fbb, 4242, 10, 40);
  fbb.Finish(
      fb::client::CreateClientMessage(fbb, 4242, fb::client::ClientBody::Resume, body.Union()),
      fb::client::ClientMessageIdentifier());
  const auto reply =
      c.call_raw(std::span<const uint8_t>(fbb.GetBufferPointer(), fbb.GetSize()), 5s);
  ASSERT_TRUE(reply.has_value()) << "no answer to a Resume";
  const fb::client::ClientMessage* m = msg::verify_client(*reply);
  ASSERT_EQ(m->body_type(), fb::client::ClientBody::Error);
  EXPECT_EQ(msg::from_fb_code(static_cast<fb::Code>(m->body_as_Error()->code())), Errc::not_found);
  EXPECT_NE(m->body_as_Error()->message()->str().find("request 4242"), std::string::npos)
      << m->body_as_Error()->message()->str();
  down_and_expect_nothing_left();
}

using ChaosRun = ChaosStack;

// Eight native clients and three HTTP clients (http_svc, retrying as the OpenAI SDKs do: see
// http_chaos_client.h), random kills of every process of the stack: the supervisor, the
// frontend, the devices, the solver and http_svc. DUET_CHAOS_SECONDS lengthens it (bench/chaos).
TEST_F(ChaosRun, EveryRequestCompletesRightUnderKillsOfEveryProcess) {
  const char* env = std::getenv("DUET_CHAOS_SECONDS");
  const int seconds = env ? std::max(1, std::atoi(env)) : 20;
  const int port = test_support::free_port();
  const std::string http_flag = "--http " + std::to_string(port);
  up("", http_flag);
  const std::vector<std::string> prompts = {kLongPrompt, "Q:", "The", "It is"};
  std::map<std::string, client::GenerateResult> expected;
  for (const auto& p : prompts) expected[p] = generate(p, 120);

  std::atomic<bool> stop{false};
  std::atomic<int> requests{0}, completed{0}, failed{0}, timed_out{0}, lost{0};
  std::atomic<int> http_requests{0}, http_completed{0}, http_failed{0}, http_lost{0};
  std::atomic<int> http_refused{0};  // failed: http_svc not listening through the retries
  std::atomic<int> http_retries_connect{0}, http_resends_cut{0}, http_retries_status{0};
  std::mutex log_mu;
  std::map<std::string, int> errors_by_code;
  std::vector<std::thread> clients;
  for (int t = 0; t < 8; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::unique_ptr<client::Client> c;
      while (!stop) {
        const std::string& p = prompts[rng() % prompts.size()];
        ++requests;
        try {
          if (!c) c = std::make_unique<client::Client>(endpoint());
          client::GenerateRequest req;
          req.prompt = p;
          req.max_tokens = 120;
          const client::GenerateResult r = c->generate(req, {}, 30s);
          if (r.ids == expected[p].ids) {
            ++completed;
          } else {
            ++lost;
            std::lock_guard<std::mutex> lock(log_mu);
            ADD_FAILURE() << "wrong tokens for '" << p << "' (finish " << r.stats.finish_reason
                          << ")";
          }
        } catch (const Error& e) {
          std::lock_guard<std::mutex> lock(log_mu);
          if (std::string(e.what()).empty()) ++lost;
          if (e.code() == Errc::timeout) ++timed_out;
          ++failed;
          if (++errors_by_code[std::string(errc_name(e.code()))] == 1)
            std::printf("[chaos] first %s error: %s\n", std::string(errc_name(e.code())).c_str(),
                        e.what());
          c.reset();  // a fresh connection, as a real client would after an error
        } catch (const std::exception& e) {
          ++lost;
          std::lock_guard<std::mutex> lock(log_mu);
          ADD_FAILURE() << "not a duet::Error: " << e.what();
        }
      }
    });
  }
  // The HTTP clients: the text of a greedy stream is the native client's text for the prompt.
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(100 + t));
      while (!stop) {
        const std::string& p = prompts[rng() % prompts.size()];
        ++http_requests;
        const HttpOutcome r = http_stream_completion(port, p, 120, rng);
        http_retries_connect += r.retries_before_headers;
        http_resends_cut += r.resends_after_cut;
        http_retries_status += r.retries_on_status;
        std::lock_guard<std::mutex> lock(log_mu);
        if (!r.done) {
          ++http_failed;
          http_refused += r.refused;
          if (++errors_by_code["http"] == 1)
            std::printf("[chaos] first http failure: %s\n", r.error.c_str());
        } else if (r.text == expected[p].text) {
          ++http_completed;
        } else {
          ++http_lost;
          ADD_FAILURE() << "wrong text over HTTP for '" << p << "': '" << r.text << "'";
        }
      }
    });
  }
  // The supervisor too: its services run on without it until the next `up` (200-1500 ms later
  // here, an operator's or a unit's restart) adopts them.
  const std::vector<std::string> victims = {"frontend",   "gpu_svc",    "npu_svc",
                                            "solver_svc", "supervisor", "http_svc"};
  std::mt19937 rng(42);
  int kills = 0, adoptions = 0;
  std::map<std::string, int> kills_by_victim;
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500 + rng() % 2500));
    const std::string& victim = victims[rng() % victims.size()];
    if (victim == "supervisor") {
      const auto s = try_status();
      const int pid = s ? (*s)["pid"].get<int>() : 0;
      if (pid <= 0 || kill(pid, SIGKILL) != 0) continue;
      ++kills;
      ++kills_by_victim[victim];
      while (process_alive(pid)) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 1300));
      const CliResult r = run_duet("stack up --stack " + id_ + " " + http_flag);
      EXPECT_EQ(r.rc, 0) << r.out;
      adoptions += r.out.find("adopted") != std::string::npos;
      continue;
    }
    const auto [pid, healthy] = service_state(victim);
    if (pid > 0 && healthy && kill(pid, SIGKILL) == 0) {
      ++kills;
      ++kills_by_victim[victim];
    }
  }
  stop = true;
  for (auto& th : clients) th.join();
  std::string codes, killed;
  for (const auto& [code, n] : errors_by_code) codes += " " + code + "=" + std::to_string(n);
  for (const auto& [victim, n] : kills_by_victim) killed += " " + victim + "=" + std::to_string(n);
  std::printf(
      "[chaos] %d s: requests %d, kills %d (%s; %d adoptions), completed %d, failed with error %d "
      "(timeouts %d;%s), lost %d\n",
      seconds, requests.load(), kills, killed.empty() ? "" : killed.c_str() + 1, adoptions,
      completed.load(), failed.load(), timed_out.load(), codes.c_str(), lost.load());
  std::printf(
      "[chaos] http: requests %d, completed %d, failed %d (%d refused through every retry), lost "
      "%d; retries: %d before the response, %d re-sent after a cut stream, %d on a "
      "408/409/429/5xx\n",
      http_requests.load(), http_completed.load(), http_failed.load(), http_refused.load(),
      http_lost.load(), http_retries_connect.load(), http_resends_cut.load(),
      http_retries_status.load());
  EXPECT_EQ(lost, 0);
  EXPECT_EQ(http_lost, 0);
  // Issue 22: a frontend kill resumes its requests (request journal + client Resume), and every
  // other kill costs time, not requests: nothing fails. An http_svc kill cuts its clients' TCP
  // connections and they send again (the SDKs' two retries); while http_svc restarts, new
  // connections wait in the backlog of the listening socket the supervisor holds for it
  // (core/ipc/listen_socket.h), so none is refused, however slowly http_svc comes back.
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(http_failed, 0);
  EXPECT_GT(completed, 0);
  EXPECT_GT(http_completed, 0);
  EXPECT_EQ(requests, completed + failed + lost);
  EXPECT_EQ(http_requests, http_completed + http_failed + http_lost);
  ASSERT_TRUE(wait_all_healthy({}));
  EXPECT_EQ(generate(kLongPrompt, 120).ids, expected[kLongPrompt].ids) << "after the chaos";
  expect_no_kv_held();
  down_and_expect_nothing_left();
}

}  // namespace
}  // namespace duet::chaos
