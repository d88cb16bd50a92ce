#pragma once
// Test helpers: host memory mirrored into an OpenCL buffer the way the runner does it (in place
// on host-unified devices, copied on discrete GPUs), and random data.
#include <CL/cl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

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

}  // namespace duet::gpu::testing
