// Generate.ignore_eos: EOS is an ordinary token, so a request runs to max_tokens (fixed-length
// runs for benchmarks and the chaos tests); without it the request ends at EOS.
#include <algorithm>

#include "frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

// Greedy decoding straight from core ReferenceForward that does not stop at EOS.
std::vector<int32_t> reference_greedy_past_eos(const std::vector<int32_t>& prompt, int n_tokens) {
  ReferenceForward f(tiny_model());
  std::vector<float> logits = f.forward(prompt, false);
  std::vector<int32_t> out;
  Sampler greedy(SamplingParams{});
  while (static_cast<int>(out.size()) < n_tokens) {
    out.push_back(greedy.sample(logits));
    if (static_cast<int>(out.size()) < n_tokens)
      logits = f.forward(std::vector<int32_t>{out.back()}, false);
  }
  return out;
}

TEST_F(FrontendTest, IgnoreEosRunsToMaxTokensAndWithoutItTheRequestStopsAtEos) {
  start();
  const std::vector<int32_t> prompt = tiny_tokenizer().encode("Q: Why", true);
  const int32_t eos = tiny_tokenizer().eos();
  const std::vector<int32_t> expected = reference_greedy_past_eos(prompt, 200);
  const auto first_eos = std::find(expected.begin(), expected.end(), eos);
  ASSERT_NE(first_eos, expected.end()) << "the prompt must reach EOS within 200 greedy tokens";
  const auto eos_at = static_cast<size_t>(first_eos - expected.begin());

  auto c = connect();
  client::GenerateRequest req;
  req.prompt = "Q: Why";
  req.max_tokens = 200;

  const client::GenerateResult stops = c->generate(req);
  EXPECT_EQ(stops.stats.finish_reason, "eos");
  EXPECT_EQ(stops.ids, std::vector<int32_t>(expected.begin(), first_eos));

  req.ignore_eos = true;
  std::vector<int32_t> streamed;
  const client::GenerateResult full = c->generate(req, [&](const client::Chunk& ch) {
    streamed.insert(streamed.end(), ch.ids.begin(), ch.ids.end());
    return true;
  });
  EXPECT_EQ(full.stats.finish_reason, "length");
  EXPECT_EQ(full.stats.generated_tokens, 200u);
  ASSERT_EQ(full.ids.size(), 200u);
  EXPECT_EQ(full.ids, expected) << "tokens past EOS must be what the model computes there";
  EXPECT_EQ(full.ids[eos_at], eos) << "EOS is returned like any other token";
  EXPECT_EQ(streamed, full.ids);
  EXPECT_EQ(full.text.substr(0, stops.text.size()), stops.text);

  // A stop string still ends an ignore_eos request: one that first occurs past the EOS.
  std::string stop;
  size_t stop_at = stops.text.size() + 1;
  for (; stop_at + 4 <= full.text.size(); ++stop_at) {
    stop = full.text.substr(stop_at, 4);
    if (full.text.find(stop) == stop_at) break;
  }
  ASSERT_LT(stop_at + 4, full.text.size()) << "no stop string past EOS in: " << full.text;
  req.stop = {stop};
  const client::GenerateResult cut = c->generate(req);
  EXPECT_EQ(cut.stats.finish_reason, "stop");
  EXPECT_EQ(cut.text, full.text.substr(0, stop_at));
  EXPECT_LT(cut.ids.size(), 200u);
}

}  // namespace
}  // namespace duet::frontend::testing
