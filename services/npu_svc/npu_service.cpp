#include "services/npu_svc/npu_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "core/base/error.h"
#include "core/base/fp16.h"
#include "core/ipc/service.h"
#include "core/model/quant.h"
#include "core/planner/npu_timing.h"
#include "shm/doorbell_step.h"

namespace duet::npu {
namespace {

using Clock = std::chrono::steady_clock;

// ProfileOp builds real tensors of the requested shape: keep them within what a phone model has.
constexpr uint64_t kMaxProfileWeightBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxProfileActivationFloats = uint64_t{1} << 26;
constexpr uint32_t kMaxProfileReps = 1000;

OpShape shape_of(fb::OpKind kind, fb::DTypeCode dtype, uint32_t rows, uint32_t cols,
                 uint32_t n_tokens, const char* what) {
  const auto raw_type = static_cast<uint32_t>(dtype);
  if (!dtype_known(raw_type))
    throw Error(Errc::invalid_argument,
                std::string(what) + ": unknown dtype " + std::to_string(raw_type));
  if (kind != fb::OpKind::MatMul && kind != fb::OpKind::Logits)
    throw Error(Errc::unsupported, std::string(what) + ": the NPU runs MatMul and Logits, not " +
                                       fb::EnumNameOpKind(kind));
  OpShape s;
  s.kind = static_cast<OpKind>(kind);
  s.wtype = static_cast<DType>(raw_type);
  s.m = rows;
  s.k = cols;
  s.n = n_tokens;
  if (s.m == 0 || s.k == 0 || s.n == 0)
    throw Error(Errc::invalid_argument,
                std::string(what) + ": rows, cols and n_tokens must be positive");
  if (s.k % dtype_block_elems(s.wtype) != 0)
    throw Error(Errc::invalid_argument, std::string(what) + ": cols " + std::to_string(s.k) +
                                            " is not a multiple of the " +
                                            std::string(dtype_name(s.wtype)) + " block");
  return s;
}

// Random weights of a type, with sane block scales (quantised types) so sums stay finite.
void fill_weights(std::vector<uint8_t>& bytes, DType type, int64_t rows, int64_t cols) {
  bytes.resize(static_cast<size_t>(rows) * dtype_row_bytes(type, cols));
  std::mt19937_64 rng(42);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, 8);
  }
  const size_t block = dtype_block_bytes(type);
  const uint16_t small = fp32_to_fp16(0.01f);
  const std::vector<size_t> scales = block_scale_offsets(type);  // d (and m/dmin) of a block
  for (size_t off = 0; off + block <= bytes.size(); off += block) {
    if (type == DType::F32) {
      const float f = 0.01f;
      std::memcpy(&bytes[off], &f, 4);
    } else if (scales.empty()) {
      std::memcpy(&bytes[off], &small, 2);  // an F16/BF16 element
    } else {
      for (size_t s : scales) std::memcpy(&bytes[off + s], &small, 2);
    }
  }
}

}  // namespace

NpuService::NpuService(SocProfile soc, int threads, MemoryResolver resolver,
                       std::vector<int64_t> standard_graph_tokens)
    : soc_(soc),
      graphs_(std::move(soc)),
      gemm_(threads),
      runner_(graphs_, gemm_),
      resolver_(std::move(resolver)),
      standard_tokens_(std::move(standard_graph_tokens)) {
  std::sort(standard_tokens_.begin(), standard_tokens_.end());
}

NpuService::~NpuService() {
  doorbells_.stop_all();  // stop serving rings before anything a step uses goes
}

