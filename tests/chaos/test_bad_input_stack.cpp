// Bad input through the real stack: every case gets a clear error (a duet::Error with a message
// that names the problem) and afterwards every service is still the same healthy process and a
// normal request still gives the right tokens. Plus the access modes of a running stack.
#include <flatbuffers/flatbuffers.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "chaos_fixture.h"
#include "schemas/client_generated.h"

namespace duet::chaos {
namespace {

namespace fbc = duet::fb::client;

class BadInputStack : public ChaosStack {
 protected:
  void SetUp() override {
    ChaosStack::SetUp();
    up();
    clean_ = generate("Q:", 40).ids;
    for (const std::string name : {"frontend", "gpu_svc", "npu_svc", "solver_svc"})
      pids_[name] = service_state(name).first;
  }
  void TearDown() override {
    if (!HasFatalFailure()) expect_stack_unharmed();
    ChaosStack::TearDown();
  }

  // The error must come back quickly and say what was wrong.
  void expect_rejected(client::GenerateRequest req, const std::string& needle) {
    client::Client c(endpoint());
    try {
      const client::GenerateResult r = c.generate(req, {}, 20s);
      ADD_FAILURE() << "accepted: finish " << r.stats.finish_reason << ", " << r.ids.size()
                    << " tokens";
    } catch (const Error& e) {
      EXPECT_NE(e.code(), Errc::timeout) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "the error should mention '" << needle << "': " << e.what();
    }
  }

  void expect_stack_unharmed() {
    for (const auto& [name, pid] : pids_) {
      const auto [now, healthy] = service_state(name);
      EXPECT_EQ(now, pid) << name << " was restarted (crashed?)";
      EXPECT_TRUE(healthy) << name;
    }
    EXPECT_EQ(generate("Q:", 40).ids, clean_) << "a normal request after the bad input";
  }

  client::GenerateRequest request() {
    client::GenerateRequest req;
    req.prompt = "Q:";
    req.max_tokens = 40;
    return req;
  }

