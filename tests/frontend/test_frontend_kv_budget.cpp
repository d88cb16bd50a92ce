// A KV budget the stack cannot serve never leaves a client waiting (issue 20): a request that
// needs more KV than the whole cache holds, with nothing running that could free any, is answered
// with an error naming the KV cache instead of being queued forever.
#include <gtest/gtest.h>

#include <chrono>
#include <future>

#include "frontend_fixture.h"

namespace duet::frontend::testing {
namespace {

TEST_F(FrontendTest, RequestLargerThanTheWholeKvCacheFailsInsteadOfWaitingForever) {
  ReferenceEngineOptions small;
  small.max_kv_bytes = ReferenceEngine(tiny_model()).kv_bytes_for(8);  // 8 positions in all
  start({}, small);
  auto c = connect();
  client::GenerateRequest r;
  r.prompt = "The man who";
  r.max_tokens = 16;  // prompt + 16 > 8 positions
  auto answer = std::async(std::launch::async, [&] {
    try {
      c->generate(r, [](const client::Chunk&) { return true; });
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the request is still waiting for KV that can never be freed";
  EXPECT_NE(answer.get().find("KV cache full"), std::string::npos);

  // The frontend keeps serving: a request that fits runs.
  auto c2 = connect();
  client::GenerateRequest fits;
  fits.prompt = "A";
  fits.max_tokens = 2;
  EXPECT_EQ(c2->generate(fits, [](const client::Chunk&) { return true; }).ids.size(), 2u);
}

}  // namespace
}  // namespace duet::frontend::testing
