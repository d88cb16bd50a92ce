// Every plan, executed by the real gpu_svc (OpenCL on PoCL) and npu_svc (the NPU emulator)
// processes over ZeroMQ and shared memory, gives the reference's tokens on tiny-fortune:
// teacher-forced top-1 agreement wherever the reference's top-1 margin exceeds 0.05, for F16,
// Q8_0, Q4_0 and E0M4. Then a device is killed in the middle of decoding and the engine recovers.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "core/model/forward.h"
#include "core/model/quantize_file.h"
#include "core/planner/plan_store.h"
#include "core/planner/solver.h"
#include "services/frontend/program_engine.h"
#include "tests/core/model/llamacpp_data.h"
#include "tests/support/arch_models.h"
#include "tests/support/llamacpp_agreement.h"
#include "tests/support/service_process.h"
#include "tests/support/teacher_forced.h"

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

using test_support::ServiceProcess;

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
    slot = std::make_unique<ServiceProcess>(which, stack_, run_dir_, service_model_);
    ASSERT_GT(slot->pid(), 0);
  }
  std::string endpoint(ServiceId id) const {
    return ipc_endpoint(control_socket_path(run_dir_, id));
  }

  std::unique_ptr<ProgramEngine> engine(const std::string& variant, const std::string& plan_name,
                                        std::function<Plan(uint32_t)> plan_for, uint32_t id_base) {
    return engine_for(model_path(variant), plan_name, std::move(plan_for), id_base);
  }
  // An engine over the services for each tiny-fortune file (f16, q8_0, q4_0) and each of
  // `plans` (tensor: the solver's plan for the file), given to check(engine, variant); their
  // program ids from id_base on.
  void for_each_plan(const std::vector<std::string>& plans, uint32_t id_base,
                     const std::function<void(ProgramEngine&, const std::string&)>& check);
  std::unique_ptr<ProgramEngine> engine_for(const std::string& path, const std::string& plan_name,
                                            std::function<Plan(uint32_t)> plan_for,
                                            uint32_t id_base, bool per_bucket = false,
                                            std::vector<uint32_t> buckets = {1, 64}) {
    ProgramEngineOptions o;
    o.model_path = path;
    o.stack_id = stack_;
    o.plan_name = plan_name;
    o.plan_for = std::move(plan_for);
    o.per_bucket_programs = per_bucket;
    o.buckets = std::move(buckets);
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
  std::string service_model_ = model_path("q8_0");
  std::unique_ptr<ServiceProcess> gpu_, npu_;
};

Plan tensor_plan_for_path(const std::string& path, uint32_t bucket) {
  return modeled_plan_for(path, bucket);
}

Plan tensor_plan_for(const std::string& variant, uint32_t bucket) {
  return tensor_plan_for_path(model_path(variant), bucket);
}

void PlansOverServices::for_each_plan(
    const std::vector<std::string>& plans, uint32_t id_base,
    const std::function<void(ProgramEngine&, const std::string&)>& check) {
  for (const std::string variant : {"f16", "q8_0", "q4_0"})
    for (const std::string& name : plans) {
      SCOPED_TRACE(variant + " " + name);
      std::function<Plan(uint32_t)> plan_for;
      if (name == "tensor")
        plan_for = [variant](uint32_t b) { return tensor_plan_for(variant, b); };
      auto e = engine(variant, name, plan_for, id_base);
      id_base += 100;
      check(*e, variant);
    }
}

TEST_F(PlansOverServices, EveryPlanMatchesTheReferenceTeacherForced) {
  for_each_plan({"gpu-only", "npu-only", "tensor"}, 100,
                [](ProgramEngine& e, const std::string& variant) {
                  const Agreement a = teacher_forced(e, data_dir(), variant);
                  EXPECT_GT(a.clear, 100);
                  EXPECT_EQ(a.agree, a.clear) << describe(a);
                });
}

