// Every plan, executed by the real gpu_svc (OpenCL on PoCL) and npu_svc (the NPU emulator)
// processes over ZeroMQ and shared memory, gives the reference's tokens on tiny-fortune:
// teacher-forced top-1 agreement wherever the reference's top-1 margin exceeds 0.05, for F16,
// Q8_0 and Q4_0. Then a device is killed in the middle of decoding and the engine recovers.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/plan_store.h"
#include "core/run_dir.h"
#include "core/solver.h"
#include "services/frontend/program_engine.h"
#include "tests/support/llamacpp_agreement.h"
#include "tests/support/teacher_forced.h"

extern char** environ;

namespace duet::frontend {
namespace {

using test_support::Agreement;
using test_support::teacher_forced;

using namespace std::chrono_literals;

std::string data_dir() {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/";
}
std::string model_path(const std::string& v) {
  return data_dir() + "fortune-" + v + ".gguf";
}

// One device service process, started the way the supervisor starts it.
class ServiceProcess {
 public:
  ServiceProcess(const std::string& exe, const std::string& stack, const std::string& run_dir) {
    std::vector<std::string> args = {exe,       "--stack",          stack,   "--run-dir", run_dir,
                                     "--model", model_path("q8_0"), "--soc", "sd8gen3"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, exe.c_str(), nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  ~ServiceProcess() { stop(SIGTERM); }
  void stop(int sig) {
    if (pid_ <= 0) return;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  int pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

class PlansOverServices : public ::testing::Test {
 protected:
  void SetUp() override {
    stack_ = "it" + std::to_string(getpid());
    run_dir_ = std::filesystem::temp_directory_path() / ("duet-it-" + std::to_string(getpid()));
    make_private_dir(run_dir_);
    start("gpu");
    start("npu");
  }
  void TearDown() override {
    gpu_.reset();
    npu_.reset();
    std::filesystem::remove_all(run_dir_);
  }
  void start(const std::string& which) {
    auto& slot = which == "gpu" ? gpu_ : npu_;
    slot.reset();
    slot = std::make_unique<ServiceProcess>(std::string(DUET_BINARY_DIR) + "/bin/" + which + "_svc",
                                            stack_, run_dir_);
    ASSERT_GT(slot->pid(), 0);
  }
  std::string endpoint(ServiceId id) const {
    return ipc_endpoint(control_socket_path(run_dir_, id));
  }

  std::unique_ptr<ProgramEngine> engine(const std::string& variant, const std::string& plan_name,
                                        std::function<Plan(uint32_t)> plan_for, uint32_t id_base) {
    ProgramEngineOptions o;
    o.model_path = model_path(variant);
    o.stack_id = stack_;
    o.plan_name = plan_name;
    o.plan_for = std::move(plan_for);
    o.buckets = {1, 64};
    o.max_seqs = 2;
    o.max_ctx = 128;
    o.segment_tag = "p" + std::to_string(id_base);
    o.program_id_base = id_base;
    return std::make_unique<ProgramEngine>(o, LlamaModel::load(o.model_path),
                                           make_service_link("gpu_svc", endpoint(ServiceId::gpu)),
                                           make_service_link("npu_svc", endpoint(ServiceId::npu)));
  }

  std::string stack_;
  std::string run_dir_;
  std::unique_ptr<ServiceProcess> gpu_, npu_;
};

Plan tensor_plan_for(const std::string& variant, uint32_t bucket) {
  PlanQuery q;
  q.model_path = model_path(variant);
  q.phase = bucket <= 1 ? Phase::decode : Phase::prefill;
  q.n_tokens = bucket;
  q.use_cache = false;
  q.baselines = false;
  return plan_from_json(plan_json_for(q));
}

TEST_F(PlansOverServices, EveryPlanMatchesTheReferenceTeacherForced) {
  uint32_t id_base = 100;
  for (const char* variant : {"f16", "q8_0", "q4_0"}) {
    const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
        {"gpu-only", nullptr},
        {"npu-only", nullptr},
        {"tensor", [variant](uint32_t b) { return tensor_plan_for(variant, b); }},
    };
    for (const auto& [name, plan_for] : plans) {
      SCOPED_TRACE(std::string(variant) + " " + name);
      auto e = engine(variant, name, plan_for, id_base);
      id_base += 100;
      const Agreement a = teacher_forced(*e, data_dir(), variant);
      EXPECT_GT(a.clear, 100);
      EXPECT_EQ(a.agree, a.clear) << describe(a);
    }
  }
}

// The same plans held to llama.cpp's answers on the same files (tests/data/llamacpp/
// logits-fortune-*.json): top-1 equal wherever llama.cpp's margin exceeds its own noise.
TEST_F(PlansOverServices, EveryPlanMatchesLlamacppTeacherForced) {
  uint32_t id_base = 3000;
  for (const char* variant : {"f16", "q8_0", "q4_0"}) {
    const auto answer = test_support::load_json(
        std::string(DUET_SOURCE_DIR) + "/tests/data/llamacpp/logits-fortune-" + variant + ".json");
    const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
        {"gpu-only", nullptr},
        {"npu-only", nullptr},
        {"npu-only:pipe", nullptr},
        {"tensor", [variant](uint32_t b) { return tensor_plan_for(variant, b); }},
    };
    for (const auto& [name, plan_for] : plans) {
      SCOPED_TRACE(std::string(variant) + " " + name);
      auto e = engine(variant, name, plan_for, id_base);
      id_base += 100;
      const auto a = test_support::llamacpp_teacher_forced(*e, answer, 1);
      EXPECT_GE(a.clear, 5);
      EXPECT_EQ(a.agree, a.clear) << a.flipped;
    }
  }
}

// HeteroInfer's other two NPU baselines as plans: prompts of lengths with no standard NPU graph
// are compiled for on the spot (online-prepare) or run as a chain of standard graphs (pipe).
TEST_F(PlansOverServices, NpuGraphModePlansMatchTheReferenceTeacherForced) {
  uint32_t id_base = 2000;
  for (const char* variant : {"f16", "q8_0", "q4_0"}) {
    for (const char* name : {"npu-only:online-prepare", "npu-only:pipe"}) {
      SCOPED_TRACE(std::string(variant) + " " + name);
      auto e = engine(variant, name, nullptr, id_base);
      id_base += 100;
      const Agreement a = teacher_forced(*e, data_dir(), variant);
      EXPECT_GT(a.clear, 100);
      EXPECT_EQ(a.agree, a.clear) << describe(a);
      EXPECT_EQ(e->status()["buckets"][1]["plan"], name);
    }
  }
}

TEST_F(PlansOverServices, KilledDeviceMidDecodeIsRecoveredWithIdenticalTokens) {
  auto greedy = [](Engine& e, int kill_at, const std::function<void()>& kill) {
    const int V = e.model().hp().n_vocab;
    e.open_seq(1, 128);
    std::vector<int32_t> prompt = {1, 1342, 347, 1283, 262, 573};
    std::vector<float> logits = e.step({{1, prompt, 0, true}}, nullptr);
    std::vector<int32_t> out;
    for (int k = 0; k < 24; ++k) {
      out.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      const auto t0 = std::chrono::steady_clock::now();
      if (k == kill_at) kill();
      logits = e.step({{1, {out.back()}, static_cast<int32_t>(prompt.size() + k), true}}, nullptr);
      if (k == kill_at)
        std::printf("kill-to-next-token: %.1f ms\n",
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                        .count());
      EXPECT_EQ(logits.size(), static_cast<size_t>(V));
    }
    e.close_seq(1);
    return out;
  };
  auto e = engine("q8_0", "npu-only", nullptr, 50);
  const std::vector<int32_t> undisturbed = greedy(*e, -1, [] {});
  for (const char* victim : {"gpu", "npu"}) {
    SCOPED_TRACE(victim);
    const auto got = greedy(*e, 10, [&] {
      // What the supervisor does: the process dies, the stack epoch moves, a new one starts.
      (std::string(victim) == "gpu" ? gpu_ : npu_)->stop(SIGKILL);
      for (const auto& name : shm::list_stack_segments(stack_)) {
        if (name.find("-flags") == std::string::npos) continue;
        shm::Segment seg = shm::Segment::open(name);
        shm::FlagTable::attach(seg).bump_epoch();
      }
      start(victim);
    });
    EXPECT_EQ(got, undisturbed);
    EXPECT_GE(static_cast<int>(e->status()["recoveries"]), 1);
  }
}

TEST_F(PlansOverServices, AModelOutsideTheAllowedDirectoriesIsRefusedAndTheServicesStayUp) {
  // The services were started with --model in tests/data/tiny-fortune: only that directory.
  const std::string outside = run_dir_ + "/outside.gguf";
  std::filesystem::copy_file(model_path("q4_0"), outside);
  ProgramEngineOptions o;
  o.model_path = outside;
  o.stack_id = stack_;
  o.buckets = {1};
  o.max_seqs = 1;
  o.max_ctx = 32;
  o.segment_tag = "outside";
  o.program_id_base = 900;
  try {
    ProgramEngine e(o, LlamaModel::load(outside),
                    make_service_link("gpu_svc", endpoint(ServiceId::gpu)),
                    make_service_link("npu_svc", endpoint(ServiceId::npu)));
    FAIL() << "a model outside the allowed directories was mapped";
  } catch (const duet::Error& err) {
    EXPECT_EQ(err.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(err.what()).find("outside the allowed model directories"),
              std::string::npos)
        << err.what();
  }
  // Both services still serve a model inside.
  auto e = engine("q4_0", "npu-only", nullptr, 950);
  e->open_seq(1, 16);
  EXPECT_EQ(e->step({{1, {1, 1342}, 0, true}}, nullptr).size(), 2048u);
}

}  // namespace
}  // namespace duet::frontend
