// http_svc on a real stack (`duet stack up --http PORT` on models/fortune-q8_0.gguf): curl
// streams the same tokens as `duet generate`, 32 concurrent streams each get their solo tokens,
// bad input gets its status and OpenAI error, and a kill -9 of http_svc mid-stream is survived:
// restarted, the cut request cancelled (its KV pages free), new requests served; a kill -9 of the
// frontend mid-stream is invisible to curl (issue 22: the stream resumes).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
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

using test_support::parse_sse;
using test_support::sh;
using test_support::Shell;
using test_support::Sse;

class HttpSvcTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    id_ = "http_t_" + std::to_string(getpid() % 100000);
    run_dir_ = default_run_dir(id_);
    port_ = test_support::free_port();
    auto r = run_duet("stack up --stack " + id_ + " --http " + std::to_string(port_));
    ASSERT_EQ(r.rc, 0) << r.out;
    ASSERT_NE(r.out.find("5 services healthy"), std::string::npos) << r.out;
  }
  static void TearDownTestSuite() { test_support::tear_down_stack(id_, run_dir_); }

  static std::string url(const std::string& path) {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // curl: body to stdout, then the status code on a last line of its own.
  static std::pair<int, std::string> curl(const std::string& path, const std::string& body,
                                          const std::string& extra = "") {
    const std::string file = "/tmp/" + id_ + "_body_" + std::to_string(std::rand());
    std::ofstream(file) << body;
    Shell s = sh("curl -sS -N --max-time 120 " + extra + " -w '\\n%{http_code}' --data-binary @" +
                 file + " -H 'Content-Type: application/json' '" + url(path) + "'");
    std::remove(file.c_str());
    const size_t nl = s.out.rfind('\n');
    if (nl == std::string::npos) return {0, s.out};
    return {std::atoi(s.out.c_str() + nl + 1), s.out.substr(0, nl)};
  }
  static json generate_json(const std::string& prompt, int max_tokens) {
    auto r = run_duet("generate --stack " + id_ + " --json --max-tokens " +
                      std::to_string(max_tokens) + " '" + prompt + "'");
    EXPECT_EQ(r.rc, 0) << r.out;
    return json::parse(r.out.substr(r.out.find('{')));
  }
  // The oracle of log-probabilities: the stack's reference plan's logits at every position of
  // ids (`duet eval --plan reference`), as the log-softmax of ids[i] at position i - 1 (entry 0:
  // none, NaN).
  static std::vector<double> reference_logprobs(const std::vector<int32_t>& ids) {
    std::string list;
    for (const int32_t t : ids) list += (list.empty() ? "" : " ") + std::to_string(t);
    const std::string out = "/tmp/" + id_ + "_oracle.f32";
    const auto eval = run_duet("eval --stack " + id_ + " --plan reference --ids '" + list +
                               "' --logits-out " + out);
    EXPECT_EQ(eval.rc, 0) << eval.out;
    std::vector<float> logits;
    {
      std::ifstream f(out, std::ios::binary);
      float x;
      while (f.read(reinterpret_cast<char*>(&x), sizeof(x))) logits.push_back(x);
    }
    std::remove(out.c_str());
    std::vector<double> lp(ids.size(), std::nan(""));
    if (logits.empty() || logits.size() % ids.size() != 0) {
      ADD_FAILURE() << "eval gave " << logits.size() << " logits for " << ids.size() << " ids";
      return lp;
    }
    const size_t n_vocab = logits.size() / ids.size();
    for (size_t i = 1; i < ids.size(); ++i) {
      const float* row = logits.data() + (i - 1) * n_vocab;
      const float top = *std::max_element(row, row + n_vocab);
      double z = 0;
      for (size_t v = 0; v < n_vocab; ++v) z += std::exp(double(row[v]) - top);
      lp[i] = double(row[ids[i]]) - top - std::log(z);
    }
    return lp;
  }
  static std::vector<int32_t> tokenize(const std::string& text) {
    auto [status, body] = curl("/tokenize", json{{"content", text}, {"add_special", true}}.dump());
    EXPECT_EQ(status, 200) << body;
    return status == 200 ? json::parse(body)["tokens"].get<std::vector<int32_t>>()
                         : std::vector<int32_t>{};
  }
  static json frontend_status() {
    client::Client c(client::stack_endpoint(id_));
    return c.status();
  }
  static json service(const std::string& name) {
    auto s = test_support::stack_status(run_dir_);
    if (s)
      for (const auto& svc : (*s)["services"])
        if (svc["name"] == name) return svc;
    return json{{"pid", 0}, {"state", "absent"}};
  }

  static inline std::string id_, run_dir_;
  static inline int port_ = 0;
};

