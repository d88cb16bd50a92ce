// npu_bench: is the NPU emulator fast enough never to be the bottleneck? For each shape, the
// emulator's matmul (fp16 rounding, weights dequantised per tile, OpenBLAS sgemm per tile on
// our threads) against one plain OpenBLAS sgemm on already-dequantised fp32 weights using the
// same number of threads. Target: emulator >= 0.5x sgemm's throughput. Also prints the
// modelled time on the chosen SoC profile's NPU. Output: one JSON document on stdout.
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/model/quant.h"
#include "core/planner/npu_timing.h"
#include "core/planner/soc_profile.h"
#include "services/npu_svc/npu_gemm.h"

namespace duet {
// The timing model's breakdown of one shape, as bench/npu/RESULTS.md records it.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(NpuTiming, total_us, compute_us, dma_us, chunks, chunk_rows,
                                   passes, stationary_loads, stationary_in_sram)
}  // namespace duet

namespace {

using Clock = std::chrono::steady_clock;

template <class Fn>
double median_us(int reps, Fn&& fn) {
  fn();  // warm-up: page in weights, grow tile buffers, start threads
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

duet::DType parse_type(const std::string& s) {
  if (s == "q4_0") return duet::DType::Q4_0;
  if (s == "q8_0") return duet::DType::Q8_0;
  if (s == "f16") return duet::DType::F16;
  if (s == "f32") return duet::DType::F32;
  throw CLI::ValidationError("--types", "unknown type " + s);
}

duet::OpShape matmul(int64_t m, int64_t k, int64_t n, bool transposed = true) {
  duet::OpShape s;
  s.wtype = duet::DType::Q4_0;
  s.m = m;
  s.k = k;
  s.n = n;
  s.weight_stationary_transposed = transposed;
  return s;
}

nlohmann::json breakdown(const duet::SocProfile& soc, const duet::OpShape& s) {
  nlohmann::json j = duet::npu_timing(soc, s);
  j.update({{"m", s.m},
            {"k", s.k},
            {"n", s.n},
            {"order", s.weight_stationary_transposed ? "WxT" : "xWT"}});
  return j;
}

// HeteroInfer Table 3 (NPU column, W4A16), NPU-2 (order) and NPU-3 (shape) on the model.
nlohmann::json model_report(const duet::SocProfile& soc) {
  struct Row {
    int64_t m, k, n;
    double paper_us;
  };
  const Row rows[] = {{4096, 4096, 1, 693},   {28672, 4096, 1, 3886},  {4096, 14336, 1, 6506},
                      {4096, 4096, 128, 912}, {4096, 4096, 256, 1884}, {4096, 14336, 256, 23445}};
  nlohmann::json table3 = nlohmann::json::array();
  for (const Row& r : rows) {
    nlohmann::json j = breakdown(soc, matmul(r.m, r.k, r.n));
    j["paper_us"] = r.paper_us;
    j["ratio"] = j["total_us"].get<double>() / r.paper_us;
    table3.push_back(j);
  }
  nlohmann::json order = nlohmann::json::array(), shape = nlohmann::json::array();
  for (int64_t k : {32, 64, 128, 256, 512, 1024}) {
    const double fast = duet::npu_modeled_us(soc, matmul(14336, 4096, k, true));
    const double slow = duet::npu_modeled_us(soc, matmul(14336, 4096, k, false));
    order.push_back({{"K", k},
                     {"weight_streamed_us", fast},
                     {"weight_stationary_us", slow},
                     {"ratio", slow / fast}});
  }
  for (int64_t n : {1, 64, 256, 1024}) {
    const double tall = duet::npu_modeled_us(soc, matmul(14336, 4096, n));
    const double wide = duet::npu_modeled_us(soc, matmul(4096, 14336, n));
    shape.push_back(
        {{"n", n}, {"rows_gt_cols_us", tall}, {"cols_gt_rows_us", wide}, {"ratio", wide / tall}});
  }
  return {{"soc", soc.name}, {"table3", table3}, {"order_npu2", order}, {"shape_npu3", shape}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"npu_bench: NPU emulator GEMM vs OpenBLAS sgemm"};
  int threads = 2, reps = 5;
  std::string soc_name = "sd8gen3";
  std::vector<std::string> types = {"q4_0", "q8_0", "f16"};
  std::vector<int64_t> tokens = {1, 32, 128};
  int64_t rows = 4096, cols = 4096;
  app.add_option("--threads", threads, "threads for both (default 2)");
  app.add_option("--reps", reps, "timed repetitions (median reported)");
  app.add_option("--soc", soc_name, "SoC profile for the modelled time");
  app.add_option("--types", types, "weight types: q4_0 q8_0 f16 f32");
  app.add_option("--tokens", tokens, "activation rows (n)");
  app.add_option("--rows", rows, "weight rows (m)");
  app.add_option("--cols", cols, "weight cols (k)");
  bool model_only = false;
  app.add_flag("--model-only", model_only,
               "print only the timing model's Table 3, order and shape figures");
  CLI11_PARSE(app, argc, argv);

  const duet::SocProfile soc = duet::load_soc_profile(soc_name);
  if (model_only) {
    std::cout << model_report(soc).dump(2) << "\n";
    return 0;
  }
  duet::npu::NpuGemm gemm(threads);
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> w32(static_cast<size_t>(rows * cols));
  for (float& v : w32) v = dist(rng);

  nlohmann::json results = nlohmann::json::array();
  for (const std::string& type_name : types) {
    const duet::DType type = parse_type(type_name);
    std::vector<uint8_t> packed(rows * duet::dtype_row_bytes(type, cols));
    for (int64_t r = 0; r < rows; ++r)
      duet::quantize_row(type, &w32[r * cols],
                         packed.data() + r * duet::dtype_row_bytes(type, cols), cols);
    // The baseline multiplies the same (dequantised) weights in fp32.
    std::vector<float> wd(w32.size());
    for (int64_t r = 0; r < rows; ++r)
      duet::dequantize_row(type, packed.data() + r * duet::dtype_row_bytes(type, cols),
                           &wd[r * cols], cols);
    const duet::ops::Matrix w{type, rows, cols, packed.data()};

    for (int64_t n : tokens) {
      std::vector<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * rows));
      for (float& v : x) v = dist(rng);
      openblas_set_num_threads(threads);
      const double blas_us = median_us(reps, [&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
                    static_cast<int>(rows), static_cast<int>(cols), 1.0f, x.data(),
                    static_cast<int>(cols), wd.data(), static_cast<int>(cols), 0.0f, y.data(),
                    static_cast<int>(rows));
      });
      openblas_set_num_threads(1);  // the emulator runs one single-threaded sgemm per thread
      const double emu_us =
          median_us(reps, [&] { gemm.matmul(w, x.data(), cols, n, y.data(), rows); });
      duet::OpShape shape;
      shape.wtype = type;
      shape.m = rows;
      shape.k = cols;
      shape.n = n;
      const double gflop = 2.0 * rows * cols * n / 1e9;
      results.push_back({{"type", type_name},
                         {"m", rows},
                         {"k", cols},
                         {"n", n},
                         {"threads", threads},
                         {"emulator_us", emu_us},
                         {"sgemm_us", blas_us},
                         {"emulator_gflops", gflop / (emu_us * 1e-6)},
                         {"sgemm_gflops", gflop / (blas_us * 1e-6)},
                         {"emulator_vs_sgemm", blas_us / emu_us},
                         {"modeled_npu_us", duet::npu_modeled_us(soc, shape)}});
    }
  }
  std::cout << nlohmann::json{{"bench", "npu_gemm"}, {"soc", soc.name}, {"results", results}}.dump(
                   2)
            << "\n";
  return 0;
}
