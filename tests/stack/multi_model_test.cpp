// Several models in one stack (issue 25): tiny-fortune (llama, SentencePiece) and mkmodel's tiny
// qwen2 (byte-level BPE, q/k/v biases, NEOX rope: another architecture and shape) served at once
// by `stack up --model fortune=A --model qwen=B`. Requests of both, submitted interleaved and
// running concurrently, give each model's tokens as that model's own one-model stack gives them;
// a model name the stack does not serve is refused with that name and the served ones (client
// API: not_found; HTTP: 404 model_not_found) and the stack serves on. Models' ranks
// (`--model-priority`) order their contending steps, the better rank first, none starved;
// `duet trace --model-name` follows any model's requests.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/ipc/client.h"
#include "core/ipc/run_dir.h"
#include "tests/http_svc/http_test_support.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::CliResult;
using test_support::run_duet;

const std::string kFortune =
    std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/fortune-q8_0.gguf";

// One request: which model ("" = the stack's default), its prompt and sampling.
struct Ask {
  std::string model;
  std::string prompt;
  SamplingParams sampling;
};

class MultiModelStack : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("duet-multi-model-" + std::to_string(::getpid())));
    qwen_ = new std::string(test_support::make_tiny_qwen2(*dir_));
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
    delete qwen_;
  }
  void SetUp() override { id_ = test_support::unique_stack_id("mm_", 12); }
  void TearDown() override { down(); }

  // `models`: the --model flags. The tensor plan (the solver's split for the SoC) is the same
  // plan in every stack, so a model's tokens do not depend on a host measurement.
  // Returns `stack up`'s output.
  std::string up(const std::string& models, const std::string& extra = "") {
    const CliResult r = run_duet("stack up --timeout 120 --plan tensor --stack " + id_ + " " +
                                 models + " " + extra);
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.out;
  }
  void down() { test_support::tear_down_stack(id_, default_run_dir(id_)); }
  std::string two_models() const {
    return "--model fortune='" + kFortune + "' --model qwen='" + *qwen_ + "'";
  }

  // How run_together's requests ended: the asks' indices in the order their Done came, and each
  // ask's latency (its submit to its Done, ms).
  struct Completion {
    std::vector<size_t> order;
    std::vector<double> latency_ms;
  };

  // Every ask submitted before any is read (so they are in flight together and their steps
  // interleave), each one's generated ids in order.
  std::vector<std::vector<int32_t>> run_together(const std::vector<Ask>& asks,
                                                 Completion* completion = nullptr) {
    client::Client c(client::stack_endpoint(id_));
    std::map<uint64_t, size_t> index;
    std::vector<std::chrono::steady_clock::time_point> submitted;
    for (size_t i = 0; i < asks.size(); ++i) {
      client::GenerateRequest req;
      req.model = asks[i].model;
      req.prompt = asks[i].prompt;
      req.sampling = asks[i].sampling;
      req.max_tokens = 24;
      req.ignore_eos = true;
      req.heartbeat_ms = 0;  // this loop sends no KeepAlives
      submitted.push_back(std::chrono::steady_clock::now());
      index[c.submit(req)] = i;
    }
    if (completion) *completion = {{}, std::vector<double>(asks.size(), 0.0)};
    std::vector<std::vector<int32_t>> ids(asks.size());
    size_t done = 0;
    while (done < asks.size()) {
      const auto e = c.next_event(60s);
      if (!e) {
        ADD_FAILURE() << "no event within 60 s; " << done << " of " << asks.size() << " done";
        break;
      }
      if (e->kind == client::Event::Kind::error) {
        ADD_FAILURE() << "request " << e->request_id << ": " << e->message;
        ++done;
      } else if (e->kind == client::Event::Kind::done) {
        const size_t i = index.at(e->request_id);
        ids.at(i) = e->done.ids;
        ++done;
        if (!completion) continue;
        completion->order.push_back(i);
        completion->latency_ms[i] = std::chrono::duration<double, std::milli>(
                                        std::chrono::steady_clock::now() - submitted[i])
                                        .count();
      }
    }
    return ids;
  }

  static fs::path* dir_;
  static std::string* qwen_;
  std::string id_;
};
fs::path* MultiModelStack::dir_ = nullptr;
std::string* MultiModelStack::qwen_ = nullptr;

const SamplingParams kSeeded{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 11};