TEST_F(HttpSvcTest, CurlStreamGetsTheSameTokensAsDuetGenerate) {
  const json native = generate_json("Once upon a time", 24);
  auto [status, body] = curl("/v1/completions",
                             R"({"prompt": "Once upon a time", "max_tokens": 24, "stream": true,
                                 "stream_options": {"include_usage": true}})");
  ASSERT_EQ(status, 200) << body;
  const Sse sse = parse_sse(body);
  EXPECT_TRUE(sse.done) << body;
  EXPECT_EQ(sse.text, native["text"].get<std::string>());
  EXPECT_GT(sse.chunks, 1);
  // The usage chunk (choices empty) counts what `duet generate` counted.
  const size_t u = body.rfind("\"usage\":{");
  ASSERT_NE(u, std::string::npos) << body;
  EXPECT_NE(body.find("\"completion_tokens\":" +
                      std::to_string(native["stats"]["generated_tokens"].get<int>())),
            std::string::npos)
      << body;

  auto [s2, whole] = curl("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 24})");
  ASSERT_EQ(s2, 200) << whole;
  EXPECT_EQ(json::parse(whole)["choices"][0]["text"], native["text"]);
}

TEST_F(HttpSvcTest, ChatStreamGetsTheSameTokensAsDuetGenerateChat) {
  auto r = run_duet("generate --stack " + id_ +
                    " --json --max-tokens 20 --chat --chat-template chatml 'Tell me a fortune'");
  ASSERT_EQ(r.rc, 0) << r.out;
  const json native = json::parse(r.out.substr(r.out.find('{')));
  auto [status, body] = curl("/v1/chat/completions",
                             R"({"messages": [{"role": "user", "content": "Tell me a fortune"}],
                                 "chat_template": "chatml", "max_tokens": 20, "stream": true})");
  ASSERT_EQ(status, 200) << body;
  const Sse sse = parse_sse(body);
  EXPECT_TRUE(sse.done);
  EXPECT_EQ(sse.text, native["text"].get<std::string>());
  EXPECT_NE(body.find("\"role\":\"assistant\""), std::string::npos) << body;
}

TEST_F(HttpSvcTest, ThirtyTwoConcurrentStreamsEachGetTheirSoloTokens) {
  const std::vector<std::string> prompts = {"Once upon a time", "The cat", "A bug is",
                                            "Never trust"};
  std::vector<std::string> solo;
  for (const auto& p : prompts) solo.push_back(generate_json(p, 20)["text"]);
  std::vector<std::future<std::pair<int, std::string>>> runs;
  for (int i = 0; i < 32; ++i)
    runs.push_back(std::async(std::launch::async, [&, i] {
      return curl(
          "/v1/completions",
          json{{"prompt", prompts[i % prompts.size()]}, {"max_tokens", 20}, {"stream", true}}
              .dump());
    }));
  for (int i = 0; i < 32; ++i) {
    auto [status, body] = runs[i].get();
    ASSERT_EQ(status, 200) << body;
    const Sse sse = parse_sse(body);
    EXPECT_TRUE(sse.done) << "client " << i;
    EXPECT_EQ(sse.text, solo[i % prompts.size()]) << "client " << i;
  }
}

