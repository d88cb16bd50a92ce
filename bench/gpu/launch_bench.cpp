// launch_bench: what one kernel launch costs on gpu_svc's queue (the device's in-order profiling
// queue, as the runner uses it), as JSON. A decode step of a 1B llama is ~340 launches, so this
// is the floor a step pays beside its work.
//   single: a one-work-item kernel (scale_rows on 1 float), enqueued and waited for with
//           ClDevice::wait (the runner's end-of-step wait), one at a time: wall and process CPU
//           per launch, median and best of --reps.
//   burst:  --burst such launches back to back on the in-order queue, then one wait (a step's
//           pattern): wall and CPU per launch; --flush-every N flushes the queue every N.
//   burst_raw: the same kernel through clEnqueueNDRangeKernel itself, with and without an event,
//           on the profiling queue and on one without profiling: what a launch's cost is made of.
//   layer:  a llama decode layer's per-token ops (dim 2048, ffn 8192, 32/8 heads of 64) with a
//           16-row Q8_0 matmul standing in for each real one, op by op (add, rmsnorm, quantise +
//           matmul; swiglu, quantise + matmul; rope, rope) and through the fused launches
//           (op_fusion.h): wall and CPU per layer, alternated --reps times.
//   siblings: a llama3.2-1b decode layer's six projections of the same two inputs (q 2048, k
//           512, v 512 rows; gate, up 8192; all of 2048 columns; --sibling-type q4_0: Q4_0,
//           q4_k_m: Q4_K with a Q6_K v, as Q4_K_M's mix does in some layers), tiled, apart (5
//           matmul launches) and as sibling launches (GpuKernels::matmul_siblings: 2), each
//           input quantised once either way: wall and CPU per layer, alternated --layer-reps
//           times. The layer's 26 MB (Q4_K) of weights mostly outgrow the cache, as in decode.
//   --queue narrow: the same on PoCL's single-threaded narrow queue.
#include <CL/cl.h>
#include <time.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "core/base/error.h"
#include "core/model/dtype.h"
#include "core/model/quant.h"
#include "services/gpu_svc/cl_device.h"
#include "services/gpu_svc/gpu_kernels.h"
#include "services/gpu_svc/tiled_weights.h"

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

// Alternates `a` and `b` (each returning its last event) reps times after two warm-up rounds.
std::pair<nlohmann::json, nlohmann::json> alternate(duet::gpu::ClDevice& dev, int reps,
                                                    const std::function<cl_event()>& a,
                                                    const std::function<cl_event()>& b) {
  std::vector<Sample> sa, sb;
  for (int r = 0; r < reps + 2; ++r) {
    for (int which = 0; which < 2; ++which) {
      const auto t0 = Clock::now();
      const double c0 = cpu_us();
      wait(dev, which == 0 ? a() : b());
      const Sample s{std::chrono::duration<double, std::micro>(Clock::now() - t0).count(),
                     cpu_us() - c0};
      if (r >= 2) (which == 0 ? sa : sb).push_back(s);
    }
  }
  return {summary(sa, 1), summary(sb, 1)};
}

// What a burst launch's cost is made of: the same scale_rows kernel (its arguments set once)
// through clEnqueueNDRangeKernel directly, with no event, with an event released at once, and
// with an event on a queue without profiling, each burst ended by a clFinish.
nlohmann::json raw_bursts(duet::gpu::ClDevice& dev, cl_mem arena, uint64_t x_off, uint32_t cols,
                          int burst, int reps, int flush_every) {
  cl_int err = CL_SUCCESS;
  cl_command_queue plain = clCreateCommandQueue(dev.context(), dev.id(), 0, &err);
  check_cl(err, "clCreateCommandQueue");
  cl_kernel k = dev.kernel("scale_rows");
  const cl_ulong off = x_off;
  const cl_uint stride = cols, t0 = 0;
  const cl_float one = 1.0f;
  check_cl(clSetKernelArg(k, 0, sizeof arena, &arena), "arg");
  check_cl(clSetKernelArg(k, 1, sizeof off, &off), "arg");
  check_cl(clSetKernelArg(k, 2, sizeof stride, &stride), "arg");
  check_cl(clSetKernelArg(k, 3, sizeof one, &one), "arg");
  check_cl(clSetKernelArg(k, 4, sizeof t0, &t0), "arg");
  const size_t global[2] = {1, 1};
  auto run = [&](cl_command_queue q, bool with_event) {
    std::vector<Sample> v;
    for (int r = 0; r < reps; ++r) {
      const auto start = Clock::now();
      const double c0 = cpu_us();
      for (int i = 0; i < burst; ++i) {
        cl_event e = nullptr;
        check_cl(clEnqueueNDRangeKernel(q, k, 2, nullptr, global, nullptr, 0, nullptr,
                                        with_event ? &e : nullptr),
                 "launch");
        if (e) clReleaseEvent(e);
        if (flush_every > 0 && (i + 1) % flush_every == 0) clFlush(q);
      }
      check_cl(clFinish(q), "clFinish");
      v.push_back(
          {std::chrono::duration<double, std::micro>(Clock::now() - start).count(), cpu_us() - c0});
    }
    return summary(v, burst);
  };
  nlohmann::json out = {{"no_event", run(dev.queue(), false)},
                        {"event", run(dev.queue(), true)},
                        {"event_no_profiling", run(plain, true)},
                        {"no_event_no_profiling", run(plain, false)}};
  clReleaseCommandQueue(plain);
  return out;
}

