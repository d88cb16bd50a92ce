// http_svc's gates on a real stack started with `--api-key-file` and DUET_MAX_QUEUE=1: a missing
// or wrong bearer key gets 401, a full frontend queue gets 429 (and the stack serves again once it
// drains), and the priority of the body field and of the X-Duet-Priority header is the one the
// frontend runs the request with.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/ipc/client.h"
#include "tests/http_svc/http_test_support.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using test_support::run_duet;
using test_support::sh;
using Clock = std::chrono::steady_clock;

constexpr const char* kKey = "sk-duet-test-5f1c9a";

class HttpSvcLimitsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    id_ = "http_l_" + std::to_string(getpid() % 100000);
    run_dir_ = default_run_dir(id_);
    key_file_ = "/tmp/" + id_ + "_key";
    std::ofstream(key_file_) << "  " << kKey << "  \nsecond line is ignored\n";
    port_ = test_support::free_port();
    auto r = run_duet("stack up --stack " + id_ + " --http " + std::to_string(port_) +
                          " --api-key-file " + key_file_,
                      "DUET_MAX_QUEUE=1");
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  static void TearDownTestSuite() {
    test_support::tear_down_stack(id_, run_dir_);
    std::remove(key_file_.c_str());
  }

  static std::string url(const std::string& path) {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  static std::string auth() { return std::string("-H 'Authorization: Bearer ") + kKey + "'"; }
  // curl with `extra` options: the status and the body.
  static std::pair<int, std::string> curl(const std::string& path, const std::string& body,
                                          const std::string& extra) {
    const std::string file = "/tmp/" + id_ + "_body";
    std::ofstream(file) << body;
    auto s = sh("curl -sS --max-time 60 " + extra + " -w '\\n%{http_code}' " +
                (body.empty() ? "" : "--data-binary @" + file) + " '" + url(path) + "'");
    std::remove(file.c_str());
    const size_t nl = s.out.rfind('\n');
    if (nl == std::string::npos) return {0, s.out};
    return {std::atoi(s.out.c_str() + nl + 1), s.out.substr(0, nl)};
  }
  static json frontend_status() {
    client::Client c(client::stack_endpoint(id_));
    return c.status();
  }
  // The frontend's status once nothing runs or waits and every KV page is free (10 s at most).
  static json wait_idle() {
    json fs;
    const auto until = Clock::now() + 10s;
    while (Clock::now() < until) {
      fs = frontend_status();
      if (fs["running"].empty() && fs["queue"]["reactive"] == 0 && fs["queue"]["proactive"] == 0 &&
          fs["engine"]["kv_pages_free"] == fs["engine"]["kv_pages_total"])
        break;
      std::this_thread::sleep_for(20ms);
    }
    return fs;
  }

  static inline std::string id_, run_dir_, key_file_;
  static inline int port_ = 0;
};

TEST_F(HttpSvcLimitsTest, AMissingOrWrongBearerKeyGets401) {
  const std::string body = R"({"prompt": "Once", "max_tokens": 2})";
  struct Case {
    std::string header, message;
  };
  for (const Case& c : {Case{"", "missing"}, Case{"-H 'Authorization: Bearer wrong'", "invalid"},
                        Case{std::string("-H 'Authorization: Bearer ") + kKey + "x'", "invalid"},
                        Case{std::string("-H 'Authorization: Basic ") + kKey + "'", "invalid"}}) {
    auto [status, reply] = curl("/v1/completions", body, c.header);
    EXPECT_EQ(status, 401) << c.header << " -> " << reply;
    const json j = json::parse(reply);
    EXPECT_EQ(j["error"]["type"], "authentication_error") << reply;
    EXPECT_EQ(j["error"]["code"], "invalid_api_key") << reply;
    EXPECT_NE(j["error"]["message"].get<std::string>().find(c.message), std::string::npos) << reply;
  }
  EXPECT_EQ(curl("/v1/models", "", "").first, 401);
  EXPECT_EQ(curl("/metrics", "", "").first, 401);
  // /health stays open to load balancers; the key opens everything else.
  EXPECT_EQ(curl("/health", "", "").first, 200);
  EXPECT_EQ(curl("/v1/models", "", auth()).first, 200);
  auto [ok, reply] = curl("/v1/completions", body, auth());
  EXPECT_EQ(ok, 200) << reply;
}

