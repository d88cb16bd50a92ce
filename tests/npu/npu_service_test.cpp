// npu_svc's handlers, called directly with real control messages over real shared memory: the
// tiny-fortune npu-only program registered from shm segments, compiled graphs, a step run next
// to the GPU half (the reference interpreter on another thread, real shm completion flags),
// ProfileOp, status, and bad requests answered with errors while the service stays usable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "core/base/error.h"
#include "core/ipc/messaging.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/planner/npu_timing.h"
#include "core/program/program.h"
#include "services/npu_svc/npu_service.h"
#include "shm/completion_flag.h"
#include "shm/flag_sync.h"
#include "shm/segment.h"
#include "tests/support/error_code.h"
#include "tests/support/program_setup.h"

namespace duet {
namespace {

using Clock = std::chrono::steady_clock;
using test_support::error_code_of;

template <class Build>
msg::Bytes make_request(Build&& build) {
  flatbuffers::FlatBufferBuilder fbb;
  auto body = build(fbb);
  return msg::finish_message(fbb, 1, body);
}

const fb::Message& parse(const msg::Bytes& bytes) {
  return *msg::verify_control(bytes);
}

// A stack's data plane for the tiny model: arena, KV and flags segments in /dev/shm.
class ServiceFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LlamaModel::load(std::string(DUET_SOURCE_DIR) +
                              "/tests/data/tiny-fortune/fortune-q8_0.gguf");
    const std::string stack = "npusvc" + std::to_string(::getpid());
    Plan plan = Plan::npu_only();
    plan.npu_mode = NpuGraphMode::exact;
    ProgramSpec spec = test_support::program_spec(*model_, plan, 8, 64, "tiny-fortune/npu-only");
    spec.arena_segment = shm::segment_name(stack, "arena");
    spec.kv_segment = shm::segment_name(stack, "kv");
    spec.flags_segment = shm::segment_name(stack, "flags");
    built_ = build_programs(spec);
    built_.npu.model_path = built_.gpu.model_path = model_->file().path();
    arena_ = shm::Segment::create(spec.arena_segment, built_.arena.bytes,
                                  shm::Lifetime::unlink_on_destroy);
    kv_ =
        shm::Segment::create(spec.kv_segment, built_.kv.bytes(), shm::Lifetime::unlink_on_destroy);
    const uint32_t n_flags = built_.n_flags + 1;
    flags_ = shm::Segment::create(spec.flags_segment, shm::FlagTable::bytes_for(n_flags),
                                  shm::Lifetime::unlink_on_destroy);
    table_ = shm::FlagTable::format(flags_, n_flags);
    test_support::fill_page_table(arena_.data(), built_);
    service_ = std::make_unique<npu::NpuService>(load_soc_profile("sd8gen3"), 2,
                                                 ShmMemoryResolver("npu_svc"));
  }

  msg::Bytes register_npu(uint32_t id, const fb::ProgramT& program) {
    const msg::Bytes req = make_request([&](flatbuffers::FlatBufferBuilder& fbb) {
      return fb::CreateRegisterProgram(fbb, id, fb::Program::Pack(fbb, &program));
    });
    return service_->register_program(parse(req));
  }

  msg::Bytes run_step(uint32_t id, uint64_t seq, uint32_t n_tokens) {
    const msg::Bytes req = make_request([&](flatbuffers::FlatBufferBuilder& fbb) {
      const fb::TensorRef tokens(fb::SegmentKind::Arena, fb::DTypeCode::F32, built_.arena.tokens,
                                 n_tokens, 4, 0);
      const fb::TensorRef pages(fb::SegmentKind::Arena, fb::DTypeCode::F32,
                                built_.arena.page_tables, 1, built_.max_pages_per_seq, 0);
      return fb::CreateRunStep(fbb, id, seq, n_tokens, 1, &tokens, &pages, 10000);
    });
    return service_->run_step(parse(req));
  }

  nlohmann::json status() {
    const msg::Bytes req = make_request(
        [](flatbuffers::FlatBufferBuilder& fbb) { return fb::CreateStatusRequest(fbb); });
    const msg::Bytes reply = service_->status(parse(req));
    return nlohmann::json::parse(parse(reply).body_as_StatusReply()->json()->str());
  }

  std::unique_ptr<LlamaModel> model_;
  BuiltPrograms built_;
  shm::Segment arena_, kv_, flags_;
  shm::FlagTable table_;
  std::unique_ptr<npu::NpuService> service_;
};

