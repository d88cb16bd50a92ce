// solver_svc's handlers on a real ServiceLoop, driven over its ZeroMQ ipc socket the way the
// frontend asks for a plan.
#include "services/solver_svc/solver_service.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <thread>

#include "core/ipc/service.h"
#include "core/planner/solver.h"

namespace duet {
namespace {

using namespace std::chrono_literals;

class SolverServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/duet-solversvc-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    setenv("DUET_CACHE_DIR", (root_ + "/cache").c_str(), 1);
    ServiceOptions o;
    o.id = ServiceId::solver;
    o.stack_id = "solvertest";
    o.run_dir = root_ + "/run";
    o.model_path = "tests/data/tiny-fortune/model.gguf";
    o.handle_signals = false;
    loop_ = std::make_unique<ServiceLoop>(o);
    service_ = std::make_unique<solver::SolverService>("sd8gen3", "", loop_->run_dir());
    solver::install_solver_handlers(*loop_, *service_);
    thread_ = std::thread([this] { loop_->run(); });
  }
  void TearDown() override {
    loop_->stop();
    if (thread_.joinable()) thread_.join();
    loop_.reset();
    std::filesystem::remove_all(root_);
    unsetenv("DUET_CACHE_DIR");
  }
  msg::Reply ask(const std::string& shape, const std::string& phase, uint32_t n,
                 const std::string& timing = "modeled") {
    msg::RequestClient c(ipc_endpoint(control_socket_path(root_ + "/run", ServiceId::solver)));
    return c.call(
        [&](uint64_t id) {
          flatbuffers::FlatBufferBuilder fbb;
          return msg::finish_message(fbb, id,
                                     fb::CreatePlanRequestDirect(fbb, "", shape.c_str(), "sd8gen3",
                                                                 timing.c_str(), phase.c_str(), n));
        },
        5000ms);
  }

  std::string root_;
  std::unique_ptr<ServiceLoop> loop_;
  std::unique_ptr<solver::SolverService> service_;
  std::thread thread_;
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