TEST_F(HttpSvcLimitsTest, AFullQueueGets429AndTheStackServesOnceItDrains) {
  const json limits = frontend_status()["limits"];
  ASSERT_EQ(limits["max_queue"], 1) << "the stack should have been started with DUET_MAX_QUEUE=1";
  const int max_running = limits["max_running"];
  // Fill the batch and the queue with long requests of a native client, one at a time so none
  // is refused while an earlier one still waits for admission.
  client::Client native(client::stack_endpoint(id_));
  client::GenerateRequest long_request;
  long_request.prompt = "Once";
  long_request.max_tokens = 480;
  long_request.ignore_eos = true;
  long_request.heartbeat_ms = 0;
  long_request.stream = false;
  std::vector<uint64_t> ids;
  auto full = [](const json& fs, int running) {
    return int(fs["running"].size()) == running && fs["queue"]["reactive"] == 1;
  };
  int got_429 = 0;
  std::string refused;
  // A running request may end between the check and the HTTP request; then a new one refills.
  for (int attempt = 0; attempt < 5 && got_429 == 0; ++attempt) {
    json fs;
    const auto until = Clock::now() + 20s;
    while (Clock::now() < until) {
      fs = native.status();
      if (full(fs, max_running)) break;
      if (int(fs["running"].size()) + int(fs["queue"]["reactive"]) < max_running + 1)
        ids.push_back(native.submit(long_request));
      std::this_thread::sleep_for(2ms);
    }
    ASSERT_TRUE(full(fs, max_running)) << fs.dump();
    auto [status, body] =
        curl("/v1/completions", R"({"prompt": "Once", "max_tokens": 2, "stream": true})",
             auth() + " -H 'Content-Type: application/json'");
    const json after = native.status();
    if (status == 429) {
      ++got_429;
      refused = body;
    } else {
      EXPECT_FALSE(full(after, max_running))
          << "the queue was full before and after, yet HTTP " << status << ": " << body;
    }
  }
  ASSERT_EQ(got_429, 1) << "no 429 in 5 attempts";
  const json j = json::parse(refused);
  EXPECT_EQ(j["error"]["type"], "rate_limit_error") << refused;
  EXPECT_EQ(j["error"]["code"], "queue_full") << refused;
  EXPECT_NE(j["error"]["message"].get<std::string>().find("queue is full"), std::string::npos);

  for (uint64_t id : ids) native.cancel(id);
  const json idle = wait_idle();
  EXPECT_TRUE(idle["running"].empty()) << idle.dump();
  EXPECT_EQ(idle["engine"]["kv_pages_free"], idle["engine"]["kv_pages_total"]);
  auto [ok, body] = curl("/v1/completions", R"({"prompt": "Once", "max_tokens": 2})", auth());
  EXPECT_EQ(ok, 200) << body;
}

TEST_F(HttpSvcLimitsTest, PriorityFieldAndHeaderReachTheFrontend) {
  struct Case {
    std::string body_field, header, want;
  };
  const std::vector<Case> cases = {
      {"", "", "reactive"},
      {R"("priority": "proactive",)", "", "proactive"},
      {"", "-H 'X-Duet-Priority: proactive'", "proactive"},
      {R"("priority": "reactive",)", "-H 'X-Duet-Priority: proactive'", "reactive"},
  };
  for (const Case& c : cases) {
    // A long stream read by curl in the background; its request is watched in the frontend's
    // status, then curl is killed (http_svc cancels the request).
    const std::string out = "/tmp/" + id_ + "_prio_stream";
    std::remove(out.c_str());
    const auto bg =
        sh("curl -sS -N -o " + out + " " + auth() + " " + c.header + " -d '{" + c.body_field +
           R"( "prompt": "Once", "max_tokens": 480, "ignore_eos": true, )"
           R"("stream": true}' ')" +
           url("/v1/completions") + "' >/dev/null 2>&1 & echo $!");
    const int curl_pid = std::atoi(bg.out.c_str());
    ASSERT_GT(curl_pid, 0) << bg.out;
    json running;
    const auto until = Clock::now() + 30s;
    while (Clock::now() < until && running.empty()) {
      running = frontend_status()["running"];
      std::this_thread::sleep_for(2ms);
    }
    kill(curl_pid, SIGKILL);
    std::remove(out.c_str());
    ASSERT_EQ(running.size(), 1u) << c.body_field << " " << c.header << ": " << running.dump();
    EXPECT_EQ(running[0]["priority"], c.want) << c.body_field << " " << c.header;
    const json idle = wait_idle();
    EXPECT_TRUE(idle["running"].empty()) << idle.dump();
  }
  const json fs = frontend_status();
  EXPECT_EQ(fs["engine"]["kv_pages_free"], fs["engine"]["kv_pages_total"]);
}

}  // namespace
}  // namespace duet
