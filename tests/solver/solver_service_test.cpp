// solver_svc's handlers on a real ServiceLoop, driven over its ZeroMQ ipc socket the way the
// frontend asks for a plan.
#include "services/solver_svc/solver_service.h"

#include <gtest/gtest.h>

#include <thread>

#include "core/ipc/service.h"
#include "core/planner/solver.h"
#include "tests/support/scoped_env.h"
#include "tests/support/service_loop_thread.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using namespace std::chrono_literals;

class SolverServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServiceLoop& loop = service_loop_.loop();
    service_ = std::make_unique<solver::SolverService>("sd8gen3", "", loop.run_dir());
    solver::install_solver_handlers(loop, *service_);
    service_loop_.start();
  }
  void TearDown() override { service_loop_.stop(); }
  msg::Reply ask(const std::string& shape, const std::string& phase, uint32_t n,
                 const std::string& timing = "modeled") {
    msg::RequestClient c(service_loop_.endpoint());
    return c.call(
        [&](uint64_t id) {
          flatbuffers::FlatBufferBuilder fbb;
          return msg::finish_message(fbb, id,
                                     fb::CreatePlanRequestDirect(fbb, "", shape.c_str(), "sd8gen3",
                                                                 timing.c_str(), phase.c_str(), n));
        },
        5000ms);
  }

  test_support::TempDir root_{"duet-solversvc"};
  test_support::ScopedEnv cache_dir_{"DUET_CACHE_DIR", (root_ / "cache").c_str()};
  std::unique_ptr<solver::SolverService> service_;  // outlives the loop that dispatches to it
  test_support::ServiceLoopThread service_loop_{ServiceId::solver, "solvertest", root_ / "run",
                                                "tests/data/tiny-fortune/model.gguf"};
};

TEST_F(SolverServiceTest, AnswersAPlanRequestWithAVersionedPlanTheFrontendCanUse) {
  const msg::Reply reply = ask("llama3-8b", "prefill", 257);
  const auto* plan = reply.message().body_as_PlanReply();
  ASSERT_NE(plan, nullptr);
  EXPECT_EQ(plan->version(), 1u);
  const nlohmann::json j = nlohmann::json::parse(plan->json()->str());
  const Plan p = plan_from_json(j);
  EXPECT_EQ(p.name, "tensor");
  EXPECT_EQ(p.at(MatmulRole::q).strategy, Strategy::activation_split);
  EXPECT_EQ(p.at(MatmulRole::q).npu_tokens, 256);
  EXPECT_EQ(j.at("rows").size(), 7u);
  // The same request again comes from the plan cache, same version.
  const msg::Reply again = ask("llama3-8b", "prefill", 257);
  EXPECT_EQ(again.message().body_as_PlanReply()->version(), 1u);
  EXPECT_TRUE(nlohmann::json::parse(again.message().body_as_PlanReply()->json()->str())
                  .at("cached")
                  .get<bool>());
}

TEST_F(SolverServiceTest, BadRequestsGetErrorsNamingTheProblemAndTheServiceStaysUp) {
  try {
    ask("llama9-999b", "prefill", 64);
    FAIL() << "unknown shape accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::not_found);
    EXPECT_NE(std::string(e.what()).find("llama9-999b"), std::string::npos) << e.what();
  }
  try {
    ask("llama3-8b", "decode", 7);
    FAIL() << "7-token decode accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
  }
  try {
    ask("llama3-8b", "sideways", 7);
    FAIL() << "unknown phase accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sideways"), std::string::npos) << e.what();
  }
  // Measured timing with no gpu_svc/npu_svc in this stack: the first request starts profiling
  // and is told to come back; the profiling fails at once and the next request says why.
  try {
    ask("tiny-fortune", "decode", 1, "measured");
    FAIL() << "measured plan without a profile";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::busy) << e.what();
  }
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (service_->profiling() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_FALSE(service_->profiling());
  try {
    ask("tiny-fortune", "decode", 1, "measured");
    FAIL() << "measured plan without devices";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::unavailable) << e.what();
    EXPECT_NE(std::string(e.what()).find("gpu_svc"), std::string::npos) << e.what();
  }
  const msg::Reply ok = ask("llama3-8b", "decode", 1);
  EXPECT_NE(ok.message().body_as_PlanReply(), nullptr);
}

}  // namespace
}  // namespace duet
