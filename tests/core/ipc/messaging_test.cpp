// core/ipc/messaging: verification of hostile buffers, error replies, and the request/reply
// client's deadlines and request-id matching, over real ZeroMQ ipc sockets.
#include "core/ipc/messaging.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <thread>

#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using namespace std::chrono_literals;

TEST(VerifyControl, AcceptsWhatTheBuildersMake) {
  msg::Bytes b = msg::make_heartbeat_ack(7, 42, fb::ServiceKind::Npu, 1234, 99, "ready");
  const fb::Message* m = msg::verify_control(b);
  EXPECT_EQ(m->request_id(), 7u);
  ASSERT_EQ(m->body_type(), fb::Body::HeartbeatAck);
  EXPECT_EQ(m->body_as_HeartbeatAck()->seq(), 42u);
  EXPECT_EQ(m->body_as_HeartbeatAck()->state()->str(), "ready");
}

TEST(VerifyControl, RejectsShortEmptyAndForeignBuffers) {
  EXPECT_THROW(msg::verify_control({}), Error);
  msg::Bytes tiny = {1, 2, 3};
  EXPECT_THROW(msg::verify_control(tiny), Error);
  // A valid client message is not a control message: the file identifier tells them apart.
  msg::Bytes client = msg::make_client_error(1, Errc::busy, "x");
  try {
    msg::verify_control(client);
    FAIL() << "a client buffer passed as a control message";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::bad_format);
    EXPECT_NE(std::string(e.what()).find("identifier"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(msg::verify_client(client));
  EXPECT_THROW(msg::verify_client(msg::make_shutdown(1)), Error);
}

TEST(VerifyControl, RandomBytesAndEveryTruncationAreRejectedOrSafe) {
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000; ++i) {
    msg::Bytes junk(8 + rng() % 200);
    for (auto& x : junk) x = static_cast<uint8_t>(rng());
    if (i % 2) std::memcpy(junk.data() + 4, "DUCT", 4);  // get past the identifier check
    EXPECT_THROW(msg::verify_control(junk), Error);
  }
  msg::Bytes good = msg::make_status_reply(3, fb::ServiceKind::Gpu, R"({"a":1})");
  for (size_t n = 0; n < good.size(); ++n) {
    msg::Bytes cut(good.begin(), good.begin() + static_cast<long>(n));
    EXPECT_THROW(msg::verify_control(cut), Error) << "prefix of " << n << " bytes";
  }
  // Flipping any one byte either still verifies (and can be read) or is rejected: never a crash.
  for (size_t i = 0; i < good.size(); ++i) {
    msg::Bytes bad = good;
    bad[i] ^= 0xff;
    try {
      const fb::Message* m = msg::verify_control(bad);
      if (const auto* r = m->body_as_StatusReply(); r && r->json()) (void)r->json()->str();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::bad_format);
    }
  }
}

TEST(VerifyControl, RefusesMoreTablesThanTheLimit) {
  flatbuffers::FlatBufferBuilder fbb;
  std::vector<flatbuffers::Offset<fb::Op>> ops;
  for (uint32_t i = 0; i < msg::kMaxTables + 10; ++i) ops.push_back(fb::CreateOp(fbb));
  auto ops_vec = fbb.CreateVector(ops);
  fb::ProgramBuilder pb(fbb);
  pb.add_ops(ops_vec);
  auto program = pb.Finish();
  msg::Bytes b = msg::finish_message(fbb, 1, fb::CreateRegisterProgram(fbb, 1, program));
  EXPECT_THROW(msg::verify_control(b), Error);
}

// The Verifier of flatbuffers 2.0.8 checks only a vector's length field for alignment; a program
// whose 8-byte slot table sits at 4 mod 8 must be refused, not read (fuzz_messages found it).
TEST(VerifyControl, RefusesAProgramWhoseSlotTableIsMisaligned) {
  int refused = 0, accepted = 0;
  for (int pad = 0; pad < 2; ++pad) {
    flatbuffers::FlatBufferBuilder fbb;
    // Two uint32 per uint64: a [uint] vector is aligned to 4 only, so one of the two paddings
    // leaves its data at 4 mod 8.
    const std::vector<uint32_t> words = {1, 0, 2, 0, 3, 0, 4, 0};
    if (pad) fbb.PushElement<uint32_t>(0);
    const auto as_words = fbb.CreateVector(words);
    const flatbuffers::Offset<flatbuffers::Vector<uint64_t>> slots(as_words.o);
    fb::ProgramBuilder pb(fbb);
    pb.add_slot_offsets(slots);
    const auto program = pb.Finish();
    msg::Bytes b = msg::finish_message(fbb, 1, fb::CreateRegisterProgram(fbb, 1, program));
    // The length field still counts words: make it count the four uint64.
    const auto* data = flatbuffers::GetRoot<fb::Message>(b.data())
                           ->body_as_RegisterProgram()
                           ->program()
                           ->slot_offsets()
                           ->Data();
    const auto at = static_cast<size_t>(data - b.data());
    const uint32_t n = 4;
    std::memcpy(b.data() + at - 4, &n, 4);
    if (at % 8 == 0) {
      EXPECT_EQ(
          msg::verify_control(b)->body_as_RegisterProgram()->program()->slot_offsets()->Get(2), 3u);
      ++accepted;
    } else {
      try {
        msg::verify_control(b);
        ADD_FAILURE() << "a misaligned slot table was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("slot_offsets"), std::string::npos) << e.what();
      }
      ++refused;
    }
  }
  EXPECT_EQ(refused, 1);
  EXPECT_EQ(accepted, 1);
}

