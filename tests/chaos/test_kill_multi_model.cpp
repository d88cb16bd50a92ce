// kill -9 of the frontend of a stack serving two models (issue 25 with issue 22's journal): one
// 200-token generation of each model in flight when the frontend dies. The supervisor restarts
// it; each model's frontend adopts its own requests from its own journal (a request keeps its
// model), the client resumes both streams, and each ends with the tokens of an undisturbed run
// of its model, every token exactly once. Nothing leaks: no KV page held, no segment piled up.
#include <map>

#include "chaos_fixture.h"

namespace duet::chaos {
namespace {

class MultiModelFrontendKill : public ChaosStack {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("duet-chaos-mm-" + std::to_string(::getpid())));
    qwen_ = new std::string(test_support::make_tiny_qwen2(*dir_));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete qwen_;
  }
  static std::filesystem::path* dir_;
  static std::string* qwen_;
};
std::filesystem::path* MultiModelFrontendKill::dir_ = nullptr;
std::string* MultiModelFrontendKill::qwen_ = nullptr;

client::GenerateRequest fixed_run(const std::string& model) {
  client::GenerateRequest req;
  req.model = model;
  req.prompt = kLongPrompt;
  req.max_tokens = kFixedRunTokens;
  req.ignore_eos = true;
  req.heartbeat_ms = 0;  // the event loop below sends no KeepAlives
  return req;
}

// npu-only, as the one-model frontend kill: its ~2.7 ms decode steps keep both requests
// mid-generation when the kill comes.
TEST_F(MultiModelFrontendKill, EachModelsRequestResumesOnItsModelWithEveryTokenOnce) {
  up("npu-only", "--model fortune='" DUET_SOURCE_DIR
                 "/tests/data/tiny-fortune/fortune-q8_0.gguf' --model qwen='" +
                     *qwen_ + "'");
  const std::vector<std::string> models = {"fortune", "qwen"};
  std::map<std::string, client::GenerateResult> clean;
  for (const std::string& m : models)
    clean[m] = client::Client(endpoint()).generate(fixed_run(m), {}, 60s);
  ASSERT_EQ(clean["fortune"].ids.size(), size_t(kFixedRunTokens));
  ASSERT_NE(clean["fortune"].ids, clean["qwen"].ids);
  const std::set<std::string> segments_before = segments();

  const auto [pid, healthy] = service_state("frontend");
  ASSERT_TRUE(pid > 0 && healthy);
  client::Client c(endpoint());
  std::map<uint64_t, std::string> model_of;
  for (const std::string& m : models) model_of[c.submit(fixed_run(m))] = m;
  std::map<std::string, std::vector<int32_t>> streamed;
  std::map<std::string, client::GenerateResult> done;
  bool killed = false;
  size_t received = 0;
  while (done.size() < models.size()) {
    const auto e = c.next_event(60s);
    ASSERT_TRUE(e.has_value()) << "no event within 60 s (" << done.size() << " done)";
    ASSERT_NE(e->kind, client::Event::Kind::error) << e->message;
    const std::string& m = model_of.at(e->request_id);
    if (e->kind == client::Event::Kind::chunk) {
      streamed[m].insert(streamed[m].end(), e->chunk.ids.begin(), e->chunk.ids.end());
      received += e->chunk.ids.size();
      // Both requests are mid-stream: each has tokens and neither is near its end.
      if (!killed && streamed["fortune"].size() >= 20 && streamed["qwen"].size() >= 20) {
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        killed = true;
        ASSERT_LT(streamed["fortune"].size(), size_t(kFixedRunTokens));
        ASSERT_LT(streamed["qwen"].size(), size_t(kFixedRunTokens));
      }
    } else if (e->kind == client::Event::Kind::done) {
      done[m] = e->done;
    }
  }
  ASSERT_TRUE(killed) << "both generations ended before the kill";
  EXPECT_GE(c.reconnects(), 1u);
  EXPECT_GE(c.resumes_sent(), 2u);
  for (const std::string& m : models) {
    SCOPED_TRACE(m);
    EXPECT_EQ(done[m].ids, clean[m].ids) << "tokens differ after the frontend's restart";
    EXPECT_EQ(streamed[m], clean[m].ids) << "a token streamed twice or never";
    EXPECT_EQ(done[m].text, clean[m].text);
    EXPECT_EQ(done[m].stats.finish_reason, "length");
  }
  ASSERT_TRUE(wait_all_healthy({pid})) << "the frontend did not come back";
  const nlohmann::json st = c.status();
  for (const std::string& m : models) {
    const nlohmann::json& journal = st["models"][m]["journal"];
    EXPECT_EQ(journal["adopted_live"], 1) << m << ": " << journal.dump();
    EXPECT_EQ(journal["resumed"], 1) << m << ": " << journal.dump();
    const nlohmann::json& e = st["models"][m]["engine"];
    EXPECT_EQ(e["open_sequences"], 0) << m << ": " << e.dump();
    EXPECT_EQ(e["kv_pages_free"], e["kv_pages_total"]) << m << ": KV pages leaked " << e.dump();
  }
  // After the restart each model still gives its own tokens.
  for (const std::string& m : models)
    EXPECT_EQ(client::Client(endpoint()).generate(fixed_run(m), {}, 60s).ids, clean[m].ids) << m;
  EXPECT_EQ(segments(), segments_before) << "segments piled up or vanished across the restart";
  down_and_expect_nothing_left();
}

}  // namespace
}  // namespace duet::chaos
