#pragma once
// Test helpers: host memory mirrored into an OpenCL buffer the way the runner does it (in place
// on host-unified devices, copied on discrete GPUs), random data, and what the matmul tests
// share (their shapes, the integer path's fixture, the check against dequantised weights).
#include <CL/cl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/base/error.h"
#include "core/model/dtype.h"
#include "core/model/quant.h"
#include "services/gpu_svc/cl_device.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "tests/support/scoped_env.h"

namespace duet::gpu::testing {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Page-aligned host bytes and their buffer. upload()/download() are no-ops when zero-copy.
class HostBuffer {
 public:
  HostBuffer(ClDevice& dev, size_t bytes) : dev_(dev), bytes_((bytes + 4095) / 4096 * 4096) {
    host_.reset(std::aligned_alloc(4096, bytes_));
    std::memset(host_.get(), 0, bytes_);
    cl_int err = CL_SUCCESS;
    mem_ = clCreateBuffer(
        dev.context(),
        CL_MEM_READ_WRITE | (dev.zero_copy() ? CL_MEM_USE_HOST_PTR : CL_MEM_COPY_HOST_PTR), bytes_,
        host_.get(), &err);
    check_cl(err, "clCreateBuffer");
  }
  // A copy of `bytes` (weights), already on the device.
  HostBuffer(ClDevice& dev, const std::vector<uint8_t>& bytes) : HostBuffer(dev, bytes.size()) {
    std::memcpy(host_.get(), bytes.data(), bytes.size());
    upload();
  }
  ~HostBuffer() { clReleaseMemObject(mem_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  template <typename T = uint8_t>
  T* at(uint64_t offset) {
    return reinterpret_cast<T*>(static_cast<uint8_t*>(host_.get()) + offset);
  }
  cl_mem mem() const { return mem_; }
  size_t bytes() const { return bytes_; }
  void upload() {
    if (!dev_.zero_copy())
      check_cl(clEnqueueWriteBuffer(dev_.queue(), mem_, CL_TRUE, 0, bytes_, host_.get(), 0, nullptr,
                                    nullptr),
               "write");
  }
  // Waits for the queue, then brings the buffer back (copies mode).
  void download() {
    check_cl(clFinish(dev_.queue()), "clFinish");
    if (!dev_.zero_copy())
      check_cl(clEnqueueReadBuffer(dev_.queue(), mem_, CL_TRUE, 0, bytes_, host_.get(), 0, nullptr,
                                   nullptr),
               "read");
  }

 private:
  ClDevice& dev_;
  size_t bytes_;
  std::unique_ptr<void, FreeDeleter> host_;
  cl_mem mem_ = nullptr;
};

// Waits for a kernel launch and releases its event.
inline void run(cl_event e) {
  check_cl(clWaitForEvents(1, &e), "clWaitForEvents");
  clReleaseEvent(e);
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// rows x cols weights of `type` (quantised from random floats), as stored bytes.
inline std::vector<uint8_t> random_weights(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto f = random_floats(static_cast<size_t>(rows * cols), seed);
  std::vector<uint8_t> out(dtype_row_bytes(type, cols) * rows);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, f.data() + r * cols, out.data() + r * dtype_row_bytes(type, cols), cols);
  return out;
}

// y = W x over all `rows` rows of W (rows x k, at w_off of `w` in the file's layout) for
// `tokens`: token t's k input floats at x_off + 4 k t, its `rows` outputs at y_off + 4 rows t.
inline MatmulArgs matmul_args(DType type, cl_mem w, uint64_t w_off, uint32_t rows, uint32_t k,
                              uint64_t x_off, uint64_t y_off, TokenRange tokens) {
  return MatmulArgs{.wtype = type,
                    .w = w,
                    .w_off = w_off,
                    .k = k,
                    .x_off = x_off,
                    .x_stride = k,
                    .y_off = y_off,
                    .y_stride = rows,
                    .row_begin = 0,
                    .row_end = rows,
                    .tokens = tokens};
}

// ScopedEnv: tests/support/scoped_env.h (what GpuKernels reads when it is built).
using test_support::ScopedEnv;

// Rows [row_begin, row_end) of a rows x cols weight tensor are computed.
struct MatmulShape {
  uint32_t rows, cols, row_begin, row_end;
};

// Whether the device has the integer matmul path (CPU devices); switches it on when it has.
inline bool int8_path_available(GpuKernels& k) {
  try {
    k.set_int8_matmul(true);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The ISAs of the integer kernels k's device runs: portable, then VNNI where the CPU has AVX-512
// VNNI, then AMX where it has AMX-INT8 and the tile state is granted (k is left on the last).
inline std::vector<GpuKernels::Int8Isa> integer_isas(GpuKernels& k) {
  using Isa = GpuKernels::Int8Isa;
  std::vector<Isa> out{Isa::portable};
  for (const Isa isa : {Isa::vnni, Isa::amx}) {
    try {
      k.set_int8_isa(isa);
      out.push_back(isa);
    } catch (const Error&) {
      std::printf("note: no %s here\n", GpuKernels::int8_isa_name(isa));
      break;
    }
  }
  return out;
}

// (weight type, activation bits): kernels on the integer path at those bits (skipped on devices
// without it).
class Int8MatmulTest : public ::testing::TestWithParam<std::tuple<DType, int>> {
 protected:
  void SetUp() override {
    if (!int8_path_available(kernels)) GTEST_SKIP() << "no integer path on " << dev.info().name;
    kernels.set_int8_act_bits(bits);
  }
  std::vector<GpuKernels::Int8Isa> integer_isas() { return testing::integer_isas(kernels); }

  const DType type = std::get<0>(GetParam());
  const int bits = std::get<1>(GetParam());
  ClDevice& dev = shared_device();
  GpuKernels kernels{dev};
};

// INSTANTIATE_TEST_SUITE_P's name of an Int8MatmulTest case: "Q4_0_a8".
inline std::string int8_case_name(const ::testing::TestParamInfo<std::tuple<DType, int>>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_a" +
         std::to_string(std::get<1>(info.param));
}

// A type's kernels, one case per weight type (the fp32 kernels' tests).
class WeightTypeTest : public ::testing::TestWithParam<DType> {
 protected:
  const DType type = GetParam();
  ClDevice& dev = shared_device();
  GpuKernels kernels{dev};
};

// INSTANTIATE_TEST_SUITE_P's name of a WeightTypeTest case: "Q4_K".
inline std::string dtype_case_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

// The worst error of y (token t's output row at y + t s.rows) against the fp64 matmul of the
// dense weights (s.rows x s.cols) and x (token t's inputs at x + t s.cols), over tokens
// [t_begin, t_begin + n) and rows [s.row_begin, s.row_end), relative to sum |w x|. NaN if any
// output is NaN.
inline double worst_relative_error(const std::vector<float>& dense, const MatmulShape& s,
                                   const std::vector<float>& x, uint32_t t_begin, uint32_t n,
                                   const float* y) {
  double worst = 0;
  for (uint32_t t = t_begin; t < t_begin + n; ++t)
    for (uint32_t r = s.row_begin; r < s.row_end; ++r) {
      double dot = 0, magnitude = 0;
      for (uint32_t i = 0; i < s.cols; ++i) {
        const double p = double{dense[size_t{r} * s.cols + i]} * x[size_t{t} * s.cols + i];
        dot += p;
        magnitude += std::fabs(p);
      }
      const double err = std::fabs(y[size_t{t} * s.rows + r] - dot) / magnitude;
      if (!(err <= worst)) worst = err;  // a NaN stays
    }
  return worst;
}

// The fp32 kernels of a quantised type against core's dequantiser, on one shape: with the
// weights at a 2-byte offset (a file does not align its tensors), the GEMV (cooperative and
// per-row) and the GEMMs of 1 to 64 tokens equal the fp64 matmul of the dequantised weights to
// float rounding (1e-5 of sum |w x|), and the embedding lookup of the first, last and middle
// rows returns the dequantised rows: bit for bit when `embed_exact`, else within 1e-6 (1 + |w|).
inline void expect_dequantised_matmuls_and_embed(ClDevice& dev, GpuKernels& kernels, DType type,
                                                 const MatmulShape& s, bool embed_exact) {
  constexpr uint32_t kBegin = 2;  // the launches' first token
  const uint32_t table = kBegin + 64;
  const auto wbytes = random_weights(type, s.rows, s.cols, 3 + s.rows);
  HostBuffer w(dev, 2 + wbytes.size());
  std::memcpy(w.at(2), wbytes.data(), wbytes.size());
  w.upload();
  const auto x = random_floats(size_t{table} * s.cols, 4, 2.0f);
  const uint64_t x_off = 4096 + uint64_t{table} * 16, y_off = x_off + x.size() * 4;
  HostBuffer arena(dev, y_off + uint64_t{table} * s.rows * 4);
  std::memcpy(arena.at(x_off), x.data(), x.size() * 4);
  arena.upload();
  std::vector<float> dense(size_t{s.rows} * s.cols);
  dequantize_row(type, wbytes.data(), dense.data(), int64_t{s.rows} * s.cols);
  for (const bool coop : {true, false}) {
    kernels.set_coop_gemv(coop);
    for (const uint32_t n : {1u, 3u, 5u, 20u, 64u}) {
      MatmulArgs a =
          matmul_args(type, w.mem(), 2, s.rows, s.cols, x_off, y_off, {kBegin, kBegin + n});
      a.row_begin = s.row_begin;
      a.row_end = s.row_end;
      run(kernels.matmul(arena.mem(), a));
      arena.download();
      EXPECT_LE(worst_relative_error(dense, s, x, kBegin, n, arena.at<float>(y_off)), 1e-5)
          << n << " tokens" << (coop ? ", coop GEMV" : "");
    }
  }
  const int32_t ids[3] = {0, static_cast<int32_t>(s.rows - 1), static_cast<int32_t>(s.rows / 2)};
  for (uint32_t t = 0; t < 3; ++t) arena.at<int32_t>(0)[4 * t] = ids[t];
  arena.upload();
  run(kernels.embed(arena.mem(), type, w.mem(), 2, s.cols, 0, x_off, s.cols, {0, 3}));
  arena.download();
  for (uint32_t t = 0; t < 3; ++t)
    for (uint32_t i = 0; i < s.cols; ++i) {
      const float want = dense[size_t(ids[t]) * s.cols + i];
      const float tolerance = embed_exact ? 0.0f : 1e-6f * (1.0f + std::fabs(want));
      ASSERT_NEAR(arena.at<float>(x_off)[size_t{t} * s.cols + i], want, tolerance)
          << "token " << t << " col " << i;
    }
}

}  // namespace duet::gpu::testing

namespace duet::gpu {
// The helpers every kernel test uses, without a using-declaration in each file.
using testing::HostBuffer;
using testing::random_floats;
using testing::random_weights;
using testing::run;
}  // namespace duet::gpu