TEST(ErrorReply, CarriesCodeAndMessageBackAsAnException) {
  msg::Bytes b = msg::make_error_reply(5, Errc::not_found, "no program 12");
  const fb::Message* m = msg::verify_control(b);
  try {
    msg::throw_if_error(*m);
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_STREQ(e.what(), "no program 12");
  }
  EXPECT_NO_THROW(msg::throw_if_error(*msg::verify_control(msg::make_shutdown(1))));
}

// A ROUTER in this process standing in for a service, so the client's edge cases can be staged.
class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override { router_ = msg::bind_router(path_); }
  void TearDown() override { router_.close(); }
  msg::Envelope recv_one() {
    msg::Envelope env;
    zmq::pollitem_t item{static_cast<void*>(router_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 2000ms);
    EXPECT_TRUE(msg::try_recv_envelope(router_, env));
    return env;
  }
  test_support::TempDir dir_{"duet-msgtest"};
  const std::string path_ = dir_ / "svc.sock";
  zmq::socket_t router_;
};

TEST_F(ClientTest, SocketFileIsPrivate) {
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(ClientTest, TimesOutAtTheDeadlineWhenNobodyAnswers) {
  msg::RequestClient client(ipc_endpoint(path_));
  auto t0 = std::chrono::steady_clock::now();
  try {
    client.call([](uint64_t id) { return msg::make_heartbeat(id, 1); }, 150ms);
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timeout);
  }
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 150ms);
  EXPECT_LT(took, 1500ms);
}

TEST_F(ClientTest, LateAndMismatchedRepliesAreNeverReturnedForANewerRequest) {
  msg::RequestClient client(ipc_endpoint(path_));
  std::thread server([&] {
    msg::Envelope first = recv_one();
    const uint64_t first_id = msg::verify_control(first.payload)->request_id();
    // The client gave up on the first request and sent a second: answer both, late one first.
    msg::Envelope second = recv_one();
    const uint64_t second_id = msg::verify_control(second.payload)->request_id();
    msg::send_reply(router_, first,
                    msg::make_heartbeat_ack(first_id, 1, fb::ServiceKind::Gpu, 1, 0, "late"));
    msg::send_reply(
        router_, second,
        msg::make_heartbeat_ack(second_id + 100, 2, fb::ServiceKind::Gpu, 1, 0, "wrong id"));
    msg::send_reply(router_, second,
                    msg::make_heartbeat_ack(second_id, 2, fb::ServiceKind::Gpu, 1, 0, "right"));
  });
  EXPECT_THROW(client.call([](uint64_t id) { return msg::make_heartbeat(id, 1); }, 100ms), Error);
  msg::Reply r = client.call([](uint64_t id) { return msg::make_heartbeat(id, 2); }, 3000ms);
  server.join();
  ASSERT_NE(r.message().body_as_HeartbeatAck(), nullptr);
  EXPECT_EQ(r.message().body_as_HeartbeatAck()->state()->str(), "right");
}

TEST_F(ClientTest, ErrorReplyIsThrownWithItsCode) {
  msg::RequestClient client(ipc_endpoint(path_));
  std::thread server([&] {
    msg::Envelope env = recv_one();
    uint64_t id = msg::verify_control(env.payload)->request_id();
    msg::send_reply(router_, env, msg::make_error_reply(id, Errc::busy, "queue full"));
  });
  try {
    client.call([](uint64_t id) { return msg::make_status_request(id); }, 3000ms);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy);
    EXPECT_STREQ(e.what(), "queue full");
  }
  server.join();
}

TEST(Endpoints, TooLongSocketPathIsAClearError) {
  EXPECT_EQ(ipc_endpoint("/tmp/x.sock"), "ipc:///tmp/x.sock");
  try {
    ipc_endpoint("/tmp/" + std::string(200, 'a') + ".sock");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("unix socket"), std::string::npos) << e.what();
  }
}

TEST(StackIds, OnlySafeCharactersAreAccepted) {
  EXPECT_NO_THROW(validate_stack_id("default"));
  EXPECT_NO_THROW(validate_stack_id("a-b_3"));
  for (const char* bad : {"", "a/b", "a b", "../x", "x.y"})
    EXPECT_THROW(validate_stack_id(bad), Error) << bad;
  EXPECT_THROW(validate_stack_id(std::string(33, 'a')), Error);
  EXPECT_EQ(parse_service("gpu"), ServiceId::gpu);
  EXPECT_EQ(parse_service("solver_svc"), ServiceId::solver);
  EXPECT_THROW(parse_service("cpu_svc"), Error);
}

}  // namespace
}  // namespace duet