TEST_F(HttpSvcTest, BadInputGetsItsStatusAndAnOpenAiErrorAndTheStackStaysHealthy) {
  struct Case {
    std::string path, body, extra;
    int status;
    std::string param;
  };
  const std::string big(5 << 20, 'a');
  const std::vector<Case> cases = {
      {"/v1/completions", "{not json", "", 400, ""},
      {"/v1/completions", "[1,2]", "", 400, ""},
      {"/v1/completions", R"({"max_tokens": 4})", "", 400, "prompt"},
      {"/v1/completions", R"({"prompt": "x", "n": 2})", "", 400, "n"},
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", "", 400, "temperature"},
      {"/v1/completions", R"({"prompt": "x", "top_p": 7})", "", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0})", "", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "stop": 5})", "", 400, "stop"},
      {"/v1/completions", R"({"prompt": "x", "priority": "urgent"})", "", 400, "priority"},
      {"/v1/completions", R"({"prompt": "x"})", "-H 'X-Duet-Priority: later'", 400,
       "X-Duet-Priority"},
      {"/v1/completions", R"({"prompt": "x", "logprobs": 21})", "", 400, "logprobs"},
      {"/v1/completions", R"({"prompt": "x", "logprobs": true})", "", 400, "logprobs"},
      {"/v1/completions", R"({"prompt": "x", "echo": true, "stream": true})", "", 400, "echo"},
      {"/v1/completions", R"({"prompt": ["a", "b"], "stream": true})", "", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [[1, 2], []]})", "", 400, "prompt"},
      {"/v1/completions", R"({"prompt": [[]]})", "", 400, "prompt"},
      {"/v1/completions", json{{"prompt", std::vector<std::string>(33, "a")}}.dump(), "", 400,
       "prompt"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 0, "echo": "yes"})", "", 400, "echo"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
         "top_logprobs": 2})",
       "", 400, "top_logprobs"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 100000})", "", 400, ""},
      {"/v1/completions", R"({"prompt": "x", "model": "gpt-4"})", "", 404, "model"},
      {"/v1/nothing", "{}", "", 404, ""},
      {"/v1/completions", big, "", 413, ""},
      {"/tokenize", R"({"content": 5})", "", 400, "content"},
      {"/detokenize", R"({"tokens": [999999]})", "", 400, ""},
  };
  for (const Case& c : cases) {
    auto [status, body] = curl(c.path, c.body, c.extra);
    EXPECT_EQ(status, c.status) << c.path << " " << c.body.substr(0, 80) << " -> " << body;
    json j;
    ASSERT_NO_THROW(j = json::parse(body)) << body;
    ASSERT_TRUE(j.contains("error")) << body;
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param) << body;
    }
  }
  Shell health = sh("curl -s -w '%{http_code}' '" + url("/health") + "'");
  EXPECT_NE(health.out.find("200"), std::string::npos) << health.out;
  auto [ok, body] = curl("/v1/completions", R"({"prompt": "x", "max_tokens": 2})");
  EXPECT_EQ(ok, 200) << body;
}