TEST_F(ServiceFixture, RunsTheNpuHalfOfAStepOverSharedMemory) {
  const msg::Bytes reg = register_npu(3, built_.npu);
  ASSERT_EQ(parse(reg).body_type(), fb::Body::ProgramRegistered);
  EXPECT_EQ(parse(reg).body_as_ProgramRegistered()->n_ops(), built_.npu.ops.size());
  // Registration prepared the standard-length graphs offline: 1 and 32 (the first >= max_tokens 8).
  std::set<std::string> standard;
  for (uint32_t n : {1u, 32u})
    for (const OpShape& s : service_->runner().graph_shapes(3, n, n))
      standard.insert(op_shape_name(s));
  EXPECT_EQ(status()["graphs_cached"], standard.size());
  size_t compiled_now = 0;

  // No graphs yet: the step fails cleanly (before any op waits) and names the shape.
  const std::vector<int32_t> prompt = {1, 703, 1975, 310};
  test_support::write_token_rows(arena_.data(), built_, prompt, 0,
                                 test_support::LogitsRows::last_token);
  msg::Bytes reply = run_step(3, 1, 4);
  ASSERT_EQ(parse(reply).body_type(), fb::Body::StepFailed);
  EXPECT_EQ(parse(reply).body_as_StepFailed()->code(), fb::Code::NotFound);
  EXPECT_NE(parse(reply).body_as_StepFailed()->message()->str().find("n=4"), std::string::npos);

  // Compile the step's graphs through CompileGraph, as a deployment does ahead of time.
  for (const OpShape& s : service_->runner().graph_shapes(3, 4, 1)) {
    const msg::Bytes req = make_request([&](flatbuffers::FlatBufferBuilder& fbb) {
      return fb::CreateCompileGraph(fbb, static_cast<fb::OpKind>(s.kind),
                                    static_cast<fb::DTypeCode>(s.wtype), static_cast<uint32_t>(s.m),
                                    static_cast<uint32_t>(s.k), static_cast<uint32_t>(s.n));
    });
    const auto* compiled = parse(service_->compile_graph(parse(req))).body_as_GraphCompiled();
    ASSERT_NE(compiled, nullptr);
    EXPECT_GT(compiled->modeled_compile_us(), 0.0f);
    compiled_now += compiled->cached() ? 0 : 1;
  }
  EXPECT_GT(compiled_now, 0u);

  // The GPU half runs on another thread against the same segments and shm flags.
  const ProgramMemory mem{arena_.data(), arena_.size(),         kv_.data(),
                          kv_.size(),    model_->file().data(), model_->file().size()};
  const StepArgs args = test_support::step_args(built_, 2, 4);
  std::exception_ptr gpu_error;
  std::thread gpu([&] {
    try {
      shm::ShmFlagSync sync(table_, Clock::now() + std::chrono::seconds(20), table_.epoch());
      interpret_program(built_.gpu, mem, args, sync);
    } catch (...) {
      gpu_error = std::current_exception();
    }
  });
  reply = run_step(3, 2, 4);
  gpu.join();
  if (gpu_error) std::rethrow_exception(gpu_error);
  ASSERT_EQ(parse(reply).body_type(), fb::Body::StepDone)
      << parse(reply).body_as_StepFailed()->message()->str();
  const auto* done = parse(reply).body_as_StepDone();
  EXPECT_EQ(done->step_seq(), 2u);
  EXPECT_EQ(done->op_times()->size(), built_.npu.ops.size());
  EXPECT_GT(done->modeled_us(), 0.0f);
  EXPECT_GT(done->measured_us(), 0.0f);
  for (const fb::OpTime* t : *done->op_times()) EXPECT_GT(t->modeled_us(), 0.0f);

  ReferenceForward ref(*model_, 64);
  const std::vector<float> want = ref.forward(prompt, false);
  const float* got = reinterpret_cast<const float*>(arena_.data() + built_.arena.logits);
  const int best = static_cast<int>(std::max_element(want.begin(), want.end()) - want.begin());
  EXPECT_EQ(std::max_element(got, got + want.size()) - got, best);
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 0.05f + 0.02f * std::fabs(want[i])) << i;

  const nlohmann::json st = status();
  EXPECT_EQ(st["soc"], "sd8gen3");
  EXPECT_EQ(st["graphs_cached"], standard.size() + compiled_now);
  EXPECT_GT(st["compile_us_total"].get<double>(), 0.0);
  EXPECT_EQ(st["steps"], 1);
  EXPECT_EQ(st["failed_steps"], 1);
}

