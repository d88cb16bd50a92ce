// gpu_bench: prints one JSON object.
//   gemv: Q4_0 weights [rows, cols] x 1 token, in GB/s of weights read, next to the device's
//         best plain buffer copy (clEnqueueCopyBuffer, read + write bytes) in the same run.
//   gemm: Q4_0 weights [rows, cols] x tokens, in GFLOP/s, next to OpenBLAS sgemm on the same
//         shape in fp32 (the host's cores; on PoCL the very cores the kernels run on).
//   --rounds N repeats copy, GEMVs, GEMM and OpenBLAS in turn N times (best of each; "rounds"
//   has each round's own ratios): on a loaded machine both sides of a ratio see the same load.
//   --paths T1,T2,..: CPU devices' matmul paths side by side (fp32 kernels of matmul.cl, the
//         integer kernels of matmul_int8.cl: portable and VNNI with 16-bit activations, VNNI
//         with 8-bit ones; on the tiled weight layout, and "_file" on the file's) on Q4_0 and Q8_0
//         [gemm-rows, gemm-cols] x T tokens, host wall clock per call (quantisation included).
//         --path-types Q4_0,Q4_K,..: the weight types compared ("fp32_packed": weight_pack.h's
//         layout, what discrete GPUs read; Q4_0/Q8_0 only), --path-shapes
//         ROWSxCOLS,..: several shapes in one run (default: [gemm-rows, gemm-cols]); with
//         --rounds N each shape runs N times, the types' order rotated each round, best of each.
//         E0M4 (duet's FP4) has only the fp32 path. --path-names fp32,..: only those paths.
#include <CL/cl.h>
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/quant.h"
#include "core/planner/op_shape.h"
#include "services/gpu_svc/gpu_profiler.h"
#include "services/gpu_svc/tiled_weights.h"
#include "services/gpu_svc/weight_pack.h"

namespace {

using duet::gpu::check_cl;

double event_us(cl_event e) {
  check_cl(clWaitForEvents(1, &e), "wait");
  cl_ulong s = 0, t = 0;
  clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof s, &s, nullptr);
  clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof t, &t, nullptr);
  clReleaseEvent(e);
  return (t - s) / 1e3;
}

// The best of the runtime's buffer copy and a plain copy kernel, in GB/s of bytes read + written.
double copy_gbps(duet::gpu::GpuKernels& kernels, size_t bytes, int reps) {
  auto& dev = kernels.device();
  cl_int err = CL_SUCCESS;
  cl_mem a = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer");
  cl_mem b = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer");
  const unsigned char zero = 1;
  check_cl(clEnqueueFillBuffer(dev.queue(), a, &zero, 1, 0, bytes, 0, nullptr, nullptr), "fill");
  check_cl(clEnqueueFillBuffer(dev.queue(), b, &zero, 1, 0, bytes, 0, nullptr, nullptr), "fill");
  double best_us = 1e30;
  for (int r = 0; r <= reps; ++r) {
    cl_event e = nullptr;
    check_cl(clEnqueueCopyBuffer(dev.queue(), a, b, 0, 0, bytes, 0, nullptr, &e), "copy");
    const double runtime_copy = event_us(e);
    const double kernel_copy = event_us(kernels.copy(a, b, bytes));
    if (r > 0) best_us = std::min({best_us, runtime_copy, kernel_copy});
  }
  clReleaseMemObject(a);
  clReleaseMemObject(b);
  return 2.0 * static_cast<double>(bytes) / (best_us * 1e3);
}

double blas_gflops(int m, int k, int n, int reps) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> w(size_t(m) * k), x(size_t(n) * k), y(size_t(n) * m);
  for (auto& v : w) v = d(rng);
  for (auto& v : x) v = d(rng);
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    // y[n][m] = x[n][k] * W[m][k]^T, the matmul's layout.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x.data(), k, w.data(), k,
                0.0f, y.data(), m);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, s);
  }
  return 2.0 * m * k * n / best / 1e9;
}