// `curl -d` sends application/x-www-form-urlencoded unless told otherwise; the body is JSON all
// the same. Past 8 KiB httplib's own reader refused such a body with 413 (its compiled-in cap),
// so a long prompt sent that way failed with a misleading "exceeds the limit of 4194304 bytes".
TEST_F(HttpSvcTest, AJsonBodySentAsFormDataIsReadWhateverItsLength) {
  const std::string prompt_words = [] {
    std::string w;
    for (int i = 0; i < 3000; ++i) w += "men ";  // 12 KB of prompt, ~3000 tokens
    return w;
  }();
  const std::string file = "/tmp/" + id_ + "_form_body";
  std::ofstream(file) << json{{"prompt", prompt_words}, {"max_tokens", 2}}.dump();
  Shell s =
      sh("curl -sS --max-time 60 -w '\\n%{http_code}' --data-binary @" + file +
         " -H 'Content-Type: application/x-www-form-urlencoded' '" + url("/v1/completions") + "'");
  std::remove(file.c_str());
  // Read as JSON: the model's 512 positions are what refuses it, by its token count.
  EXPECT_NE(s.out.find("more than the context of 512"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.substr(s.out.rfind('\n') + 1), "400") << s.out;
  Shell multipart = sh("curl -sS --max-time 60 -w '\\n%{http_code}' -F 'prompt=x' '" +
                       url("/v1/completions") + "'");
  EXPECT_EQ(multipart.out.substr(multipart.out.rfind('\n') + 1), "415") << multipart.out;
}

// Log-probabilities (OpenAI's logprobs): each generated token's under the model's own
// distribution, with the likeliest alternatives; held to the stack's reference forward pass
// (`duet eval --plan reference`: every position's logits) at the same positions.
TEST_F(HttpSvcTest, LogprobsComeWithEveryTokenAndAreTheModelsOwn) {
  const std::string prompt = "The meaning of life is";
  constexpr int kTokens = 6;
  auto [status, body] =
      curl("/v1/completions",
           json{{"prompt", prompt}, {"max_tokens", kTokens}, {"logprobs", 3}, {"ignore_eos", true}}
               .dump());
  ASSERT_EQ(status, 200) << body;
  const json j = json::parse(body);
  const json& choice = j["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), size_t{kTokens}) << body;
  std::string joined;
  for (size_t i = 0; i < kTokens; ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size());  // ASCII here: bytes are code points
    joined += lp["tokens"][i].get<std::string>();
    const float chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0f);
    const json& top = lp["top_logprobs"][i];
    ASSERT_TRUE(top.is_object() && !top.empty() && top.size() <= 3) << top;
    float best = -1e30f;
    for (const auto& [token, logprob] : top.items()) best = std::max(best, logprob.get<float>());
    EXPECT_FLOAT_EQ(best, chosen) << "greedy picks the likeliest token, position " << i;
  }
  EXPECT_EQ(joined, choice["text"].get<std::string>());  // a completion continues its prompt
  EXPECT_EQ(joined.front(), ' ');

  // The same request from the CLI (ids with each logprob), and the oracle at those ids.
  const auto cli = run_duet("generate --stack " + id_ + " --json --logprobs 3 --ignore-eos " +
                            "--max-tokens " + std::to_string(kTokens) + " '" + prompt + "'");
  ASSERT_EQ(cli.rc, 0) << cli.out;
  const json native = json::parse(cli.out.substr(cli.out.find('{')));
  const auto ids = native["ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), size_t{kTokens});
  std::vector<int32_t> all = tokenize(prompt);
  const size_t n_prompt = all.size();
  all.insert(all.end(), ids.begin(), ids.end());
  const std::vector<double> oracle = reference_logprobs(all);
  double worst = 0;
  for (size_t i = 0; i < kTokens; ++i) {
    const json& e = native["logprobs"][i];
    EXPECT_EQ(e["id"], ids[i]);
    EXPECT_EQ(e["top"][0]["id"], ids[i]);
    EXPECT_FLOAT_EQ(e["logprob"].get<float>(), lp["token_logprobs"][i].get<float>());
    const double want = oracle[n_prompt + i];
    EXPECT_NEAR(e["logprob"].get<double>(), want, 0.02) << "position " << i;
    worst = std::max(worst, std::abs(e["logprob"].get<double>() - want));
  }
  std::printf("[ logprobs ] %d tokens: max |logprob - reference's| %.2g nats\n", kTokens, worst);
}

// OpenAI's echo (lm-eval's loglikelihood requests: echo, logprobs, max_tokens 0): every prompt
// token with its log-probability given the ones before it, held to the reference's logits. The
// same prompt ran first, so its whole KV blocks are cached: echo must compute every position
// anyway (no borrowed prefix).
TEST_F(HttpSvcTest, EchoGivesEveryPromptTokensLogprob) {
  const std::string prompt =
      "The meaning of life is a question that many have asked, and the answer that the wise "
      "old man gave to the young fool was that there is no meaning but the one we make";
  auto [s0, warm] = curl("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 3}}.dump());
  ASSERT_EQ(s0, 200) << warm;
  const std::string completion = json::parse(warm)["choices"][0]["text"];
  auto [status, body] =
      curl("/v1/completions",
           json{{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}}.dump());
  ASSERT_EQ(status, 200) << body;
  const json j = json::parse(body);
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(j["choices"][0]["text"], prompt);
  EXPECT_EQ(j["usage"]["completion_tokens"], 0);
  const size_t n = j["usage"]["prompt_tokens"];
  ASSERT_GT(n, 32u);  // two whole KV blocks of 16
  ASSERT_EQ(lp["tokens"].size(), n) << body;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  std::string joined;
  for (const json& t : lp["tokens"]) joined += t.get<std::string>();
  EXPECT_EQ(joined, prompt);

  const std::vector<int32_t> ids = tokenize(prompt);
  ASSERT_EQ(ids.size(), n);
  const std::vector<double> oracle = reference_logprobs(ids);
  double worst = 0;
  for (size_t i = 1; i < n; ++i) {
    const double want = oracle[i];
    const double got = lp["token_logprobs"][i].get<double>();
    EXPECT_NEAR(got, want, 0.02) << "prompt token " << i;
    worst = std::max(worst, std::abs(got - want));
  }
  std::printf("[ echo ] %zu prompt tokens: max |logprob - reference's| %.2g nats\n", n, worst);

  // With tokens to generate, the text goes on from the prompt as it does without echo.
  auto [s2, more] =
      curl("/v1/completions", json{{"prompt", prompt}, {"max_tokens", 3}, {"echo", true}}.dump());
  ASSERT_EQ(s2, 200) << more;
  EXPECT_EQ(json::parse(more)["choices"][0]["text"], prompt + completion);

  // lm-eval's loglikelihood request: a batch of one token-id prompt, echo, max_tokens 1; it
  // reads the prompt's part of token_logprobs (all but the last, the generated token's).
  auto [s3, lm] = curl("/v1/completions", json{{"prompt", json::array({ids})},
                                               {"max_tokens", 1},
                                               {"temperature", 0},
                                               {"echo", true},
                                               {"logprobs", 1}}
                                              .dump());
  ASSERT_EQ(s3, 200) << lm;
  const json lm_body = json::parse(lm);
  const json& lm_lp = lm_body["choices"][0]["logprobs"];
  ASSERT_EQ(lm_lp["token_logprobs"].size(), n + 1) << lm;
  for (size_t i = 1; i < n; ++i)
    EXPECT_FLOAT_EQ(lm_lp["token_logprobs"][i].get<float>(), lp["token_logprobs"][i].get<float>());
}

// Chat, streamed: every token's entry arrives with the chunk that carries its text (or the last
// chunk), and the entries' tokens make up the content.
TEST_F(HttpSvcTest, StreamedChatLogprobsCoverEveryToken) {
  auto [status, body] = curl("/v1/chat/completions", R"({"messages": [{"role": "user",
      "content": "Tell me a fortune"}], "chat_template": "chatml", "max_tokens": 8,
      "ignore_eos": true, "logprobs": true, "top_logprobs": 2, "stream": true,
      "stream_options": {"include_usage": true}})");
  ASSERT_EQ(status, 200) << body;
  const test_support::Sse sse = test_support::parse_sse(body);
  ASSERT_TRUE(sse.done) << body;
  size_t entries = 0, completion_tokens = 0;
  std::string tokens;
  size_t pos = 0;
  while ((pos = body.find("data: {", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const json j = json::parse(body.substr(pos + 6, end - pos - 6));
    pos = end;
    if (j.contains("usage") && j["usage"].is_object())
      completion_tokens = j["usage"]["completion_tokens"];
    if (j["choices"].empty() || j["choices"][0]["logprobs"].is_null()) continue;
    for (const json& e : j["choices"][0]["logprobs"]["content"]) {
      ++entries;
      tokens += e["token"].get<std::string>();
      EXPECT_LE(e["top_logprobs"].size(), 2u);
      EXPECT_EQ(e["bytes"].size(), e["token"].get<std::string>().size());  // ASCII here
    }
  }
  EXPECT_EQ(completion_tokens, 8u) << body;
  EXPECT_EQ(entries, completion_tokens) << body;
  EXPECT_EQ(tokens, sse.text);
}

// A batch of prompts (lm-eval sends its requests so): each a request of its own, run side by
// side; choice i is prompt i's and equals that prompt sent alone. A bad prompt in a batch fails
// the whole with its status, and the others are cancelled, not left running.
TEST_F(HttpSvcTest, ABatchOfPromptsGivesEachItsOwnChoice) {
  const std::vector<std::string> prompts = {"Once upon a time", "The man who", "A fool and"};
  std::vector<std::string> alone;
  for (const std::string& p : prompts) {
    auto [s, b] = curl("/v1/completions", json{{"prompt", p}, {"max_tokens", 6}}.dump());
    ASSERT_EQ(s, 200) << b;
    alone.push_back(json::parse(b)["choices"][0]["text"]);
  }
  const std::vector<int32_t> ids = tokenize(prompts[1]);
  const json batch = json::array({prompts[0], ids, prompts[2]});
  auto [status, body] =
      curl("/v1/completions", json{{"prompt", batch}, {"max_tokens", 6}, {"logprobs", 0}}.dump());
  ASSERT_EQ(status, 200) << body;
  const json j = json::parse(body);
  ASSERT_EQ(j["choices"].size(), prompts.size()) << body;
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], alone[i]) << "prompt " << i;
    EXPECT_EQ(j["choices"][i]["logprobs"]["tokens"].size(), 6u);
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 18);

  const uint64_t cancelled = frontend_status()["metrics"]["requests"]["cancelled"];
  const json bad_batch = json::array({prompts[0], json::array({999999})});
  auto [bad, why] =
      curl("/v1/completions",
           json{{"prompt", bad_batch}, {"max_tokens", 480}, {"ignore_eos", true}}.dump());
  EXPECT_EQ(bad, 400) << why;
  EXPECT_NE(why.find("999999"), std::string::npos) << why;
  // The batch's good request (480 tokens to go) was cancelled, not left to run.
  json st;
  for (int i = 0; i < 100; ++i) {
    st = frontend_status();
    if (st["metrics"]["requests"]["cancelled"].get<uint64_t>() > cancelled) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(st["metrics"]["requests"]["cancelled"].get<uint64_t>(), cancelled + 1) << st.dump();
}

