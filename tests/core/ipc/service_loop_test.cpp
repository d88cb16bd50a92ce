// core/ipc/service: a real ServiceLoop on its own thread, driven over its ipc socket the way the
// supervisor and the frontend drive a service.
#include "core/ipc/service.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>

#include "tests/support/service_loop_thread.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using namespace std::chrono_literals;

class ServiceLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A handler the way a device service registers one: verified request in, reply out.
    loop().on(fb::Body::LoadModel, [](const fb::Message& m) {
      const auto* lm = m.body_as_LoadModel();
      if (!lm->path() || lm->path()->str().empty())
        throw Error(Errc::invalid_argument, "LoadModel needs a path");
      flatbuffers::FlatBufferBuilder fbb;
      return msg::finish_message(fbb, m.request_id(),
                                 fb::CreateModelLoadedDirect(fbb, lm->path()->c_str(), 1, 2, 3, 4));
    });
    loop().set_status([] { return nlohmann::json{{"graphs_cached", 3}}; });
  }
  ServiceLoop& loop() { return service_.loop(); }
  void start() { service_.start(); }
  std::string endpoint() const { return service_.endpoint(); }
  bool healthy(msg::RequestClient& c) {
    auto r = c.call([](uint64_t id) { return msg::make_heartbeat(id, 9); }, 2000ms);
    const auto* ack = r.message().body_as_HeartbeatAck();
    return ack && ack->seq() == 9 && ack->state()->str() == "ready" &&
           ack->service() == fb::ServiceKind::Npu && ack->pid() == getpid();
  }

  test_support::TempDir root_{"duet-svctest"};
  const std::string run_dir_ = root_ / "run";  // created by the loop
  test_support::ServiceLoopThread service_{ServiceId::npu, "svctest", run_dir_, "models/none.gguf"};
};

TEST_F(ServiceLoopTest, RunDirIs0700AndSocketIs0600) {
  struct stat st {};
  ASSERT_EQ(stat(run_dir_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat(control_socket_path(run_dir_, ServiceId::npu).c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(ServiceLoopTest, AnswersHelloHeartbeatAndStatus) {
  start();
  msg::RequestClient c(endpoint());
  EXPECT_TRUE(healthy(c));
  auto hello = c.call(
      [](uint64_t id) { return msg::make_hello(id, fb::ServiceKind::Supervisor, 1, "svctest", 4); },
      2000ms);
  ASSERT_NE(hello.message().body_as_HelloAck(), nullptr);
  EXPECT_EQ(hello.message().body_as_HelloAck()->epoch(), 4u);
  auto status = c.call([](uint64_t id) { return msg::make_status_request(id); }, 2000ms);
  auto j = nlohmann::json::parse(status.message().body_as_StatusReply()->json()->str());
  EXPECT_EQ(j["service"], "npu_svc");
  EXPECT_EQ(j["stack"], "svctest");
  EXPECT_EQ(j["graphs_cached"], 3);  // the service's own status fields are merged in
}

TEST_F(ServiceLoopTest, DispatchesToHandlersAndTurnsThrowsIntoErrorReplies) {
  start();
  msg::RequestClient c(endpoint());
  auto ok = c.call(
      [](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        return msg::finish_message(fbb, id, fb::CreateLoadModelDirect(fbb, "m.gguf"));
      },
      2000ms);
  ASSERT_NE(ok.message().body_as_ModelLoaded(), nullptr);
  EXPECT_EQ(ok.message().body_as_ModelLoaded()->bytes(), 4u);

  auto expect_error = [&](const msg::RequestClient::Build& build, Errc code) {
    try {
      c.call(build, 2000ms);
      ADD_FAILURE() << "expected an ErrorReply";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
    }
  };
  expect_error(
      [](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        return msg::finish_message(fbb, id, fb::CreateLoadModelDirect(fbb, ""));
      },
      Errc::invalid_argument);
  expect_error(  // no handler registered for it
      [](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        return msg::finish_message(fbb, id, fb::CreateProfileOp(fbb));
      },
      Errc::unsupported);
  EXPECT_TRUE(healthy(c));
  EXPECT_EQ(loop().requests_failed(), 2u);
}

TEST_F(ServiceLoopTest, GarbageGetsAnErrorReplyAndTheLoopGoesOn) {
  start();
  msg::RequestClient c(endpoint());
  msg::Bytes good = msg::make_heartbeat(1, 1);
  msg::Bytes corrupt = good;
  corrupt[good.size() - 6] ^= 0x7f;  // inside the body: an offset that points nowhere
  std::vector<msg::Bytes> inputs = {{},
                                    {0xde, 0xad, 0xbe, 0xef},
                                    msg::Bytes(4096, 0xff),
                                    msg::make_client_error(1, Errc::busy, "wrong schema"),
                                    msg::Bytes(good.begin(), good.begin() + 10),
                                    corrupt};
  for (const auto& in : inputs) {
    msg::Bytes reply = c.call_raw(in, 2000ms);
    const fb::Message* m = nullptr;
    try {
      m = msg::verify_control(reply);
    } catch (const Error& e) {
      FAIL() << "unverifiable reply: " << e.what();
    }
    // A flip may leave a valid heartbeat: then the answer is its ack; everything else is refused.
    if (m->body_type() == fb::Body::HeartbeatAck) continue;
    ASSERT_EQ(m->body_type(), fb::Body::ErrorReply) << in.size() << "-byte input";
    EXPECT_EQ(m->body_as_ErrorReply()->code(), fb::Code::BadFormat);
  }
  EXPECT_TRUE(healthy(c));
}

TEST_F(ServiceLoopTest, ShutdownRequestEndsRun) {
  start();
  msg::RequestClient c(endpoint());
  auto r = c.call([](uint64_t id) { return msg::make_shutdown(id); }, 2000ms);
  EXPECT_NE(r.message().body_as_StatusReply(), nullptr);
  service_.join();  // run() returned by itself
  std::ifstream log(log_path(run_dir_, "npu_svc"));
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(text.find("shutdown requested"), std::string::npos) << text;
}

TEST_F(ServiceLoopTest, BuiltInBodiesCannotBeOverridden) {
  EXPECT_THROW(loop().on(fb::Body::Heartbeat, [](const fb::Message&) { return msg::Bytes{}; }),
               Error);
}

}  // namespace
}  // namespace duet