msg::Bytes NpuService::register_program(const fb::Message& request) {
  const auto* body = request.body_as_RegisterProgram();
  if (!body || !body->program())
    throw Error(Errc::invalid_argument, "RegisterProgram without a program");
  fb::ProgramT program;
  body->program()->UnPackTo(&program);
  ResolvedMemory resolved = resolver_(program);
  const auto n_ops = static_cast<uint32_t>(program.ops.size());
  if (resolved.n_flags > 0) {
    // A flag index past the table would only fail mid-step, after earlier ops ran: refuse now.
    for (size_t i = 0; i < program.ops.size(); ++i) {
      const fb::OpT& op = *program.ops[i];
      for (uint32_t f : op.wait_flags)
        if (f >= resolved.n_flags)
          throw Error(Errc::out_of_range, "npu: op " + std::to_string(i) + " waits on flag " +
                                              std::to_string(f) + " past the table of " +
                                              std::to_string(resolved.n_flags));
      if (op.publish_flag >= 0 && static_cast<uint32_t>(op.publish_flag) >= resolved.n_flags)
        throw Error(Errc::out_of_range, "npu: op " + std::to_string(i) + " publishes flag " +
                                            std::to_string(op.publish_flag) +
                                            " past the table of " +
                                            std::to_string(resolved.n_flags));
    }
  }
  const uint32_t max_tokens = program.max_tokens;
  const bool doorbell = program.doorbell != nullptr;
  std::unique_ptr<shm::DoorbellListener> replaced;
  {
    std::lock_guard lock(mu_);
    replaced = doorbells_.attach(
        program, "npu_svc",
        [this](const shm::DoorbellRequest& r, shm::DoorbellListener::Deferred& after) {
          return run_rung(r, after);
        });
    hold_flag_[body->program_id()] = program.doorbell ? program.doorbell->hold_flag() : -1;
    runner_.register_program(body->program_id(), std::move(program), resolved.mem);
    memory_[body->program_id()] = std::move(resolved);
    for (int64_t n : standard_tokens_) {
      if (n <= 0 || n > std::numeric_limits<uint32_t>::max()) continue;
      const auto tokens = static_cast<uint32_t>(n);
      for (const OpShape& shape : runner_.graph_shapes(body->program_id(), tokens, tokens))
        graphs_.compile(shape);
      if (n >= max_tokens) break;
    }
  }
  replaced.reset();  // outside mu_: its thread may be waiting for it
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(fbb, request.request_id(),
                             fb::CreateProgramRegistered(fbb, body->program_id(), n_ops, doorbell));
}

StepReport NpuService::execute(uint32_t program_id, const StepArgs& step, uint32_t deadline_ms,
                               HeldFlag* held) {
  auto mem = memory_.find(program_id);
  if (mem == memory_.end())
    throw Error(Errc::not_found,
                "npu_svc: no program " + std::to_string(program_id) + " is registered");
  const auto deadline = Clock::now() + std::chrono::milliseconds(deadline_ms);
  if (!mem->second.make_flags)
    throw Error(Errc::invalid_argument,
                "npu_svc: program " + std::to_string(program_id) + " names no flags segment");
  std::unique_ptr<FlagSync> flags = mem->second.make_flags(deadline, step.epoch);
  std::unique_ptr<FlagSync> preemptible;
  if (step.preempt_flag >= 0) {
    if (!mem->second.make_preemptible)
      throw Error(Errc::unsupported,
                  "npu_svc: this program's memory does not support preemptible steps");
    preemptible = mem->second.make_preemptible(*flags, step, deadline);
  }
  FlagSync* sync = preemptible ? preemptible.get() : flags.get();
  std::optional<shm::HoldDoneFlag> hold;
  if (held) {
    hold.emplace(*sync, hold_flag_[program_id]);
    sync = &*hold;
  }
  const int64_t start_ns = device::steady_ns();
  StepReport r = runner_.run_step(program_id, step, *sync);
  ++steps_;
  trace_.record(device::step_trace_of(program_id, r, start_ns, device::steady_ns()));
  if (hold) *held = hold->held();
  return r;
}

shm::DoorbellReport NpuService::run_rung(const shm::DoorbellRequest& request,
                                         shm::DoorbellListener::Deferred& publish_after) {
  std::lock_guard lock(mu_);
  HeldFlag held;
  StepReport r;
  try {
    r = execute(request.program_id, shm::step_args_of(request), request.deadline_ms, &held);
  } catch (const Error&) {
    ++failed_steps_;
    throw;  // the listener reports its code and message, as StepFailed carries them
  }
  ++doorbell_steps_;
  if (held) publish_after.push_back(*held);
  return shm::doorbell_report_of(r);
}

msg::Bytes NpuService::run_step(const fb::Message& request) {
  const auto* body = request.body_as_RunStep();
  if (!body) throw Error(Errc::invalid_argument, "RunStep without a body");
  std::lock_guard lock(mu_);
  try {
    const StepArgs step = msg::step_args_of(*body);
    const StepReport r = execute(body->program_id(), step, body->deadline_ms(), nullptr);
    return msg::make_step_done(request.request_id(), *body, r);
  } catch (const Error& e) {
    ++failed_steps_;
    return msg::make_step_failed(request.request_id(), *body, e);
  }
}