TEST_F(HttpSvcTest, TokenizeAndDetokenizeRoundTrip) {
  auto [s1, t] = curl("/tokenize", R"({"content": "Hello world", "with_pieces": true})");
  ASSERT_EQ(s1, 200) << t;
  const json tokens = json::parse(t)["tokens"];
  ASSERT_FALSE(tokens.empty());
  json ids = json::array();
  std::string pieces;
  for (const auto& x : tokens) {
    ids.push_back(x["id"]);
    pieces += x["piece"].get<std::string>();
  }
  EXPECT_EQ(pieces, "Hello world");
  auto [s2, d] = curl("/detokenize", json{{"tokens", ids}}.dump());
  ASSERT_EQ(s2, 200) << d;
  EXPECT_EQ(json::parse(d)["content"], "Hello world");
}

TEST_F(HttpSvcTest, MetricsAndModelsAnswerInTheirFormats) {
  Shell models = sh("curl -s '" + url("/v1/models") + "'");
  EXPECT_EQ(json::parse(models.out)["data"][0]["id"], "fortune-q8_0") << models.out;
  (void)curl("/v1/completions", R"({"prompt": "Hi", "max_tokens": 3})");
  Shell m = sh("curl -s '" + url("/metrics") + "'");
  for (const char* needle :
       {"# TYPE duet_ttft_seconds histogram", "duet_tpot_seconds_bucket{kind=\"modeled\"",
        "duet_http_requests_total{endpoint=\"completions\",outcome=\"ok\"}",
        "duet_queue_depth{priority=\"proactive\"}", "duet_kv_pages{state=\"free\"}",
        "duet_restarts_seen_total", "duet_service_restarts_total{service=\"http_svc\"}"})
    EXPECT_NE(m.out.find(needle), std::string::npos) << needle << "\n" << m.out;
}