// Best host wall-clock time of one matmul call (enqueue to finish) per path, in us.
nlohmann::json compare_paths(duet::gpu::GpuKernels& kernels, int rows, int cols,
                             const std::vector<int>& token_counts,
                             const std::vector<duet::DType>& types, int reps,
                             const std::vector<std::string>& only_paths) {
  auto& dev = kernels.device();
  nlohmann::json out;
  const int max_tokens = *std::max_element(token_counts.begin(), token_counts.end());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> x(size_t(max_tokens) * cols), wf(static_cast<size_t>(cols));
  for (auto& v : x) v = d(rng);
  cl_int err = CL_SUCCESS;
  const size_t arena_bytes = (size_t(max_tokens) * (cols + rows) + 1024) * 4;
  cl_mem arena = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE, arena_bytes, nullptr, &err);
  check_cl(err, "clCreateBuffer");
  check_cl(clEnqueueWriteBuffer(dev.queue(), arena, CL_TRUE, 4096, x.size() * 4, x.data(), 0,
                                nullptr, nullptr),
           "write");
  for (const auto type : types) {
    const size_t row_bytes = duet::dtype_row_bytes(type, cols);
    std::vector<uint8_t> w(row_bytes * rows);
    for (int r = 0; r < rows; ++r) {
      for (auto& v : wf) v = d(rng);
      duet::quantize_row(type, wf.data(), w.data() + row_bytes * r, cols);
    }
    cl_mem wbuf = clCreateBuffer(dev.context(), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, w.size(),
                                 w.data(), &err);
    check_cl(err, "clCreateBuffer");
    // The integer path's tiled copy (what gpu_svc's runner matmuls use; the file layout's
    // kernels serve tensors without one).
    // K types have no packed layout.
    const bool packable = duet::gpu::has_packed_layout(type);
    std::optional<duet::gpu::TiledTensor> tiled;
    cl_mem packed = nullptr;
    if (duet::gpu::has_tiled_layout(type)) tiled.emplace(dev, type, rows, cols, w.data());
    if (packable) {
      std::vector<uint8_t> p(w.size());
      duet::gpu::pack_weights(type, rows, cols, w.data(), p.data());
      packed = clCreateBuffer(dev.context(), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, p.size(),
                              p.data(), &err);
      check_cl(err, "clCreateBuffer");
    }
    struct Path {
      const char* name;
      bool int8, vnni;
      int bits;
      bool tiled, packed = false;
    };
    for (const Path p :
         {Path{"fp32", false, false, 0, false}, Path{"fp32_packed", false, false, 0, false, true},
          Path{"int8_portable_a16", true, false, 16, true},
          Path{"int8_vnni_a16_file", true, true, 16, false},
          Path{"int8_vnni_a16", true, true, 16, true},
          Path{"int8_vnni_a8_file", true, true, 8, false},
          Path{"int8_vnni_a8", true, true, 8, true}}) {
      if ((p.tiled && !tiled) || (p.packed && !packable)) continue;
      if (!only_paths.empty() &&
          std::find(only_paths.begin(), only_paths.end(), p.name) == only_paths.end())
        continue;
      try {
        kernels.set_int8_matmul(p.int8);
        if (p.int8) {
          kernels.set_int8_vnni(p.vnni);
          kernels.set_int8_act_bits(p.bits);
        }
      } catch (const duet::Error& e) {
        out[duet::dtype_name(type)][p.name] = e.what();
        continue;
      }
      for (const int n : token_counts) {
        duet::gpu::MatmulArgs a{type,
                                wbuf,
                                0,
                                static_cast<uint32_t>(cols),
                                4096,
                                static_cast<uint32_t>(cols),
                                4096 + uint64_t(max_tokens) * cols * 4,
                                static_cast<uint32_t>(rows),
                                0,
                                static_cast<uint32_t>(rows),
                                {0, static_cast<uint32_t>(n)}};
        if (p.tiled) a.tiled = tiled->mem();
        if (p.packed) {
          a.w = packed;
          a.packed_rows = static_cast<uint32_t>(rows);
        }
        double best = 1e30;
        for (int r = 0; r <= reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          cl_event e = kernels.matmul(arena, a);
          check_cl(clWaitForEvents(1, &e), "wait");
          clReleaseEvent(e);
          const double us =
              std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                  .count();
          if (r > 0) best = std::min(best, us);  // the first call compiles the kernel
        }
        out[duet::dtype_name(type)][p.name][std::to_string(n)] = {
            {"us", best}, {"gflops", 2.0 * rows * cols * n / (best * 1e3)}};
      }
    }
    clReleaseMemObject(wbuf);
    if (packed) clReleaseMemObject(packed);
  }
  clReleaseMemObject(arena);
  kernels.set_int8_matmul(false);
  return out;
}

