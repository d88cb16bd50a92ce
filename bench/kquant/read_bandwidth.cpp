// The decode bandwidth limit of issue 19: how fast THREADS threads read memory here, and how many
// weight bytes one decoded token reads from a GGUF (every tensor but token_embd, of which a token
// reads one row; tied output weights read token_embd whole). Their ratio is the tok/s no decoder
// on this machine can pass; bench/kquant/summarize.py reports decode tok/s as a share of it.
// Prints one JSON line: {"read_gbps", "threads", "buffer_mb", "weight_bytes_per_token"?}.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/model/gguf.h"

namespace {

// Sums a range with four independent accumulators so the loop is bound by loads, not adds.
uint64_t read_range(const uint64_t* p, size_t n) {
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

uint64_t weight_bytes_per_token(const std::string& path) {
  auto file = duet::GgufFile::open(path);
  uint64_t bytes = 0;
  const bool tied = file->find_tensor("output.weight") == nullptr;
  for (const auto& t : file->tensors()) {
    if (t.name == "token_embd.weight" && !tied) {
      bytes +=
          t.bytes / static_cast<uint64_t>(std::max<int64_t>(1, t.dims.size() > 1 ? t.dims[1] : 1));
      continue;
    }
    bytes += t.bytes;
  }
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memory read bandwidth and a model's weight bytes per decoded token"};
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  int buffer_mb = 1024;
  int reps = 5;
  std::string model;
  app.add_option("--threads", threads, "reading threads")->check(CLI::Range(1, 1024));
  app.add_option("--buffer-mb", buffer_mb, "bytes read per pass (far past the caches)")
      ->check(CLI::Range(64, 65536));
  app.add_option("--reps", reps, "passes; the best is reported")->check(CLI::Range(1, 100));
  app.add_option("--model", model, "a GGUF: also report its weight bytes per decoded token");
  CLI11_PARSE(app, argc, argv);

  const size_t words = static_cast<size_t>(buffer_mb) << 17;  // MiB / 8
  std::vector<uint64_t> buffer(words);
  for (size_t i = 0; i < words; ++i) buffer[i] = i * 0x9E3779B97F4A7C15ull;  // touch every page
  double best_gbps = 0;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) {
      const size_t begin = words * static_cast<size_t>(t) / static_cast<size_t>(threads);
      const size_t end = words * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
      pool.emplace_back([&, t, begin, end] {
        sums[static_cast<size_t>(t)] = read_range(buffer.data() + begin, end - begin);
      });
    }
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t v : sums) sink += v;
    best_gbps = std::max(best_gbps, static_cast<double>(words * 8) / s / 1e9);
  }
  nlohmann::json out = {{"read_gbps", best_gbps},
                        {"threads", threads},
                        {"buffer_mb", buffer_mb},
                        {"checksum", sink & 0xFFFF}};
  if (!model.empty()) out["weight_bytes_per_token"] = weight_bytes_per_token(model);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