// The siblings section (see the top): null where the device has no integer path.
nlohmann::json siblings(duet::gpu::ClDevice& dev, duet::gpu::GpuKernels& k, bool k_quants,
                        int reps) {
  using duet::DType;
  using duet::gpu::MatmulArgs;
  const uint32_t dim = 2048, ffn = 8192;
  struct Proj {
    DType type;
    uint32_t rows;
  };
  const DType main_type = k_quants ? DType::Q4_K : DType::Q4_0;
  const Proj projs[5] = {{main_type, dim},
                         {main_type, 512},
                         {k_quants ? DType::Q6_K : DType::Q4_0, 512},
                         {main_type, ffn},
                         {main_type, ffn}};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> row(dim);
  std::vector<std::unique_ptr<duet::gpu::TiledTensor>> tiled;
  // Arena: x (the norm's output, one token), then each projection's output row.
  const uint64_t x = 4096;
  uint64_t y = x + dim * 4;
  cl_mem arena = buffer(dev, y + (3 * dim + 2 * ffn) * 4);
  std::vector<float> xs(dim);
  for (float& v : xs) v = uni(rng);
  check_cl(
      clEnqueueWriteBuffer(dev.queue(), arena, CL_TRUE, x, dim * 4, xs.data(), 0, nullptr, nullptr),
      "write");
  std::vector<MatmulArgs> args;
  for (const Proj& p : projs) {
    std::vector<uint8_t> bytes(duet::dtype_row_bytes(p.type, dim) * p.rows);
    for (uint32_t r = 0; r < p.rows; ++r) {
      for (float& v : row) v = uni(rng);
      duet::quantize_row(p.type, row.data(), bytes.data() + r * duet::dtype_row_bytes(p.type, dim),
                         dim);
    }
    tiled.push_back(
        std::make_unique<duet::gpu::TiledTensor>(dev, p.type, p.rows, dim, bytes.data()));
    MatmulArgs a;
    a.wtype = p.type;
    a.w = tiled.back()->mem();
    a.k = dim;
    a.x_off = x;
    a.x_stride = dim;
    a.y_off = y;
    a.y_stride = p.rows;
    a.row_end = p.rows;
    a.tokens = {0, 1};
    a.tiled = tiled.back()->mem();
    args.push_back(a);
    y += p.rows * 4;
  }
  const std::span<const MatmulArgs> qkv(args.data(), 3), gate_up(args.data() + 3, 2);
  if (!k.int8_matmul() || !k.siblings_fuse(qkv) || !k.siblings_fuse(gate_up)) {
    clReleaseMemObject(arena);
    return nullptr;
  }
  // Each input quantised once either way: the quantisation is forgotten before each set (in a
  // real layer they read two norms' outputs).
  k.reuse_quantized_inputs();
  auto apart = [&] {
    for (size_t i = 0; i < 4; ++i) {
      if (i == 0 || i == 3) k.forget_quantized_input();
      clReleaseEvent(k.matmul(arena, args[i]));
    }
    return k.matmul(arena, args[4]);
  };
  auto fused = [&] {
    k.forget_quantized_input();
    clReleaseEvent(k.matmul_siblings(arena, qkv));
    k.forget_quantized_input();
    return k.matmul_siblings(arena, gate_up);
  };
  const auto [a, f] = alternate(dev, reps, apart, fused);
  clReleaseMemObject(arena);
  nlohmann::json out = {
      {"type", k_quants ? "q4_k_m (q4_k, v q6_k)" : "q4_0"}, {"apart", a}, {"siblings", f}};
  out["apart"]["launches"] = 7;
  out["siblings"]["launches"] = 4;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu_svc's kernel launch cost"};
  int reps = 200, burst = 340, layer_reps = 30;
  std::string queue = "wide", sibling_type = "q4_k_m";
  app.add_option("--reps", reps);
  app.add_option("--sibling-type", sibling_type)->check(CLI::IsMember({"q4_0", "q4_k_m"}));
  app.add_option("--burst", burst);
  int flush_every = 0;
  app.add_option("--flush-every", flush_every,
                 "burst: a clFlush after every N launches (0: none; gpu_svc flushes every op on a "
                 "discrete GPU)");
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
      for (int i = 0; i + 1 < burst; ++i) {
        clReleaseEvent(k.scale(arena, x, dim, 1.0f, 1, {0, 1}));
        if (flush_every > 0 && (i + 1) % flush_every == 0) clFlush(dev.queue());
      }
      wait(dev, k.scale(arena, x, dim, 1.0f, 1, {0, 1}));
      bursts.push_back(
          {std::chrono::duration<double, std::micro>(Clock::now() - t0).count(), cpu_us() - c0});
    }
    out["single"] = summary(single, 1);
    out["burst"] = summary(bursts, burst);
    out["burst"]["launches"] = burst;
    out["burst_raw"] = raw_bursts(dev, arena, x, dim, burst, std::max(3, reps / 20), flush_every);

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
      const auto [a, f] = alternate(dev, layer_reps, apart, fused);
      out["layer_apart"] = a;
      out["layer_apart"]["launches"] = 9;
      out["layer_fused"] = f;
      out["layer_fused"]["launches"] = 5;
      out["siblings"] = siblings(dev, k, sibling_type == "q4_k_m", layer_reps);
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
