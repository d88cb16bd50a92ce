// bench_reference (--model F | --shape S [--type T] [--vocab V]) [--threads 2] [--prompt 128]
// [--decode 16]: prefill and decode
// tokens/s of the reference forward pass, the weight bytes a decoded token reads and the GB/s
// that makes, next to this machine's memory read bandwidth measured in the same run. JSON out.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/model/ops.h"
#include "core/model/shapes.h"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Streams `bytes` of a buffer much larger than the caches with n threads, summing so the reads
// cannot be optimised away; best of a few passes.
double read_bandwidth_gbps(const std::vector<uint64_t>& buf, int n_threads) {
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    std::vector<uint64_t> sums(n_threads);
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int t = 0; t < n_threads; ++t) {
      threads.emplace_back([&, t] {
        const size_t begin = buf.size() * t / n_threads, end = buf.size() * (t + 1) / n_threads;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = begin; i + 4 <= end; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        sums[t] = s0 + s1 + s2 + s3;
      });
    }
    for (auto& th : threads) th.join();
    const double s = seconds_since(start);
    volatile uint64_t sink = 0;
    for (uint64_t v : sums) sink = sink + v;
    best = std::max(best, static_cast<double>(buf.size() * sizeof(uint64_t)) / s / 1e9);
  }
  return best;
}

double memcpy_bandwidth_gbps(size_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = Clock::now();
    std::memcpy(b.data(), a.data(), bytes);
    best = std::max(best,
                    2.0 * static_cast<double>(bytes) / seconds_since(start) / 1e9);  // read + write
  }
  volatile char sink = b[bytes / 2];
  (void)sink;
  return best;
}

void run(const std::string& model_path, int threads, int n_prompt, int n_decode) {
  duet::ops::set_num_threads(threads);
  const auto model = duet::LlamaModel::load(model_path);
  const duet::LlamaHparams& hp = model->hp();
  if (n_prompt + n_decode > hp.n_ctx)
    throw duet::Error(duet::Errc::invalid_argument, "prompt + decode exceed n_ctx");

  std::vector<uint64_t> buf((size_t{1} << 30) / sizeof(uint64_t));
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;
  const double read_1t = read_bandwidth_gbps(buf, 1);
  const double read_nt = read_bandwidth_gbps(buf, threads);
  buf = {};
  const double copy_gbps = memcpy_bandwidth_gbps(size_t{256} << 20);

  std::vector<int32_t> prompt(n_prompt);
  for (int i = 0; i < n_prompt; ++i) prompt[i] = (i * 7919 + 1) % hp.n_vocab;
  duet::ReferenceForward fwd(*model, n_prompt + n_decode + 1);
  fwd.forward(std::span(prompt).first(1), false);  // page the weights in
  fwd.reset();
  auto start = Clock::now();
  std::vector<float> logits = fwd.forward(prompt, false);
  const double prefill_s = seconds_since(start);
  start = Clock::now();
  for (int i = 0; i < n_decode; ++i) {
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = fwd.forward(std::span(&next, 1), false);
  }
  const double decode_s = seconds_since(start);
  const double bytes_per_token = static_cast<double>(model->weight_bytes());
  const double decode_tps = n_decode / decode_s;

  nlohmann::json out = {
      {"bench", "reference_forward"},
      {"model", model_path},
      {"shape",
       {{"n_vocab", hp.n_vocab},
        {"n_embd", hp.n_embd},
        {"n_layer", hp.n_layer},
        {"n_ff", hp.n_ff},
        {"n_head", hp.n_head},
        {"n_head_kv", hp.n_head_kv}}},
      {"weight_type", std::string(duet::dtype_name(model->layers.at(0).wq.type))},
      {"threads", threads},
      {"prefill_tokens", n_prompt},
      {"prefill_tok_s", n_prompt / prefill_s},
      {"decode_tokens", n_decode},
      {"decode_tok_s", decode_tps},
      {"weight_bytes_per_decoded_token", bytes_per_token},
      {"decode_weight_gbps", bytes_per_token * decode_tps / 1e9},
      {"machine_read_gbps_1_thread", read_1t},
      {"machine_read_gbps_n_threads", read_nt},
      {"machine_memcpy_gbps", copy_gbps},
      {"hardware_threads", std::thread::hardware_concurrency()},
  };
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Reference forward pass speed (prefill, decode) next to memory bandwidth; prints JSON"};
  std::string model, shape, type = "q4_0";
  int threads = 2, n_prompt = 128, n_decode = 16, vocab = 0;
  auto* model_opt = app.add_option(
      "--model", model, "GGUF model, e.g. from `duet mkmodel --shape llama3.2-1b --type q4_0`");
  auto* shape_opt = app.add_option("--shape", shape,
                                   "Instead of --model: write a synthetic model of this shape "
                                   "(core/model/shapes.h, as `duet mkmodel`) to a temp file first");
  model_opt->excludes(shape_opt);
  app.add_option("--type", type, "With --shape: q4_0, q8_0 or f16")->capture_default_str();
  app.add_option("--vocab", vocab, "With --shape: vocab size (0: mkmodel's small default)")
      ->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--prompt", n_prompt, "Prefill tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--decode", n_decode, "Decoded tokens")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    if (model.empty() && shape.empty())
      throw duet::Error(duet::Errc::invalid_argument, "give --model or --shape");
    if (!shape.empty()) {
      duet::SyntheticModelOptions options;
      options.type = type == "q4_0"   ? duet::DType::Q4_0
                     : type == "q8_0" ? duet::DType::Q8_0
                                      : duet::DType::F16;
      options.n_vocab = vocab;
      model = "/tmp/duet-bench-" + shape + "-" + type + ".gguf";
      duet::write_synthetic_model(duet::model_shape(shape), options, model);
    }
    run(model, threads, n_prompt, n_decode);
  } catch (const duet::Error& e) {
    std::fprintf(stderr, "bench_reference: %s\n", e.what());
    return 1;
  }
  return 0;
}