TEST_F(HttpSvcTest, ClientThatDisconnectsMidStreamCancelsItsRequest) {
  const json before = frontend_status()["metrics"]["requests"];
  // curl is killed as soon as the first chunk of a 480-token stream arrives.
  const std::string out = "/tmp/" + id_ + "_gone_stream";
  std::remove(out.c_str());
  Shell bg = sh("curl -sS -N -o " + out +
                " -d '{\"prompt\": \"Once\", \"max_tokens\": 480, \"ignore_eos\": true, "
                "\"stream\": true}' '" +
                url("/v1/completions") + "' >/dev/null 2>&1 & echo $!");
  const int curl_pid = std::atoi(bg.out.c_str());
  ASSERT_GT(curl_pid, 0) << bg.out;
  const auto first = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < first) {
    std::ifstream f(out);
    std::string text((std::istreambuf_iterator<char>(f)), {});
    if (text.find("data: ") != std::string::npos) break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(kill(curl_pid, SIGKILL), 0);
  std::remove(out.c_str());
  json fs;
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < until) {
    fs = frontend_status();
    if (fs["running"].empty() && fs["engine"]["kv_pages_free"] == fs["engine"]["kv_pages_total"])
      break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(fs["running"].empty()) << fs.dump();
  EXPECT_EQ(fs["engine"]["kv_pages_free"], fs["engine"]["kv_pages_total"]);
  EXPECT_EQ(fs["metrics"]["requests"]["cancelled"].get<int>(), before["cancelled"].get<int>() + 1)
      << "http_svc should cancel the request (not wait for the frontend to reap it)";
}