  std::vector<int32_t> clean_;
  std::map<std::string, int> pids_;
};

TEST_F(BadInputStack, PromptLongerThanTheContext) {
  client::GenerateRequest req = request();
  req.prompt_ids.assign(600, 100);
  expect_rejected(req, "600");
}

TEST_F(BadInputStack, MaxTokensZeroNegativeOrAbsurd) {
  for (int n : {0, -1, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()}) {
    client::GenerateRequest req = request();
    req.max_tokens = n;
    expect_rejected(req, "max_tokens");
  }
}

TEST_F(BadInputStack, SamplingOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float t : {nan, -1.0f, -std::numeric_limits<float>::infinity()}) {
    client::GenerateRequest req = request();
    req.sampling.temperature = t;
    expect_rejected(req, "temperature");
  }
  for (float p : {0.0f, 1.5f, -0.5f, nan}) {
    client::GenerateRequest req = request();
    req.sampling.top_p = p;
    expect_rejected(req, "top_p");
  }
  client::GenerateRequest req = request();
  req.sampling.top_k = -3;
  expect_rejected(req, "top_k");
}

TEST_F(BadInputStack, UnknownPlanAndPriority) {
  client::GenerateRequest req = request();
  req.plan = "warp-drive";
  expect_rejected(req, "warp-drive");

  flatbuffers::FlatBufferBuilder fbb;
  auto g =
      fbc::CreateGenerateDirect(fbb, "Q:", nullptr, 0, 8, nullptr, static_cast<fbc::Priority>(7));
  fbb.Finish(fbc::CreateClientMessage(fbb, 1, fbc::ClientBody::Generate, g.Union()),
             fbc::ClientMessageIdentifier());
  client::Client c(endpoint());
  auto reply = c.call_raw({fbb.GetBufferPointer(), fbb.GetSize()}, 5s);
  ASSERT_TRUE(reply.has_value()) << "no answer to an unknown priority";
  const auto* m = fbc::GetClientMessage(reply->data());
  ASSERT_EQ(m->body_type(), fbc::ClientBody::Error);
  EXPECT_NE(m->body_as_Error()->message()->str().find("priority"), std::string::npos);
}

// Invalid UTF-8 is bytes to a byte-fallback tokenizer: served, or refused with a message.
TEST_F(BadInputStack, InvalidUtf8PromptIsServedOrRefusedClearly) {
  client::GenerateRequest req = request();
  req.prompt = std::string("Q: \xff\xfe\xc3(\x80\xed\xa0\x80", 11);
  client::Client c(endpoint());
  try {
    const client::GenerateResult r = c.generate(req, {}, 20s);
    EXPECT_FALSE(r.ids.empty());
  } catch (const Error& e) {
    EXPECT_NE(e.code(), Errc::timeout) << e.what();
    EXPECT_FALSE(std::string(e.what()).empty());
  }
}

TEST_F(BadInputStack, ClientsThatVanishMidStreamOrRightAfterConnecting) {
  {
    client::Client c(endpoint());
    client::GenerateRequest req = request();
    req.prompt = kLongPrompt;
    req.max_tokens = 200;
    c.submit(req);
    auto e = c.next_event(10s);
    ASSERT_TRUE(e.has_value());
  }  // gone mid-stream
  const auto start = Clock::now();
  for (int i = 0; i < 1000; ++i) {
    client::Client c(endpoint());
    if (i % 10 == 0) c.submit(request());  // some of them leave a request behind, too
  }
  std::printf("[chaos] 1000 clients connected and vanished in %.0f ms\n",
              ms_between(start, Clock::now()));
  // The frontend reaps them (heartbeat_ms): nothing may stay active for long.
  const auto deadline = Clock::now() + 15s;
  size_t active = 1;
  while (Clock::now() < deadline) {
    client::Client c(endpoint());
    const nlohmann::json s = c.status();
    active = s["running"].size() + s["queue"]["reactive"].get<size_t>() +
             s["queue"]["proactive"].get<size_t>();
    if (active == 0) break;
    std::this_thread::sleep_for(200ms);
  }
  EXPECT_EQ(active, 0u) << "requests of vanished clients still run";
}

TEST_F(BadInputStack, HostileFlatbuffersToTheFrontend) {
  std::vector<std::vector<uint8_t>> hostile;
  // A valid Generate whose prompt_ids vector claims 2^31 elements.
  {
    flatbuffers::FlatBufferBuilder fbb;
    std::vector<int32_t> ids = {1, 2, 3};
    auto g = fbc::CreateGenerateDirect(fbb, nullptr, &ids, 0, 8);
    fbb.Finish(fbc::CreateClientMessage(fbb, 1, fbc::ClientBody::Generate, g.Union()),
               fbc::ClientMessageIdentifier());
    std::vector<uint8_t> b(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    for (size_t i = 0; i + 16 <= b.size(); i += 4) {
      if (std::memcmp(&b[i + 4], "\1\0\0\0\2\0\0\0\3\0\0\0", 12) == 0) {
        const uint32_t huge = 0x80000000u;
        std::memcpy(&b[i], &huge, 4);
      }
    }
    hostile.push_back(b);
    // Every root offset out of range.
    std::vector<uint8_t> c = b;
    const uint32_t far = 0xfffffff0u;
    std::memcpy(c.data(), &far, 4);
    hostile.push_back(c);
  }
  // Deep nesting: a table that points at itself, over and over, then a huge padding.
  {
    std::vector<uint8_t> b(4096, 0);
    std::memcpy(&b[4], "DUCL", 4);
    for (size_t i = 0; i < b.size(); i += 4) {
      const uint32_t back = 8;
      std::memcpy(&b[i], &back, 4);
    }
    std::memcpy(&b[4], "DUCL", 4);
    hostile.push_back(b);
  }
  hostile.push_back({});
  hostile.push_back(std::vector<uint8_t>(1 << 20, 0xff));
  client::Client c(endpoint());
  for (size_t i = 0; i < hostile.size(); ++i) {
    auto reply = c.call_raw(hostile[i], 5s);
    if (!reply) continue;  // dropping garbage is allowed; crashing is not (checked in TearDown)
    const auto* m =
        flatbuffers::Verifier(reply->data(), reply->size()).VerifyBuffer<fbc::ClientMessage>()
            ? fbc::GetClientMessage(reply->data())
            : nullptr;
    ASSERT_NE(m, nullptr) << "case " << i << ": the frontend answered with an invalid buffer";
    EXPECT_EQ(m->body_type(), fbc::ClientBody::Error) << "case " << i;
  }
}

TEST_F(BadInputStack, RunDirSocketsAndSegmentsArePrivate) {
  struct stat st {};
  ASSERT_EQ(stat(run_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << run_dir_;
  int sockets = 0;
  for (const auto& e : std::filesystem::directory_iterator(run_dir_)) {
    ASSERT_EQ(stat(e.path().c_str(), &st), 0);
    if (!S_ISSOCK(st.st_mode)) continue;
    ++sockets;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << e.path();
  }
  EXPECT_GE(sockets, 5) << "supervisor + four services";
  const std::vector<std::string> segments = shm::list_stack_segments(id_);
  EXPECT_FALSE(segments.empty());
  for (const auto& name : segments) {
    const std::string path = "/dev/shm/" + (name[0] == '/' ? name.substr(1) : name);
    ASSERT_EQ(stat(path.c_str(), &st), 0) << path;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << path;
    EXPECT_EQ(st.st_uid, getuid()) << path;
  }
}

}  // namespace
}  // namespace duet::chaos
