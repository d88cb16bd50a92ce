// npu_svc's handlers on a real ServiceLoop (as its main wires them), driven over the ipc
// socket like the frontend and solver drive it: good requests answered, bad ones (unknown
// graph op, bad dtype, malformed bytes, oversized profiles, unknown programs) answered with
// errors naming the problem, and the service still healthy afterwards.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/ipc/messaging.h"
#include "core/ipc/service.h"
#include "core/planner/soc_profile.h"
#include "services/npu_svc/npu_service.h"
#include "tests/support/error_code.h"
#include "tests/support/service_loop_thread.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using namespace std::chrono_literals;
using test_support::error_code_of;

class NpuServiceLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceLoop& loop = service_loop_.loop();
    service_ = std::make_unique<npu::NpuService>(load_soc_profile(loop.options().soc), 1,
                                                 ShmMemoryResolver("npu_svc"));
    npu::register_handlers(loop, *service_);
    service_loop_.start();
    client_ = std::make_unique<msg::RequestClient>(service_loop_.endpoint());
  }
  void TearDown() override {
    client_.reset();
    service_loop_.stop();
  }

  msg::Reply compile(fb::OpKind kind, fb::DTypeCode dtype, uint32_t rows, uint32_t cols,
                     uint32_t n) {
    return client_->call(
        [&](uint64_t id) {
          flatbuffers::FlatBufferBuilder fbb;
          return msg::finish_message(fbb, id,
                                     fb::CreateCompileGraph(fbb, kind, dtype, rows, cols, n));
        },
        5000ms);
  }
  nlohmann::json status() {
    auto r = client_->call([](uint64_t id) { return msg::make_status_request(id); }, 5000ms);
    return nlohmann::json::parse(r.message().body_as_StatusReply()->json()->str());
  }

  test_support::TempDir root_{"duet-npuloop"};
  std::unique_ptr<npu::NpuService> service_;  // outlives the loop that dispatches to it
  test_support::ServiceLoopThread service_loop_{ServiceId::npu, "npuloop", root_ / "run"};
  std::unique_ptr<msg::RequestClient> client_;
};

TEST_F(NpuServiceLoopTest, AnswersOverTheSocketAndSurvivesBadRequests) {
  const auto first = compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 4096, 4096, 256);
  ASSERT_NE(first.message().body_as_GraphCompiled(), nullptr);
  EXPECT_FALSE(first.message().body_as_GraphCompiled()->cached());
  EXPECT_GT(first.message().body_as_GraphCompiled()->modeled_compile_us(), 1000.0f);

  std::string msg;
  EXPECT_EQ(
      error_code_of([&] { compile(fb::OpKind::Attention, fb::DTypeCode::F32, 64, 64, 1); }, &msg),
      Errc::unsupported);
  EXPECT_NE(msg.find("Attention"), std::string::npos) << msg;
  EXPECT_EQ(
      error_code_of([&] { compile(fb::OpKind::MatMul, static_cast<fb::DTypeCode>(5), 64, 64, 1); },
                    &msg),
      Errc::invalid_argument);
  EXPECT_NE(msg.find("dtype"), std::string::npos) << msg;
  // Bytes that are not a control message at all.
  const std::vector<uint8_t> garbage = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const msg::Bytes raw = client_->call_raw(garbage, 5000ms);
  const fb::Message* reply = msg::verify_control(raw);
  ASSERT_EQ(reply->body_type(), fb::Body::ErrorReply);
  // A profile too large to measure, a step of a program nobody registered.
  EXPECT_EQ(error_code_of(
                [&] {
                  client_->call(
                      [](uint64_t id) {
                        flatbuffers::FlatBufferBuilder fbb;
                        return msg::finish_message(
                            fbb, id,
                            fb::CreateProfileOp(fbb, fb::OpKind::MatMul, fb::DTypeCode::F32,
                                                1u << 20, 1u << 14, 1, 1, false));
                      },
                      5000ms);
                },
                &msg),
            Errc::out_of_range);
  const auto step = client_->call(
      [](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        const fb::TensorRef t(fb::SegmentKind::Arena, fb::DTypeCode::F32, 0, 1, 4, 0);
        return msg::finish_message(fbb, id, fb::CreateRunStep(fbb, 42, 1, 1, 1, &t, &t, 1000));
      },
      5000ms);
  ASSERT_NE(step.message().body_as_StepFailed(), nullptr);
  EXPECT_EQ(step.message().body_as_StepFailed()->code(), fb::Code::NotFound);

  // Still up, and its status says what it holds.
  const nlohmann::json st = status();
  EXPECT_EQ(st["soc"], "sd8gen3");
  EXPECT_EQ(st["graphs_cached"], 1);
  EXPECT_GT(st["compile_us_total"].get<double>(), 0.0);
  EXPECT_EQ(st["failed_steps"], 1);
  EXPECT_TRUE(compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 4096, 4096, 256)
                  .message()
                  .body_as_GraphCompiled()
                  ->cached());
}

}  // namespace
}  // namespace duet