// Last: it kills this suite's http_svc.
TEST_F(HttpSvcTest, KillNineMidStreamRestartsAndCancelsTheCutRequest) {
  const int old_pid = service("http_svc")["pid"];
  ASSERT_GT(old_pid, 0);
  // A long stream, read by curl into a file while the test watches it grow.
  const std::string out = "/tmp/" + id_ + "_cut_stream";
  std::remove(out.c_str());
  auto cut = std::async(std::launch::async, [&] {
    return sh("curl -sS -N --max-time 60 -o " + out +
              " -d '{\"prompt\": \"Once\", \"max_tokens\": 480, \"ignore_eos\": true, "
              "\"stream\": true}' '" +
              url("/v1/completions") + "'");
  });
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(out);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (s.find("data: ") != std::string::npos) break;
    std::this_thread::sleep_for(5ms);
  }
  ASSERT_EQ(frontend_status()["running"].size(), 1u) << "the stream should be running";
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  EXPECT_NE(cut.get().rc, 0) << "curl should see its stream cut";
  std::remove(out.c_str());

  // The supervisor restarts http_svc; the frontend reaps the cut request (no KeepAlives).
  const auto until = std::chrono::steady_clock::now() + 20s;
  json fs;
  while (std::chrono::steady_clock::now() < until) {
    fs = frontend_status();
    const json svc = service("http_svc");
    if (svc["state"] == "healthy" && svc["pid"] != old_pid && fs["running"].empty() &&
        fs["engine"]["kv_pages_free"] == fs["engine"]["kv_pages_total"])
      break;
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_NE(service("http_svc")["pid"], old_pid);
  EXPECT_EQ(service("http_svc")["state"], "healthy");
  EXPECT_TRUE(fs["running"].empty()) << fs.dump();
  EXPECT_EQ(fs["engine"]["kv_pages_free"], fs["engine"]["kv_pages_total"]) << fs["engine"].dump();
  EXPECT_GE(fs["metrics"]["requests"]["reaped"].get<int>() +
                fs["metrics"]["requests"]["cancelled"].get<int>(),
            1);

  auto [status, body] = curl("/v1/completions", R"({"prompt": "Once", "max_tokens": 4})");
  EXPECT_EQ(status, 200) << body;
}

