#include "services/gpu_svc/gpu_profiler.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "core/base/error.h"
#include "core/model/quant.h"
#include "services/gpu_svc/weight_pack.h"

namespace duet::gpu {
namespace {

class DeviceBuffer {
 public:
  DeviceBuffer(ClDevice& dev, const std::vector<uint8_t>& bytes) {
    if (bytes.size() > dev.info().max_alloc_bytes)
      throw Error(Errc::out_of_range, "profile: a buffer of " + std::to_string(bytes.size()) +
                                          " bytes exceeds " + dev.info().name +
                                          "'s largest allocation");
    cl_int err = CL_SUCCESS;
    mem_ = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, bytes.size(),
                          const_cast<uint8_t*>(bytes.data()), &err);
    check_cl(err, "clCreateBuffer(profile)");
  }
  ~DeviceBuffer() { clReleaseMemObject(mem_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cl_mem mem() const { return mem_; }

 private:
  cl_mem mem_ = nullptr;
};

std::vector<uint8_t> random_rows(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t row_bytes = dtype_row_bytes(type, cols);
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = d(rng);
    quantize_row(type, row.data(), out.data() + static_cast<size_t>(r) * row_bytes, cols);
  }
  return out;
}

double event_us(cl_event e) {
  cl_ulong start = 0, end = 0;
  check_cl(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof start, &start, nullptr),
           "profiling");
  check_cl(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof end, &end, nullptr),
           "profiling");
  return static_cast<double>(end - start) / 1e3;
}

uint64_t align_up(uint64_t v) {
  return (v + 255) / 256 * 256;
}

}  // namespace

OpMeasurement measure_op(GpuKernels& kernels, const OpShape& s, uint32_t reps) {
  if (reps == 0 || reps > 10000)
    throw Error(Errc::invalid_argument, "profile: reps must be in [1, 10000]");
  if (s.m <= 0 || s.n <= 0 || s.n > 65536 || s.m > (int64_t{1} << 20) || s.k < 0 ||
      s.k > (int64_t{1} << 20))
    throw Error(Errc::invalid_argument, "profile: shape out of range: " + op_shape_name(s));
  ClDevice& dev = kernels.device();
  const auto n = static_cast<uint32_t>(s.n);
  const auto m = static_cast<uint32_t>(s.m);
  const auto k = static_cast<uint32_t>(s.k);
  const TokenRange all{0, n};

  // Arena: token table, then two activation tensors of n x max(m, k) floats.
  const uint64_t width = std::max<uint64_t>(m, k);
  const uint64_t tok = 0, a_off = align_up(uint64_t{n} * 16),
                 b_off = align_up(a_off + uint64_t{n} * width * 4),
                 c_off = align_up(b_off + uint64_t{n} * width * 4),
                 arena_bytes = align_up(c_off + uint64_t{n} * width * 4);
  std::vector<uint8_t> arena_host(arena_bytes, 0);
  auto* rows = reinterpret_cast<int32_t*>(arena_host.data());
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (uint64_t i = a_off; i + 4 <= arena_bytes; i += 4) {
    const float v = d(rng);
    std::memcpy(&arena_host[i], &v, 4);
  }
  for (uint32_t t = 0; t < n; ++t) {
    rows[4 * t + 0] = static_cast<int32_t>(t % std::max<uint32_t>(m, 1));
    rows[4 * t + 1] = static_cast<int32_t>(t);
    rows[4 * t + 2] = 0;
    rows[4 * t + 3] = static_cast<int32_t>(t);
  }
  DeviceBuffer arena(dev, arena_host);

  std::vector<uint8_t> weights_host;
  switch (s.kind) {
    case OpKind::MatMul:
    case OpKind::Logits:
    case OpKind::Embed:
      if (k == 0 || k % kQK != 0)
        throw Error(Errc::invalid_argument, "profile: k must be a positive multiple of 32");
      if (dtype_is_k_quant(s.wtype) && k % kQK_K != 0)
        throw Error(Errc::invalid_argument,
                    "profile: k of a K-quant weight must be a multiple of 256");
      kernel_type_suffix(s.wtype);
      weights_host = random_rows(s.wtype, m, k, 7);
      break;
    case OpKind::RmsNorm:
      weights_host = random_rows(DType::F32, 1, m, 7);
      break;
    default:
      weights_host.assign(64, 0);
      break;
  }
  // A discrete GPU's runner packs matmul weights at upload (weight_pack.h): time that layout.
  const bool packed = (s.kind == OpKind::MatMul || s.kind == OpKind::Logits) && !dev.zero_copy() &&
                      has_packed_layout(s.wtype);
  if (packed) {
    std::vector<uint8_t> file_layout = weights_host;
    pack_weights(s.wtype, m, k, file_layout.data(), weights_host.data());
  }
  DeviceBuffer weights(dev, weights_host);

  auto launch = [&]() -> cl_event {
    switch (s.kind) {
      case OpKind::MatMul:
      case OpKind::Logits: {
        MatmulArgs a{s.wtype, weights.mem(), 0, k, a_off, k, b_off, m, 0, m, all, tok, false};
        a.packed_rows = packed ? m : 0;
        return kernels.matmul(arena.mem(), a);
      }
      case OpKind::Embed:
        return kernels.embed(arena.mem(), s.wtype, weights.mem(), 0, k, tok, a_off, k, all);
      case OpKind::RmsNorm:
        return kernels.rmsnorm(arena.mem(), a_off, m, b_off, m, weights.mem(), 0, m, 1e-5f, all);
      case OpKind::Add:
        return kernels.add(arena.mem(), a_off, m, b_off, m, c_off, m, m, all);
      case OpKind::SwiGlu:
        return kernels.swiglu(arena.mem(), a_off, m, b_off, m, c_off, m, m, all);
      case OpKind::Rope:
        if (m % 64 != 0)
          throw Error(Errc::invalid_argument, "profile: rope width must be a multiple of 64");
        return kernels.rope(arena.mem(), a_off, m, m / 64, 64,
                            RopeArgs{10000.0f, 1.0f, 0, weights.mem(), 0, false}, tok, all);
      default:
        throw Error(Errc::unsupported, "profile: gpu_svc measures no " + op_kind_name(s.kind) +
                                           " ops (ask for modeled_only)");
    }
  };
  std::vector<double> times;
  for (uint32_t r = 0; r <= reps; ++r) {
    cl_event e = launch();
    const cl_int err = clWaitForEvents(1, &e);  // profiling: blocking is the point here
    const double us = err == CL_SUCCESS ? event_us(e) : 0;
    clReleaseEvent(e);
    check_cl(err, "clWaitForEvents(profile)");
    if (r > 0) times.push_back(us);  // the first run warms caches and the kernel
  }
  std::sort(times.begin(), times.end());
  return OpMeasurement{times[times.size() / 2], times.front(), reps};
}

}  // namespace duet::gpu