TEST_F(MultiModelStack, EachModelsTokensEqualItsOwnStacksUnderInterleavedRequests) {
  const std::vector<std::string> prompts = {"Once upon a time", "The fortune says", "Q: Why"};
  // Each model alone, in a stack of its own (requests name no model: the only one).
  std::map<std::string, std::vector<std::vector<int32_t>>> alone;
  for (const auto& [name, path] :
       {std::pair{std::string("fortune"), kFortune}, std::pair{std::string("qwen"), *qwen_}}) {
    SCOPED_TRACE(name + " alone");
    up("--model '" + path + "'");
    std::vector<Ask> asks;
    for (const std::string& p : prompts) asks.push_back({"", p, {}});
    asks.push_back({"", prompts[0], kSeeded});
    alone[name] = run_together(asks);
    down();
  }
  ASSERT_NE(alone["fortune"][0], alone["qwen"][0]) << "the two models must differ to tell apart";

  // `stack up` warms every model's engines up, each by its name.
  const std::string out = up(two_models());
  EXPECT_NE(out.find("fortune: warmed up in"), std::string::npos) << out;
  EXPECT_NE(out.find("qwen: warmed up in"), std::string::npos) << out;
  // Both at once: every request of one model between two of the other.
  std::vector<Ask> asks;
  for (size_t i = 0; i <= prompts.size(); ++i)
    for (const std::string model : {"fortune", "qwen"})
      asks.push_back(
          {model, prompts[i % prompts.size()], i == prompts.size() ? kSeeded : SamplingParams{}});
  const auto together = run_together(asks);
  for (size_t i = 0; i < asks.size(); ++i)
    EXPECT_EQ(together[i], alone[asks[i].model][i / 2])
        << asks[i].model << " '" << asks[i].prompt << "' differs from its one-model stack";

  // The default model is the first; the CLI picks one by name.
  const CliResult cli =
      run_duet("generate --stack " + id_ +
               " --model-name qwen --max-tokens 24 --ignore-eos --json '" + prompts[0] + "'");
  ASSERT_EQ(cli.rc, 0) << cli.out;
  const nlohmann::json j = nlohmann::json::parse(cli.out.substr(cli.out.rfind("\n{") + 1));
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), alone["qwen"][0]);
  EXPECT_EQ(run_together({{"", prompts[1], {}}})[0], alone["fortune"][1]);

  // Per-model status: each model's own requests, plan, engine and KV pool.
  const nlohmann::json st = client::Client(client::stack_endpoint(id_)).status();
  ASSERT_TRUE(st.contains("models")) << st.dump();
  EXPECT_EQ(st["default_model"], "fortune");
  EXPECT_EQ(st["models"]["fortune"]["metrics"]["requests"]["completed"], 5);
  EXPECT_EQ(st["models"]["qwen"]["metrics"]["requests"]["completed"], 5);
  EXPECT_EQ(st["models"]["qwen"]["model"], "qwen");
  const nlohmann::json& fortune_kv = st["models"]["fortune"]["engine"];
  const nlohmann::json& qwen_kv = st["models"]["qwen"]["engine"];
  EXPECT_NE(fortune_kv.value("kv_page_bytes", 0.0), qwen_kv.value("kv_page_bytes", 0.0))
      << "each model's pool has its own page layout";
  // Equal ranks (no --model-priority) take turns: while both had work, neither stepped more than
  // one step more than the other.
  const nlohmann::json& fortune_turns = st["models"]["fortune"]["turns"];
  const nlohmann::json& qwen_turns = st["models"]["qwen"]["turns"];
  EXPECT_GT(fortune_turns["contended_steps"].get<int>(), 0) << st.dump();
  EXPECT_LE(std::abs(fortune_turns["contended_steps"].get<int>() -
                     qwen_turns["contended_steps"].get<int>()),
            1)
      << fortune_turns.dump() << " " << qwen_turns.dump();
  // `duet trace --model-name`: each model's frontend answers for its own last request, whose
  // steps it finds among the device services' op spans of its own programs.
  for (const std::string model : {"fortune", "qwen"}) {
    const std::string out = (*dir_ / (model + "-trace.json")).string();
    const CliResult t =
        run_duet("trace --stack " + id_ + " --model-name " + model + " --last --out " + out);
    ASSERT_EQ(t.rc, 0) << t.out;
    const nlohmann::json o = nlohmann::json::parse(std::ifstream(out)).at("otherData");
    EXPECT_EQ(o["model"], model);
    EXPECT_EQ(o["request"], st["models"][model]["trace"]["last_request_kept"]) << o.dump();
    EXPECT_GT(o["steps"].get<int>(), 0) << o.dump();
    EXPECT_GT(o["op_spans"].get<int>(), 0) << model << ": no device spans matched " << o.dump();
  }
  const CliResult no_trace = run_duet("trace --stack " + id_ + " --model-name nope --last --out " +
                                      (*dir_ / "nope.json").string());
  EXPECT_NE(no_trace.rc, 0);
  EXPECT_NE(no_trace.out.find("unknown model 'nope'"), std::string::npos) << no_trace.out;

  const CliResult status = run_duet("status --stack " + id_);
  EXPECT_EQ(status.rc, 0) << status.out;
  EXPECT_NE(status.out.find(" model fortune\n"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find(" model qwen\n"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("  turns: rank 0, "), std::string::npos) << status.out;
}

// Puzzle's third chromosome executed by the stack: two models (one file twice, so both have one
// reference), "lo" the default and listed first, "hi" given the better rank. Their requests are
// submitted interleaved, lo's first, and run concurrently. Where both had a step to run, hi took
// most of them (aging gives lo one turn per 8 of hi's: the default DUET_MODEL_PRIORITY_AGING), so
// hi's requests finish first and sooner; lo is not starved (it stepped while hi was busy, never
// waiting longer than the bound); and every request's tokens are the model's alone. Counting
// steps and completion ranks, not times, keeps this true on a loaded host.
TEST_F(MultiModelStack, AModelOfBetterRankStepsFirstAndTheOtherIsNotStarved) {
  const std::vector<std::string> prompts = {"Once upon a time", "The fortune says", "Q: Why",
                                            "A little"};
  up("--model '" + kFortune + "'");
  std::vector<Ask> asks;
  for (const std::string& p : prompts) asks.push_back({"", p, {}});
  const auto alone = run_together(asks);
  down();

  up("--model lo='" + kFortune + "' --model hi='" + kFortune + "' --model-priority lo=1",
     "--model-priority hi=0");
  asks.clear();
  for (const std::string& p : prompts)
    for (const std::string model : {"lo", "hi"}) asks.push_back({model, p, {}});
  Completion done;
  const auto together = run_together(asks, &done);
  ASSERT_EQ(done.order.size(), asks.size());
  for (size_t i = 0; i < asks.size(); ++i)
    EXPECT_EQ(together[i], alone[i / 2]) << asks[i].model << " '" << asks[i].prompt << "'";

  const nlohmann::json st = client::Client(client::stack_endpoint(id_)).status();
  const nlohmann::json& hi = st["models"]["hi"]["turns"];
  const nlohmann::json& lo = st["models"]["lo"]["turns"];
  EXPECT_EQ(hi["rank"], 0);
  EXPECT_EQ(lo["rank"], 1);
  EXPECT_GE(hi["contended_steps"].get<int>(), 4 * lo["contended_steps"].get<int>())
      << "hi: " << hi.dump() << " lo: " << lo.dump();
  EXPECT_GE(lo["contended_steps"].get<int>(), 1) << "lo starved while hi ran: " << lo.dump();
  EXPECT_LE(lo["max_wait_steps"].get<int>(), lo["wait_bound_steps"].get<int>()) << lo.dump();
  EXPECT_EQ(lo["wait_bound_steps"], 1 * 8 + 1);

  // hi's requests finish first (mean completion rank) and sooner (mean latency).
  double rank[2] = {0, 0}, latency[2] = {0, 0};
  for (size_t k = 0; k < done.order.size(); ++k) {
    const size_t i = done.order[k];
    const int is_hi = asks[i].model == "hi" ? 1 : 0;
    rank[is_hi] += double(k) / double(prompts.size());
    latency[is_hi] += done.latency_ms[i] / double(prompts.size());
  }
  EXPECT_LT(rank[1], rank[0]) << "mean completion rank, hi vs lo";
  EXPECT_LT(latency[1], latency[0]) << "mean latency ms, hi vs lo";
  std::printf(
      "mean completion rank hi %.2f lo %.2f; mean latency hi %.1f ms lo %.1f ms; turns hi %s "
      "lo %s\n",
      rank[1], rank[0], latency[1], latency[0], hi.dump().c_str(), lo.dump().c_str());

  // A rank for a model the stack does not serve, or not a rank, stops `stack up`.
  const CliResult bad = run_duet("stack up --stack " + id_ + "x --model a='" + kFortune +
                                 "' --model b='" + kFortune + "' --model-priority c=1");
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("unknown model 'c'"), std::string::npos) << bad.out;
  const CliResult not_rank = run_duet("stack up --stack " + id_ + "x --model a='" + kFortune +
                                      "' --model b='" + kFortune + "' --model-priority a=high");
  EXPECT_NE(not_rank.rc, 0);
  EXPECT_NE(not_rank.out.find("whole number in [0, 1000]"), std::string::npos) << not_rank.out;
  test_support::tear_down_stack(id_ + "x", default_run_dir(id_ + "x"));  // had either started
}