// Issue 22: kill -9 of the frontend mid-stream. http_svc's client (core/ipc/client.h) reconnects to
// the restarted frontend, which adopted the request from its journal, and resumes: curl's SSE
// stream goes on without a break and carries the undisturbed run's text, once.
TEST_F(HttpSvcTest, KillNineOfTheFrontendMidStreamResumesTheSseStream) {
  auto r = run_duet("generate --stack " + id_ + " --json --ignore-eos --max-tokens 480 'Once'");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string want = json::parse(r.out.substr(r.out.find('{')))["text"];
  const int frontend_pid = service("frontend")["pid"];
  ASSERT_GT(frontend_pid, 0);
  const std::string out = "/tmp/" + id_ + "_resumed_stream";
  std::remove(out.c_str());
  auto stream = std::async(std::launch::async, [&] {
    return sh("curl -sS -N --max-time 60 -o " + out +
              " -d '{\"prompt\": \"Once\", \"max_tokens\": 480, \"ignore_eos\": true, "
              "\"stream\": true}' '" +
              url("/v1/completions") + "'");
  });
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream f(out);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (s.find("data: ") != std::string::npos) break;
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(kill(frontend_pid, SIGKILL), 0);
  EXPECT_EQ(stream.get().rc, 0) << "curl's stream was cut";
  std::ifstream f(out);
  const std::string body((std::istreambuf_iterator<char>(f)), {});
  std::remove(out.c_str());
  const Sse sse = parse_sse(body);
  EXPECT_TRUE(sse.done) << body;
  EXPECT_EQ(sse.text, want) << "the resumed stream's text differs from the undisturbed run's";
  const json journal = frontend_status()["journal"];
  EXPECT_EQ(journal["resumed"], 1) << journal.dump();
  // adopted_live 1: the kill came mid-generation; adopted_finished: after its last token (then
  // the Done was what the client resumed).
  std::printf("[http] kill -9 frontend mid-SSE-stream: journal %s\n", journal.dump().c_str());
  EXPECT_NE(service("frontend")["pid"], frontend_pid);
}

}  // namespace
// The supervisor holds http_svc's listening socket and hands it to every http_svc it starts
// (core/ipc/listen_socket.h): a request sent while http_svc is dead waits in the kernel's accept
// queue and the next http_svc serves it. Without that it is refused (curl connects once, no retry).
TEST_F(HttpSvcTest, RequestsSentWhileHttpSvcIsDeadAreServedByTheNextOne) {
  const auto healthy_until = std::chrono::steady_clock::now() + 20s;
  while (service("http_svc")["state"] != "healthy" &&
         std::chrono::steady_clock::now() < healthy_until)
    std::this_thread::sleep_for(20ms);
  const int old_pid = service("http_svc")["pid"];
  ASSERT_GT(old_pid, 0);
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  const auto dead_until = std::chrono::steady_clock::now() + 5s;
  while (process_alive(old_pid) && std::chrono::steady_clock::now() < dead_until)
    std::this_thread::sleep_for(1ms);
  ASSERT_FALSE(process_alive(old_pid));
  std::vector<std::future<std::pair<int, std::string>>> sent;
  for (int i = 0; i < 4; ++i)
    sent.push_back(std::async(std::launch::async, [] {
      return curl("/v1/completions", R"({"prompt": "Once", "max_tokens": 4, "temperature": 0})");
    }));
  for (auto& f : sent) {
    auto [status, body] = f.get();
    EXPECT_EQ(status, 200) << "refused or failed while http_svc restarted: " << body;
    EXPECT_NE(body.find("\"choices\""), std::string::npos) << body;
  }
  EXPECT_NE(service("http_svc")["pid"], old_pid);
}

// A supervisor that adopts a running http_svc takes a copy of its listening socket back
// (pidfd_getfd of fd 3), so the next http_svc restart keeps the port's queue as well.
TEST_F(HttpSvcTest, AnAdoptingSupervisorKeepsTheSocketForTheNextRestart) {
  const auto s = test_support::stack_status(run_dir_);
  ASSERT_TRUE(s.has_value());
  const int supervisor_pid = (*s)["pid"];
  ASSERT_EQ(kill(supervisor_pid, SIGKILL), 0);
  while (process_alive(supervisor_pid)) std::this_thread::sleep_for(1ms);
  const auto up = run_duet("stack up --stack " + id_ + " --http " + std::to_string(port_));
  ASSERT_EQ(up.rc, 0) << up.out;
  ASSERT_NE(up.out.find("adopted 5 running services"), std::string::npos) << up.out;
  std::ifstream log(run_dir_ + "/supervisor.log");
  const std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("took http_svc's listening socket"), std::string::npos) << text;

  const int old_pid = service("http_svc")["pid"];
  ASSERT_EQ(kill(old_pid, SIGKILL), 0);
  while (process_alive(old_pid)) std::this_thread::sleep_for(1ms);
  auto [status, body] =
      curl("/v1/completions", R"({"prompt": "Once", "max_tokens": 4, "temperature": 0})");
  EXPECT_EQ(status, 200) << body;
}

}  // namespace duet
