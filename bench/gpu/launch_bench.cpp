// launch_bench: what one kernel launch costs on gpu_svc's queue (the device's in-order profiling
// queue, as the runner uses it), as JSON. A decode step of a 1B llama is ~340 launches, so this
// is the floor a step pays beside its work.
//   single: a one-work-item kernel (scale_rows on 1 float), enqueued and waited for with
//           ClDevice::wait (the runner's end-of-step wait), one at a time: wall and process CPU
//           per launch, median and best of --reps.
//   burst:  --burst such launches back to back on the in-order queue, then one wait (a step's
//           pattern): wall and CPU per launch.
//   layer:  a llama decode layer's per-token ops (dim 2048, ffn 8192, 32/8 heads of 64) with a
//           16-row Q8_0 matmul standing in for each real one, op by op (add, rmsnorm, quantise +
//           matmul; swiglu, quantise + matmul; rope, rope) and through the fused launches
//           (op_fusion.h): wall and CPU per layer, alternated --reps times.
//   --queue narrow: the same on PoCL's single-threaded narrow queue.
#include <CL/cl.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/base/error.h"
#include "core/model/dtype.h"
#include "services/gpu_svc/cl_device.h"
#include "services/gpu_svc/gpu_kernels.h"

namespace {

using duet::gpu::check_cl;
using Clock = std::chrono::steady_clock;

double cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

cl_mem buffer(duet::gpu::ClDevice& dev, size_t bytes) {
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer");
  std::vector<uint8_t> zero(bytes, 0);
  check_cl(
      clEnqueueWriteBuffer(dev.queue(), m, CL_TRUE, 0, bytes, zero.data(), 0, nullptr, nullptr),
      "write");
  return m;
}

void wait(duet::gpu::ClDevice& dev, cl_event e) {
  dev.wait(e, Clock::now() + std::chrono::seconds(30), "launch_bench");
  clReleaseEvent(e);
}

struct Sample {
  double wall_us, cpu_us;
};

nlohmann::json summary(std::vector<Sample> v, double per) {
  std::sort(v.begin(), v.end(),
            [](const Sample& a, const Sample& b) { return a.wall_us < b.wall_us; });
  const Sample med = v[v.size() / 2], best = v.front();
  return {{"wall_us_median", med.wall_us / per},
          {"wall_us_best", best.wall_us / per},
          {"cpu_us_at_median", med.cpu_us / per}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu_svc's kernel launch cost"};
  int reps = 200, burst = 340, layer_reps = 30;
  std::string queue = "wide";
  app.add_option("--reps", reps);
  app.add_option("--burst", burst);
  app.add_option("--layer-reps", layer_reps);
  app.add_option("--queue", queue)->check(CLI::IsMember({"wide", "narrow"}));
  CLI11_PARSE(app, argc, argv);
  try {
    auto& dev = duet::gpu::shared_device();
    duet::gpu::GpuKernels k(dev);
    if (queue == "narrow") {
      if (!dev.has_narrow()) throw duet::Error(duet::Errc::unsupported, "no narrow queue here");
      dev.use_narrow(true);
    }
    nlohmann::json out = {{"device", dev.info().name}, {"queue", queue}};
    const uint32_t dim = 2048, ffn = 8192, heads = 32, kv_heads = 8, hd = 64;
    // Arena: token table at 0, then x, tmp, xn, gate, up, q, k (f32 rows of one token).
    const uint64_t x = 4096, tmp = x + dim * 4, xn = tmp + dim * 4, gate = xn + dim * 4,
                   up = gate + ffn * 4, q = up + ffn * 4, kk = q + heads * hd * 4,
                   y = kk + kv_heads * hd * 4, arena_bytes = y + 64 * 4;
    cl_mem arena = buffer(dev, arena_bytes);
    // Weights: the norm vector (ones would do; zeros are fine for timing), then 16 Q8_0 rows of
    // the widest input.
    const uint64_t w_norm = 0, w_mat = dim * 4;
    cl_mem w = buffer(dev, w_mat + 16 * duet::dtype_row_bytes(duet::DType::Q8_0, ffn));

    // single and burst
    std::vector<Sample> single, bursts;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      const double c0 = cpu_us();
      wait(dev, k.scale(arena, x, dim, 1.0f, 1, {0, 1}));
      single.push_back(
          {std::chrono::duration<double, std::micro>(Clock::now() - t0).count(), cpu_us() - c0});
    }
    for (int r = 0; r < std::max(3, reps / 20); ++r) {
      const auto t0 = Clock::now();
      const double c0 = cpu_us();
      for (int i = 0; i + 1 < burst; ++i) clReleaseEvent(k.scale(arena, x, dim, 1.0f, 1, {0, 1}));
      wait(dev, k.scale(arena, x, dim, 1.0f, 1, {0, 1}));
      bursts.push_back(
          {std::chrono::duration<double, std::micro>(Clock::now() - t0).count(), cpu_us() - c0});
    }
    out["single"] = summary(single, 1);
    out["burst"] = summary(bursts, burst);
    out["burst"]["launches"] = burst;

    // layer: op by op vs fused
    auto mm = [&](uint64_t in, uint32_t cols, duet::MatmulRole role) {
      duet::gpu::MatmulArgs a;
      a.wtype = duet::DType::Q8_0;
      a.w = w;
      a.w_off = w_mat;
      a.k = cols;
      a.x_off = in;
      a.x_stride = cols;
      a.y_off = y;
      a.y_stride = 64;
      a.row_begin = 0;
      a.row_end = 16;
      a.tokens = {0, 1};
      a.role = role;
      return a;
    };
    duet::gpu::RopeArgs rope;
    rope.w = w;
    const duet::gpu::TokenRange one{0, 1};
    k.reuse_quantized_inputs();
    auto apart = [&] {
      clReleaseEvent(k.add(arena, x, dim, tmp, dim, x, dim, dim, one));
      clReleaseEvent(k.rmsnorm(arena, x, dim, xn, dim, w, w_norm, dim, 1e-5f, one));
      clReleaseEvent(k.matmul(arena, mm(xn, dim, duet::MatmulRole::gate)));
      clReleaseEvent(k.swiglu(arena, gate, ffn, up, ffn, gate, ffn, ffn, one));
      clReleaseEvent(k.matmul(arena, mm(gate, ffn, duet::MatmulRole::down)));
      clReleaseEvent(k.rope(arena, q, heads * hd, heads, hd, rope, 0, one));
      return k.rope(arena, kk, kv_heads * hd, kv_heads, hd, rope, 0, one);
    };
    auto fused = [&] {
      clReleaseEvent(k.add_rmsnorm_quantize(
          arena, duet::gpu::GpuKernels::ResidualAdd{x, dim, tmp, dim}, x, dim, xn, dim, w, w_norm,
          dim, 1e-5f, one, mm(xn, dim, duet::MatmulRole::gate)));
      clReleaseEvent(k.matmul(arena, mm(xn, dim, duet::MatmulRole::gate)));
      clReleaseEvent(k.swiglu_quantize(arena, gate, ffn, up, ffn, gate, ffn, ffn, one,
                                       mm(gate, ffn, duet::MatmulRole::down)));
      clReleaseEvent(k.matmul(arena, mm(gate, ffn, duet::MatmulRole::down)));
      return k.rope_pair(arena, q, heads * hd, heads, kk, kv_heads * hd, kv_heads, hd, rope, 0,
                         one);
    };
    if (k.int8_matmul() && k.quantizes_input(mm(xn, dim, duet::MatmulRole::gate))) {
      std::vector<Sample> a, f;
      for (int r = 0; r < layer_reps + 2; ++r) {
        for (int which = 0; which < 2; ++which) {
          const auto t0 = Clock::now();
          const double c0 = cpu_us();
          wait(dev, which == 0 ? apart() : fused());
          const Sample s{std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
                         cpu_us() - c0};
          if (r >= 2) (which == 0 ? a : f).push_back(s);  // two warm-up rounds
        }
      }
      out["layer_apart"] = summary(a, 1);
      out["layer_apart"]["launches"] = 9;
      out["layer_fused"] = summary(f, 1);
      out["layer_fused"]["launches"] = 5;
    }
    dev.use_narrow(false);
    clReleaseMemObject(arena);
    clReleaseMemObject(w);
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "launch_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