TEST_F(MultiModelStack, AnUnknownModelIsRefusedByNameAndTheStackServesOn) {
  const int port = test_support::free_port();
  up(two_models(), "--http " + std::to_string(port));
  client::Client c(client::stack_endpoint(id_));
  client::GenerateRequest req;
  req.prompt = "Once upon a time";
  req.max_tokens = 8;
  req.model = "nope";
  try {
    (void)c.generate(req, {}, 30s);
    FAIL() << "a model the stack does not serve was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("unknown model 'nope'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fortune, qwen"), std::string::npos) << e.what();
  }
  c.set_model("nope");
  EXPECT_THROW((void)c.tokenize("hi", false), Error);
  c.set_model("qwen");
  const auto qwen_ids = c.tokenize("hello world", false).ids;
  c.set_model("");
  EXPECT_NE(c.tokenize("hello world", false).ids, qwen_ids) << "each model has its tokenizer";
  const CliResult cli =
      run_duet("generate --stack " + id_ + " --model-name nope --max-tokens 4 hi");
  EXPECT_NE(cli.rc, 0);
  EXPECT_NE(cli.out.find("unknown model 'nope'"), std::string::npos) << cli.out;

  // HTTP: /v1/models lists both; an unknown "model" is OpenAI's 404 model_not_found.
  const std::string base = "http://127.0.0.1:" + std::to_string(port);
  auto post = [&](const std::string& body) {
    return test_support::sh(
        "curl -s -w '\\n%{http_code}' -H 'Content-Type: application/json' "
        "-d '" +
        body + "' " + base + "/v1/completions");
  };
  const nlohmann::json models =
      nlohmann::json::parse(test_support::sh("curl -s " + base + "/v1/models").out);
  ASSERT_EQ(models["data"].size(), 2u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "fortune");
  EXPECT_EQ(models["data"][1]["id"], "qwen");
  const auto missing = post(R"({"model": "nope", "prompt": "Hi", "max_tokens": 3})");
  EXPECT_NE(missing.out.find("\n404"), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find("model_not_found"), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find("nope"), std::string::npos) << missing.out;
  const auto qwen = post(R"({"model": "qwen", "prompt": "Once upon a time", "max_tokens": 8})");
  ASSERT_NE(qwen.out.find("\n200"), std::string::npos) << qwen.out;
  const nlohmann::json body = nlohmann::json::parse(qwen.out.substr(0, qwen.out.rfind('\n')));
  EXPECT_EQ(body["model"], "qwen");
  req.model = "qwen";
  EXPECT_EQ(body["choices"][0]["text"], c.generate(req, {}, 30s).text)
      << "HTTP's qwen is the client API's qwen";

  // The stack is up and serves both models after the refusals.
  for (const std::string model : {"fortune", "qwen"}) {
    req.model = model;
    EXPECT_EQ(c.generate(req, {}, 30s).stats.finish_reason.empty(), false) << model;
  }
  const nlohmann::json st = c.status();
  EXPECT_GE(st["unknown_model_refusals"].get<int>(), 3) << st.dump();
}

TEST_F(MultiModelStack, TwoModelsOfOneNameAreRefusedBeforeAnythingStarts) {
  const CliResult r = run_duet("stack up --stack " + id_ + " --model a='" + kFortune +
                               "' --model a='" + *qwen_ + "'");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("two models are named 'a'"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(default_run_dir(id_) + "/supervisor.sock"));
}

}  // namespace
}  // namespace duet