// Symbolic programs (one per model and distinct plan, issue 24) give the bits of per-bucket
// programs over the real services, on every plan: steps of every bucket (1, 4, 16, 64 tokens)
// and of sizes between them, logits compared byte for byte. `auto` is what it runs on this
// host: the solver's plan per bucket, decode on the GPU (emulated: gpu-only for 1, tensor above).
TEST_F(PlansOverServices, SymbolicProgramsGiveThePerBucketProgramsBits) {
  const std::string path = model_path("q8_0");
  auto tensor = [path](uint32_t b) { return tensor_plan_for_path(path, b); };
  const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
      {"gpu-only", nullptr},
      {"npu-only", nullptr},
      {"layer", nullptr},
      {"tensor", tensor},
      {"auto", [tensor](uint32_t b) { return b == 1 ? Plan::gpu_only() : tensor(b); }},
  };
  const std::vector<uint32_t> buckets = {1, 4, 16, 64};
  uint32_t id_base = 6000;
  for (const auto& [name, plan_for] : plans) {
    SCOPED_TRACE(name);
    auto per_bucket = engine_for(path, name, plan_for, id_base, true, buckets);
    auto symbolic = engine_for(path, name, plan_for, id_base + 100, false, buckets);
    id_base += 200;
    EXPECT_EQ(per_bucket->registration().programs, buckets.size());
    // One program for a fixed plan; one per distinct placement for the solver's.
    if (!plan_for) {
      EXPECT_EQ(symbolic->registration().programs, 1u);
    }
    EXPECT_LE(symbolic->registration().programs, buckets.size());
    EXPECT_LE(symbolic->registration().arena_bytes, per_bucket->registration().arena_bytes);
    for (ProgramEngine* e : {per_bucket.get(), symbolic.get()}) e->open_seq(1, 128);
    std::vector<int32_t> tokens = {1, 703, 1975, 310, 263, 1243, 1892, 322, 42};
    int pos = 0;
    for (const size_t n : {size_t{9}, size_t{1}, size_t{3}, size_t{1}, size_t{12}, size_t{40},
                           size_t{1}, size_t{4}, size_t{16}, size_t{1}}) {
      std::vector<int32_t> step(tokens.end() - static_cast<long>(std::min(n, tokens.size())),
                                tokens.end());
      while (step.size() < n) step.push_back(static_cast<int32_t>(3 + (pos + step.size()) % 500));
      const std::vector<float> a = per_bucket->step({{1, step, pos, true}}, nullptr);
      const std::vector<float> b = symbolic->step({{1, step, pos, true}}, nullptr);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
          << n << " tokens at " << pos;
      pos += static_cast<int>(n);
      tokens.push_back(static_cast<int32_t>(std::max_element(a.begin(), a.end()) - a.begin()));
    }
  }
}

// The same plans held to llama.cpp's answers on the same files (tests/data/llamacpp/
// logits-fortune-*.json): top-1 equal wherever llama.cpp's margin exceeds its own noise.
TEST_F(PlansOverServices, EveryPlanMatchesLlamacppTeacherForced) {
  std::map<std::string, nlohmann::json> answers;
  for (const char* variant : {"f16", "q8_0", "q4_0"})
    answers[variant] = test_support::load_json(
        std::string(DUET_SOURCE_DIR) + "/tests/data/llamacpp/logits-fortune-" + variant + ".json");
  for_each_plan({"gpu-only", "npu-only", "npu-only:pipe", "tensor"}, 3000,
                [&](ProgramEngine& e, const std::string& variant) {
                  const auto a = test_support::llamacpp_teacher_forced(e, answers.at(variant), 1);
                  EXPECT_GE(a.clear, 5);
                  EXPECT_EQ(a.agree, a.clear) << a.flipped;
                });
}