TEST_F(ServiceFixture, BadRequestsGetClearErrorsAndTheServiceStaysUp) {
  std::string msg;
  // A program whose segments do not exist.
  fb::ProgramT missing = built_.npu;
  missing.arena_segment = "/duet-nosuchstack-arena";
  EXPECT_EQ(error_code_of([&] { register_npu(1, missing); }, &msg), Errc::not_found);
  // Offsets outside the arena, oversized tensors.
  fb::ProgramT outside = built_.npu;
  auto& in0 = *outside.ops[0]->in0;
  in0 = fb::TensorRef(in0.segment(), in0.dtype(), arena_.size() - 16, in0.rows(), in0.cols(),
                      in0.slot());
  EXPECT_EQ(error_code_of([&] { register_npu(1, outside); }, &msg), Errc::out_of_range);
  EXPECT_NE(msg.find("does not fit its slot"), std::string::npos) << msg;  // symbolic.h
  // A flag index past the stack's flag table.
  fb::ProgramT bad_flag = built_.npu;
  bad_flag.ops[0]->wait_flags.push_back(table_.size() + 5);
  EXPECT_EQ(error_code_of([&] { register_npu(1, bad_flag); }, &msg), Errc::out_of_range);
  EXPECT_NE(msg.find("past the table"), std::string::npos) << msg;
  // Unknown program on RunStep: StepFailed, not a crash.
  const msg::Bytes reply = run_step(99, 1, 1);
  ASSERT_EQ(parse(reply).body_type(), fb::Body::StepFailed);
  EXPECT_EQ(parse(reply).body_as_StepFailed()->code(), fb::Code::NotFound);

  auto compile = [&](fb::OpKind kind, fb::DTypeCode dtype, uint32_t rows, uint32_t cols,
                     uint32_t n) {
    const msg::Bytes req = make_request([&](flatbuffers::FlatBufferBuilder& fbb) {
      return fb::CreateCompileGraph(fbb, kind, dtype, rows, cols, n);
    });
    return service_->compile_graph(parse(req));
  };
  EXPECT_EQ(error_code_of([&] { compile(fb::OpKind::RmsNorm, fb::DTypeCode::F32, 64, 64, 1); }),
            Errc::unsupported);
  EXPECT_EQ(
      error_code_of([&] { compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 64, 40, 1); }, &msg),
      Errc::invalid_argument);
  EXPECT_NE(msg.find("block"), std::string::npos) << msg;
  EXPECT_EQ(error_code_of(
                [&] { compile(fb::OpKind::MatMul, static_cast<fb::DTypeCode>(77), 64, 64, 1); }),
            Errc::invalid_argument);
  EXPECT_EQ(error_code_of([&] { compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 64, 64, 0); }),
            Errc::invalid_argument);
  // The same graph twice: compiled once, then cached.
  EXPECT_FALSE(parse(compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 4096, 4096, 128))
                   .body_as_GraphCompiled()
                   ->cached());
  EXPECT_TRUE(parse(compile(fb::OpKind::MatMul, fb::DTypeCode::Q4_0, 4096, 4096, 128))
                  .body_as_GraphCompiled()
                  ->cached());

  // Still serving: a good registration and status.
  EXPECT_EQ(status()["graphs_cached"], 1);
  ASSERT_EQ(parse(register_npu(1, built_.npu)).body_type(), fb::Body::ProgramRegistered);
  EXPECT_GT(status()["graphs_cached"], 1);
}

TEST_F(ServiceFixture, ProfileOpMeasuresTheEmulatorAndReportsTheModel) {
  auto profile = [&](uint32_t rows, uint32_t cols, uint32_t n, uint32_t reps, bool modeled_only) {
    const msg::Bytes req = make_request([&](flatbuffers::FlatBufferBuilder& fbb) {
      return fb::CreateProfileOp(fbb, fb::OpKind::MatMul, fb::DTypeCode::Q4_0, rows, cols, n, reps,
                                 modeled_only);
    });
    return service_->profile_op(parse(req));
  };
  const msg::Bytes measured = profile(512, 1024, 8, 3, false);
  const auto* r = parse(measured).body_as_ProfileResult();
  EXPECT_GT(r->measured_us(), 0.0f);
  EXPECT_EQ(r->reps(), 3u);
  OpShape s;
  s.wtype = DType::Q4_0;
  s.m = 512;
  s.k = 1024;
  s.n = 8;
  EXPECT_FLOAT_EQ(r->modeled_us(),
                  static_cast<float>(npu_modeled_us(load_soc_profile("sd8gen3"), s)));
  // Modelled only: Llama-8B sizes cost nothing to ask.
  const msg::Bytes big = profile(28672, 4096, 256, 5, true);
  EXPECT_EQ(parse(big).body_as_ProfileResult()->measured_us(), 0.0f);
  EXPECT_GT(parse(big).body_as_ProfileResult()->modeled_us(), 1000.0f);
  EXPECT_EQ(error_code_of([&] { profile(1u << 20, 1u << 14, 1, 1, false); }), Errc::out_of_range);
  EXPECT_EQ(error_code_of([&] { profile(64, 64, 1, 100000, false); }), Errc::out_of_range);
}

}  // namespace
}  // namespace duet
