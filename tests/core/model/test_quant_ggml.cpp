// duet's K quantisers against llama.cpp's (ggml's quantize_row_q{4,5,6}_K_ref, as llama-quantize
// runs them without an importance matrix) on the same weight-like rows: the bytes of every row
// and the RMSE (tests/data/llamacpp/quant-ggml.json, made by tools/llamacpp-oracle/
// quant_compare.py, which generates the rows by the recipe of make_rows below).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/model/quant.h"
#include "llamacpp_data.h"

namespace duet {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// quant_compare.py's make_rows: Irwin-Hall of a splitmix64's four 16-bit quarters, std 0.02,
// x5 for a 2% tail, computed in double and rounded once to float.
std::vector<float> make_rows(int rows, int cols) {
  std::vector<float> x(static_cast<size_t>(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < cols; ++i) {
      const uint64_t z = splitmix64((static_cast<uint64_t>(r) << 32) + static_cast<uint64_t>(i));
      const uint64_t s = (z & 0xffff) + ((z >> 16) & 0xffff) + ((z >> 32) & 0xffff) + (z >> 48);
      double v = (static_cast<double>(s) - 2.0 * 65535) * (0.02 * std::sqrt(3.0) / 65536);
      if ((z >> 56) < 6) v *= 5;
      x[static_cast<size_t>(r) * cols + i] = static_cast<float>(v);
    }
  return x;
}

// sha256 of each row's bytes, through sha256sum (as the rest of the oracle data).
std::vector<std::string> row_hashes(const std::vector<uint8_t>& bytes, size_t row_bytes) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("duet-quant-ggml-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string cmd = "cd '" + dir.string() + "' && sha256sum";
  const size_t rows = bytes.size() / row_bytes;
  for (size_t r = 0; r < rows; ++r) {
    std::ofstream(dir / std::to_string(r), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data() + r * row_bytes),
               static_cast<std::streamsize>(row_bytes));
    cmd += " " + std::to_string(r);
  }
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  std::vector<std::string> out;
  char line[256];
  while (pipe && std::fgets(line, sizeof line, pipe.get())) out.emplace_back(line, 64);
  std::filesystem::remove_all(dir);
  return out;
}

TEST(QuantGgml, KQuantisersMatchLlamaCppsReferenceQuantisers) {
  const auto j = testdata::load_json(testdata::llamacpp_dir() + "quant-ggml.json");
  const int rows = j.at("rows"), cols = j.at("cols");
  const std::vector<float> x = make_rows(rows, cols);
  for (const auto& [name, want] : j.at("types").items()) {
    const DType type = name == "Q4_K" ? DType::Q4_K : name == "Q5_K" ? DType::Q5_K : DType::Q6_K;
    ASSERT_EQ(dtype_name(type), name);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    std::vector<uint8_t> q(row_bytes * static_cast<size_t>(rows));
    std::vector<float> back(static_cast<size_t>(cols));
    double sse = 0;
    for (int r = 0; r < rows; ++r) {
      const float* xr = x.data() + static_cast<size_t>(r) * cols;
      quantize_row(type, xr, q.data() + r * row_bytes, cols);
      dequantize_row(type, q.data() + r * row_bytes, back.data(), cols);
      for (int i = 0; i < cols; ++i) sse += (double(xr[i]) - back[i]) * (double(xr[i]) - back[i]);
    }
    const double rmse = std::sqrt(sse / (double(rows) * cols));
    const auto hashes = row_hashes(q, row_bytes);
    const auto theirs = want.at("row_sha256").get<std::vector<std::string>>();
    ASSERT_EQ(hashes.size(), theirs.size());
    int same = 0;
    for (size_t r = 0; r < hashes.size(); ++r) same += hashes[r] == theirs[r];
    const double ggml_rmse = want.at("rmse");
    std::printf("%s: RMSE %.6g, llama.cpp's %.6g (ratio %.4f); %d of %d rows byte-identical\n",
                name.c_str(), rmse, ggml_rmse, rmse / ggml_rmse, same, rows);
    EXPECT_EQ(same, rows) << name << ": rows quantised differently from llama.cpp";
    EXPECT_NEAR(rmse, ggml_rmse, 1e-9) << name;
  }
}

}  // namespace
}  // namespace duet