// The same on K-quant files (issue 19): tiny-fortune quantised by `duet quantize` to Q4_K_M,
// Q5_K_M and Q6_K (regenerated as tests/data/llamacpp/models.json records them), every plan's
// top-1 equal to llama.cpp's on the same file wherever its margin exceeds its own noise.
TEST_F(PlansOverServices, EveryPlanMatchesLlamacppTeacherForcedOnKQuantFiles) {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("duet-kq-plans-" + std::to_string(getpid()));
  const auto models = testdata::regenerate_mkmodel_files(dir);
  // The device services map models from their --model's directory only: restart them there.
  for (const auto& m : models.at("models"))
    if (m.contains("quantize_args"))
      service_model_ = (dir / m.at("file").get<std::string>()).string();
  start("gpu");
  start("npu");
  std::map<std::string, double> noise_kl;  // type -> llama.cpp's mean KL against the exact pass
  const auto noise = testdata::load_json(testdata::llamacpp_dir() + "noise-kquant-fortune.json");
  for (const auto& r : noise.at("results"))
    noise_kl[r.at("variant").get<std::string>()] = r.at("mean_kl").get<double>();
  uint32_t id_base = 4000;
  int files = 0;
  for (const auto& m : models.at("models")) {
    const std::string name = m.at("name");
    if (!m.contains("quantize_args") || !name.starts_with("fortune-")) continue;
    const std::string path = (dir / m.at("file").get<std::string>()).string();
    const auto answer = testdata::load_json(testdata::llamacpp_dir() + "logits-" + name + ".json");
    ASSERT_EQ(answer.at("model_sha256"), m.at("sha256")) << name;
    const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
        {"gpu-only", nullptr},
        {"npu-only", nullptr},
        {"tensor", [path](uint32_t b) { return tensor_plan_for_path(path, b); }},
    };
    for (const auto& [plan, plan_for] : plans) {
      SCOPED_TRACE(name + " " + plan);
      auto e = engine_for(path, plan, plan_for, id_base);
      id_base += 100;
      const auto a = test_support::llamacpp_teacher_forced(*e, answer, 1);
      const double bound = 2 * noise_kl.at(m.at("type").get<std::string>());
      std::printf(
          "%s, plan %s: top-1 equal to llama.cpp's at %d of %d clear positions, mean "
          "KL(llama.cpp || duet) %.3g nats over %d positions (bound %.3g)\n",
          name.c_str(), plan.c_str(), a.agree, a.clear, a.mean_kl(), a.positions, bound);
      EXPECT_GE(a.clear, 5);
      EXPECT_LE(a.mean_kl(), bound);
      EXPECT_EQ(a.agree, a.clear) << a.flipped;
    }
    ++files;
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(files, 3);  // q4_k_m, q5_k_m, q6_k
}