msg::Bytes NpuService::compile_graph(const fb::Message& request) {
  const auto* body = request.body_as_CompileGraph();
  if (!body) throw Error(Errc::invalid_argument, "CompileGraph without a body");
  const OpShape shape = shape_of(body->kind(), body->dtype(), body->rows(), body->cols(),
                                 body->n_tokens(), "CompileGraph");
  std::lock_guard lock(mu_);  // the graph cache: never beside a step
  const GraphCache::Compiled c = graphs_.compile(shape);
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(
      fbb, request.request_id(),
      fb::CreateGraphCompiled(fbb, static_cast<float>(c.compile_us), c.cached));
}

msg::Bytes NpuService::profile_op(const fb::Message& request) {
  const auto* body = request.body_as_ProfileOp();
  if (!body) throw Error(Errc::invalid_argument, "ProfileOp without a body");
  const OpShape shape = shape_of(body->kind(), body->dtype(), body->rows(), body->cols(),
                                 body->n_tokens(), "ProfileOp");
  const double modeled = npu_modeled_us(soc_, shape);
  const uint32_t reps = body->modeled_only() ? 0 : std::max<uint32_t>(1, body->reps());
  if (reps > kMaxProfileReps)
    throw Error(Errc::out_of_range, "ProfileOp: reps " + std::to_string(reps) + " > " +
                                        std::to_string(kMaxProfileReps));
  double measured = 0;
  std::lock_guard lock(mu_);  // the NPU's thread pool and weights: never beside a step
  if (reps > 0) {
    const uint64_t weight_bytes = uint64_t(shape.m) * dtype_row_bytes(shape.wtype, shape.k);
    const uint64_t act_floats = uint64_t(shape.n) * uint64_t(shape.k + shape.m);
    if (weight_bytes > kMaxProfileWeightBytes || act_floats > kMaxProfileActivationFloats)
      throw Error(Errc::out_of_range,
                  "ProfileOp: " + op_shape_name(shape) + " is too large to measure here");
    fill_weights(profile_weights_, shape.wtype, shape.m, shape.k);
    const ops::Matrix w{shape.wtype, shape.m, shape.k, profile_weights_.data()};
    std::vector<float> x(size_t(shape.n * shape.k), 0.5f), y(size_t(shape.n * shape.m));
    std::vector<double> times;
    for (uint32_t i = 0; i < reps; ++i) {
      const auto t0 = Clock::now();
      gemm_.matmul(w, x.data(), shape.k, shape.n, y.data(), shape.m);
      times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    measured = times[times.size() / 2];
  }
  flatbuffers::FlatBufferBuilder fbb;
  return msg::finish_message(fbb, request.request_id(),
                             fb::CreateProfileResult(fbb, static_cast<float>(measured),
                                                     static_cast<float>(modeled), reps));
}

msg::Bytes NpuService::status(const fb::Message& request) {
  return msg::make_status_reply(request.request_id(), fb::ServiceKind::Npu, status_json().dump());
}

nlohmann::json NpuService::status_json() const {
  std::lock_guard lock(mu_);
  nlohmann::json graphs = nlohmann::json::array();
  for (const OpShape& s : graphs_.shapes()) graphs.push_back(op_shape_name(s));
  nlohmann::json programs = nlohmann::json::array();
  for (const auto& [id, mem] : memory_)
    programs.push_back({{"id", id}, {"ops", runner_.n_ops(id)}});
  return {
      {"soc", soc_.name},
      {"soc_path", soc_.path},
      {"npu",
       {{"cores", soc_.npu.cores},
        {"array", std::to_string(soc_.npu.array_rows) + "x" + std::to_string(soc_.npu.array_cols)},
        {"clock_ghz", soc_.npu.clock_ghz}}},
      {"graphs_cached", graphs_.size()},
      {"graphs", graphs},
      {"compile_us_total", graphs_.total_compile_us()},
      {"threads", gemm_.threads()},
      {"programs", programs},
      {"steps", steps_},
      {"doorbell_steps", doorbell_steps_},
      {"doorbells", doorbells_.size()},
      {"failed_steps", failed_steps_}};
}

void register_handlers(ServiceLoop& loop, NpuService& service) {
  NpuService* s = &service;
  loop.on(fb::Body::RegisterProgram, [s](const fb::Message& m) { return s->register_program(m); });
  loop.on(fb::Body::RunStep, [s](const fb::Message& m) { return s->run_step(m); });
  loop.on(fb::Body::CompileGraph, [s](const fb::Message& m) { return s->compile_graph(m); });
  loop.on(fb::Body::ProfileOp, [s](const fb::Message& m) { return s->profile_op(m); });
  loop.on(fb::Body::TraceRequest, [s](const fb::Message& m) { return s->trace(m); });
  loop.set_status([s] { return s->status_json(); });
}

}  // namespace duet::npu