// Folds one round of compare_paths into `best`: per type, path and token count, the entry with
// the smaller time (error strings, for paths a device lacks, are kept as they are).
void merge_best(nlohmann::json& best, const nlohmann::json& round) {
  for (const auto& [type, paths] : round.items())
    for (const auto& [path, counts] : paths.items()) {
      nlohmann::json& b = best[type][path];
      if (!counts.is_object()) {
        b = counts;
        continue;
      }
      for (const auto& [n, m] : counts.items())
        if (!b.contains(n) || m["us"].get<double>() < b[n]["us"].get<double>()) b[n] = m;
    }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("gpu_svc kernel benchmark (JSON on stdout)");
  int gemv_rows = 14336, gemv_cols = 4096, gemm_rows = 4096, gemm_cols = 4096, gemm_tokens = 128,
      reps = 5;
  size_t copy_mb = 256;
  app.add_option("--gemv-rows", gemv_rows);
  app.add_option("--gemv-cols", gemv_cols);
  app.add_option("--gemm-rows", gemm_rows);
  app.add_option("--gemm-cols", gemm_cols);
  app.add_option("--gemm-tokens", gemm_tokens);
  app.add_option("--copy-mb", copy_mb);
  app.add_option("--reps", reps);
  int rounds = 1;
  app.add_option("--rounds", rounds,
                 "measure copy, GEMVs, GEMM and OpenBLAS this many times in turn (best of each)")
      ->check(CLI::Range(1, 100));
  std::vector<std::string> gemv_variants;  // GPU GEMV shapes to compare (GpuKernels::kGemvVariants)
  app.add_option("--gemv-variants", gemv_variants)->delimiter(',');
  std::vector<int> path_tokens;  // --paths: token counts for the CPU paths' comparison
  app.add_option("--paths", path_tokens)->delimiter(',');
  std::vector<std::string> path_type_names{"Q4_0", "Q8_0"}, path_shapes;
  app.add_option("--path-types", path_type_names)->delimiter(',');
  app.add_option("--path-shapes", path_shapes, "ROWSxCOLS")->delimiter(',');
  std::vector<std::string> path_names;  // --paths: only these paths (default: every one)
  app.add_option("--path-names", path_names, "fp32,fp32_packed,int8_vnni_a16,...")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    // --gemv-variants compares the tuning variants, which only a device opened for them builds.
    std::unique_ptr<duet::gpu::ClDevice> tuning_dev;
    if (!gemv_variants.empty()) {
      duet::gpu::DeviceOptions options;
      options.gemv_tuning = true;
      tuning_dev = duet::gpu::ClDevice::open(options);
    }
    auto& dev = tuning_dev ? *tuning_dev : duet::gpu::shared_device();
    duet::gpu::GpuKernels kernels(dev);
    if (!path_tokens.empty()) {
      nlohmann::json out;
      out["device"] = dev.info().name;
      out["extensions"] = dev.info().extensions;
      std::vector<duet::DType> types;
      for (const std::string& name : path_type_names) {
        uint32_t raw = 0;
        constexpr uint32_t kEnd = 2048;  // past duet's own types (E0M4 = 1024)
        while (raw < kEnd &&
               !(duet::dtype_known(raw) && duet::dtype_name(static_cast<duet::DType>(raw)) == name))
          ++raw;
        if (raw == kEnd) throw duet::Error(duet::Errc::invalid_argument, "no weight type " + name);
        types.push_back(static_cast<duet::DType>(raw));
      }
      if (path_shapes.empty())
        path_shapes.push_back(std::to_string(gemm_rows) + "x" + std::to_string(gemm_cols));
      for (const std::string& shape : path_shapes) {
        const size_t x = shape.find('x');
        if (x == std::string::npos)
          throw duet::Error(duet::Errc::invalid_argument, "--path-shapes: not ROWSxCOLS: " + shape);
        const int rows = std::stoi(shape.substr(0, x)), cols = std::stoi(shape.substr(x + 1));
        for (int round = 0; round < rounds; ++round) {
          // Rounds rotate the types' order, so a burst of load lands on each type in turn; each
          // path keeps its best time over the rounds (ratios between types from one run).
          std::vector<duet::DType> order(types);
          std::rotate(order.begin(), order.begin() + round % static_cast<int>(order.size()),
                      order.end());
          merge_best(out["paths"][shape],
                     compare_paths(kernels, rows, cols, path_tokens, order, reps, path_names));
        }
      }
      std::cout << out.dump(2) << "\n";
      return 0;
    }
    nlohmann::json out;
    out["device"] = dev.info().name;
    out["platform"] = dev.info().platform;
    out["type"] = dev.info().type;
    out["compute_units"] = dev.info().compute_units;
    out["extensions"] = dev.info().extensions;

    // Rounds take every yardstick and every kernel in turn, so a burst of load from other
    // processes lands on both sides of a ratio; each number is the best over the rounds, and
    // "rounds" keeps each round's own ratios.
    const duet::DType gemv_types[] = {duet::DType::Q4_0, duet::DType::Q8_0, duet::DType::F16,
                                      duet::DType::F32,  duet::DType::Q4_K, duet::DType::Q6_K};
    const duet::OpShape gemm{duet::OpKind::MatMul, duet::DType::Q4_0, gemm_rows, gemm_cols,
                             gemm_tokens};
    const double gemm_flops = 2.0 * gemm_rows * gemm_cols * gemm_tokens;
    auto gemv_bytes = [&](duet::DType type) {
      return static_cast<double>(duet::dtype_row_bytes(type, gemv_cols)) * gemv_rows;
    };
    double copy = 0, blas = 0;
    std::map<duet::DType, duet::gpu::OpMeasurement> gemv_best;
    duet::gpu::OpMeasurement gemm_best{1e300, 1e300, 0};
    auto keep_best = [](duet::gpu::OpMeasurement& best, const duet::gpu::OpMeasurement& m) {
      best.min_us = std::min(best.min_us, m.min_us);
      best.median_us = std::min(best.median_us, m.median_us);
      best.reps += m.reps;
    };
    for (int round = 0; round < rounds; ++round) {
      nlohmann::json r;
      const double round_copy = copy_gbps(kernels, copy_mb << 20, reps);
      copy = std::max(copy, round_copy);
      r["copy_gbps"] = round_copy;
      for (auto type : gemv_types) {
        const duet::OpShape gemv{duet::OpKind::MatMul, type, gemv_rows, gemv_cols, 1};
        const auto m = duet::gpu::measure_op(kernels, gemv, static_cast<uint32_t>(reps));
        gemv_best.try_emplace(type, duet::gpu::OpMeasurement{1e300, 1e300, 0});
        keep_best(gemv_best[type], m);
        const double gbps = gemv_bytes(type) / (m.min_us * 1e3);
        r["gemv_fraction_of_copy"][std::string(duet::dtype_name(type))] = gbps / round_copy;
      }
      const auto g =
          duet::gpu::measure_op(kernels, gemm, static_cast<uint32_t>(std::max(1, reps / 2)));
      keep_best(gemm_best, g);
      const double round_blas =
          blas_gflops(gemm_rows, gemm_cols, gemm_tokens, std::max(1, reps / 2));
      blas = std::max(blas, round_blas);
      r["gemm_gflops"] = gemm_flops / (g.min_us * 1e3);
      r["openblas_sgemm_gflops"] = round_blas;
      r["gemm_fraction_of_openblas"] = gemm_flops / (g.min_us * 1e3) / round_blas;
      out["rounds"].push_back(r);
    }
    for (auto type : gemv_types) {
      const auto& m = gemv_best.at(type);
      const double bytes = gemv_bytes(type), gbps = bytes / (m.min_us * 1e3);
      out["gemv"][std::string(duet::dtype_name(type))] = {
          {"shape", {gemv_rows, gemv_cols, 1}}, {"weight_bytes", bytes}, {"min_us", m.min_us},
          {"median_us", m.median_us},           {"weights_gbps", gbps},  {"copy_gbps", copy},
          {"fraction_of_copy", gbps / copy}};
    }
    for (const auto& variant : gemv_variants) {
      kernels.set_gemv_variant(variant);
      for (auto type : {duet::DType::Q4_0, duet::DType::Q8_0, duet::DType::F16, duet::DType::F32}) {
        const duet::OpShape gemv{duet::OpKind::MatMul, type, gemv_rows, gemv_cols, 1};
        const auto m = duet::gpu::measure_op(kernels, gemv, static_cast<uint32_t>(reps));
        const double bytes =
            static_cast<double>(duet::dtype_row_bytes(type, gemv_cols)) * gemv_rows;
        out["gemv_variants"][variant][std::string(duet::dtype_name(type))] = {
            {"min_us", m.min_us},
            {"weights_gbps", bytes / (m.min_us * 1e3)},
            {"fraction_of_copy", bytes / (m.min_us * 1e3) / copy}};
      }
    }
    const double gflops = gemm_flops / (gemm_best.min_us * 1e3);
    out["gemm"] = {{"shape", {gemm_rows, gemm_cols, gemm_tokens}},
                   {"type", "Q4_0"},
                   {"min_us", gemm_best.min_us},
                   {"gflops", gflops},
                   {"openblas_sgemm_gflops", blas},
                   {"fraction_of_openblas", gflops / blas}};
    std::cout << out.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "gpu_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