// E0M4 (duet's FP4, core/quant_e0m4.h) has no llama.cpp or HF answer: `duet quantize --type
// e0m4` of the F16 file is held to duet's reference forward pass on that same file (the
// reference op's dequantisation), teacher-forced on the reference sequences, in every plan.
TEST_F(PlansOverServices, EveryPlanMatchesTheReferenceTeacherForcedOnE0M4) {
  const auto dir =
      std::filesystem::path(::testing::TempDir()) / ("duet-e0m4-plans-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir / "teacher-forced");
  const std::string path = (dir / "fortune-e0m4.gguf").string();
  QuantizeOptions qo;
  qo.type = "e0m4";
  quantize_file(model_path("f16"), path, qo);
  // The reference's logits of every position of the F16 answer's sequences, in its layout.
  const auto answer = testdata::load_json(data_dir() + "teacher-forced/f16.json");
  {
    const auto model = LlamaModel::load(path);
    std::ofstream logits(dir / "teacher-forced" / "e0m4.logits.f32", std::ios::binary);
    for (const auto& seq : answer.at("sequences")) {
      ReferenceForward ref(*model);
      const std::vector<int32_t> ids = seq.at("ids");
      const std::vector<float> rows = ref.forward(ids, true);
      logits.write(reinterpret_cast<const char*>(rows.data()),
                   static_cast<std::streamsize>(rows.size() * sizeof(float)));
    }
    std::ofstream(dir / "teacher-forced" / "e0m4.json") << answer.dump();
  }
  service_model_ = path;  // the services map models from their --model's directory only
  start("gpu");
  start("npu");
  uint32_t id_base = 5000;
  const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
      {"gpu-only", nullptr},
      {"npu-only", nullptr},
      {"tensor", [path](uint32_t b) { return tensor_plan_for_path(path, b); }},
  };
  for (const auto& [name, plan_for] : plans) {
    SCOPED_TRACE("e0m4 " + name);
    auto e = engine_for(path, name, plan_for, id_base);
    id_base += 100;
    const Agreement a = teacher_forced(*e, dir.string() + "/", "e0m4");
    std::printf("e0m4, plan %s: top-1 equal to the reference at %d of %d clear positions\n",
                name.c_str(), a.agree, a.clear);
    EXPECT_GT(a.clear, 100);
    EXPECT_EQ(a.agree, a.clear) << describe(a);
  }
  std::filesystem::remove_all(dir);
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

const test_support::ArchModelDirCleanup arch_model_cleanup;

// The device services map models from the arch models' directory. CPU OpenCL devices quantise
// matmul activations to 8 bits by default (logits move by ~0.3); 16 bits here hold every plan to
// the reference tightly enough that a wrong rope, bias or scale (~1-3) cannot hide.
class ArchPlansOverServices : public PlansOverServices {
 protected:
  ArchPlansOverServices() {
    service_model_ =
        test_support::arch_model_path(test_support::arch_models().front(), DType::Q8_0);
  }
  void SetUp() override {
    ::setenv("DUET_GPU_INT8_ACT_BITS", "16", 1);
    PlansOverServices::SetUp();
  }
  void TearDown() override {
    PlansOverServices::TearDown();
    ::unsetenv("DUET_GPU_INT8_ACT_BITS");
  }
};

// Every plan over the real gpu_svc and npu_svc: the prompt's and each decode step's logits
// against the reference forward pass (NPU matmuls take fp16 activations: up to ~6e-3).
TEST_F(ArchPlansOverServices, EveryArchitectureInEveryPlanMatchesTheReference) {
  const std::vector<int32_t> prompt = {1, 703, 1975, 310, 263,  1243, 1892, 322, 42,  17,
                                       5, 900, 1200, 77,  1500, 33,   640,  98,  301, 2000};
  const std::vector<int32_t> decode = {100, 7, 1500, 12, 1999, 256, 3, 880};
  uint32_t id_base = 5000;
  for (const auto& am : test_support::arch_models()) {
    for (DType type : {DType::F16, DType::Q8_0, DType::Q4_0}) {
      const std::string path = test_support::arch_model_path(am, type);
      const auto model = LlamaModel::load(path);
      const int V = model->hp().n_vocab;
      const std::vector<std::pair<std::string, std::function<Plan(uint32_t)>>> plans = {
          {"gpu-only", nullptr},
          {"npu-only", nullptr},
          {"npu-only:online-prepare", nullptr},
          {"npu-only:pipe", nullptr},
          {"layer", nullptr},
          {"tensor", [path](uint32_t b) { return tensor_plan_for_path(path, b); }},
      };
      for (const auto& [name, plan_for] : plans) {
        SCOPED_TRACE(am.name + " " + std::string(dtype_name(type)) + " " + name);
        auto e = engine_for(path, name, plan_for, id_base);
        id_base += 100;
        ReferenceForward ref(*model, 64);
        e->open_seq(1, 64);
        float max_diff = 0, logit_scale = 0;
        int clear = 0, agree = 0;  // top-1 where the reference's leads by > kClearMargin
        auto compare = [&](const std::vector<float>& got, const std::vector<float>& want) {
          ASSERT_EQ(got.size(), static_cast<size_t>(V));
          for (int i = 0; i < V; ++i) {
            max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
            logit_scale = std::max(logit_scale, std::fabs(want[i]));
          }
          std::vector<float> sorted = want;
          std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(),
                            std::greater<float>());
          if (sorted[0] - sorted[1] <= test_support::kClearMargin) return;
          ++clear;
          agree += std::max_element(got.begin(), got.end()) - got.begin() ==
                   std::max_element(want.begin(), want.end()) - want.begin();
        };
        compare(e->step({{1, prompt, 0, true}}, nullptr), ref.forward(prompt, false));
        int pos = static_cast<int>(prompt.size());
        for (int32_t tok : decode)
          compare(e->step({{1, {tok}, pos++, true}}, nullptr),
                  ref.forward(std::vector<int32_t>{tok}, false));
        e->close_seq(1);
        // Relative to the logits' size (the NPU's fp16 activations round relative to them):
        // measured up to 1.9e-3 of the largest |logit| with the NPU (gemma 0.019 of ~10, the
        // others up to 6e-3 of ~3.6), up to 8.4e-4 GPU only.
        EXPECT_LT(max_diff, 5e-3f * logit_scale);
        EXPECT_GE(clear, 5);
        EXPECT_EQ(agree, clear);
        std::printf("%s %s %s: max |logit - reference| %.5f (largest |logit| %.2f)\n",
                    am.name.c_str(), std::string(dtype_name(type)).c_str(), name.c_str(), max_diff,
                    logit_scale);
      }
    }
  }
}

}  // namespace
}  // namespace duet::frontend
