// gpu_svc's attention kernels alone on Llama 3.2 1B's shape (32 heads, 8 KV heads, head_dim 64;
// --heads / --kv-heads another grouping of the same head_dim)
// over f16 (or --kv-type) pages: a decode token at each --contexts length and a 64-token
// prefill step ending there, per least chunk size (--min-chunks; "whole" = one chunk per token,
// which is the kernel before the split: one work-item per head over the whole context). Median
// of --reps launches, one JSON line per (kernel, context, shape, chunking), with the effective
// K/V read rate: the context's K and V bytes (all KV heads, read once) over the median time.
// --kernels: shared (a work-item per KV head's group of query heads), per_head, portable,
// work_group (a work-group per head, token and chunk: GPUs' default).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/model/dtype.h"
#include "core/model/kv_budget.h"
#include "services/gpu_svc/cl_device.h"
#include "services/gpu_svc/gpu_kernels.h"

namespace {

using duet::DType;
using namespace duet::gpu;

constexpr uint32_t kHeadDim = 64, kPageTokens = 16;

struct Buffer {
  Buffer(ClDevice& dev, size_t bytes) : host((bytes + 63) / 64 * 64) {
    cl_int err = CL_SUCCESS;
    mem = clCreateBuffer(dev.context(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, host.size(),
                         host.data(), &err);
    check_cl(err, "clCreateBuffer");
  }
  ~Buffer() { clReleaseMemObject(mem); }
  std::vector<uint8_t> host;
  cl_mem mem = nullptr;
};

// Reads more memory than the last-level cache holds (this host's L3 is 32 MiB).
void evict_caches() {
  static std::vector<uint64_t> other((96u << 20) / 8, 1);
  uint64_t sum = 0;
  for (uint64_t v : other) sum += v;
  other[sum % other.size()] = sum;  // the reads are used, so they stay
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpu_svc split attention at long contexts"};
  std::vector<uint32_t> contexts = {512, 4096, 16384};
  std::vector<std::string> min_chunks = {"whole", "128", "256", "512"};
  std::string kv_type_text = "f16";
  std::vector<std::string> kernels = {"shared", "per_head"};
  int reps = 5;
  bool cold = false;
  uint32_t kHeads = 32, kKvHeads = 8;
  app.add_option("--heads", kHeads, "query heads (32 on the 1B)");
  app.add_option("--kv-heads", kKvHeads, "KV heads (8 on the 1B)");
  app.add_option("--contexts", contexts)->delimiter(',');
  app.add_option("--min-chunks", min_chunks, "least chunk sizes (multiples of 16) or whole")
      ->delimiter(',');
  app.add_option("--kv-type", kv_type_text);
  app.add_option("--kernels", kernels, "shared, per_head, portable, work_group")->delimiter(',');
  app.add_option("--reps", reps);
  app.add_flag("--cold", cold,
               "read 96 MiB of other memory before each launch, so the KV comes from DRAM as in "
               "a decode step, where the weights have just gone through the caches");
  CLI11_PARSE(app, argc, argv);
  const uint32_t kKvDim = kKvHeads * kHeadDim, kQDim = kHeads * kHeadDim;
  try {
    const DType type = duet::parse_kv_type(kv_type_text);
    ClDevice& dev = shared_device();
    GpuKernels k{dev};
    const uint32_t max_ctx = *std::max_element(contexts.begin(), contexts.end());
    const uint32_t pages = (max_ctx + kPageTokens - 1) / kPageTokens;
    const uint64_t row = duet::dtype_row_bytes(type, kKvDim), page_bytes = 2 * kPageTokens * row;
    Buffer kv(dev, pages * page_bytes);
    std::mt19937 rng(1);
    for (size_t i = 0; i + 1 < kv.host.size(); i += 2) {  // random f16 / q8_0 bytes of small values
      const uint16_t h = static_cast<uint16_t>(0x2000 + rng() % 0x1000);
      std::memcpy(&kv.host[i], &h, 2);
    }
    check_cl(clEnqueueWriteBuffer(dev.queue(), kv.mem, CL_TRUE, 0, kv.host.size(), kv.host.data(),
                                  0, nullptr, nullptr),
             "write");
    constexpr uint32_t kMaxTokens = 64;
    const uint64_t tok = 0, pt = 4096, q_off = pt + uint64_t{pages} * 4 + 64,
                   out_off = q_off + uint64_t{kMaxTokens} * kQDim * 4;
    Buffer arena(dev, out_off + uint64_t{kMaxTokens} * kQDim * 4);
    auto* table = reinterpret_cast<int32_t*>(&arena.host[pt]);
    for (uint32_t i = 0; i < pages; ++i) table[i] = static_cast<int32_t>((i * 7919u + 3) % pages);
    std::uniform_real_distribution<float> u(-1, 1);
    for (uint32_t i = 0; i < kMaxTokens * kQDim; ++i)
      reinterpret_cast<float*>(&arena.host[q_off])[i] = u(rng);
    for (uint32_t ctx : contexts)
      for (uint32_t n : {1u, kMaxTokens}) {
        if (n > ctx) continue;
        auto* rows = reinterpret_cast<int32_t*>(&arena.host[tok]);
        for (uint32_t t = 0; t < n; ++t) {
          rows[4 * t + 1] = static_cast<int32_t>(ctx - n + t);
          rows[4 * t + 2] = 0;
        }
        check_cl(clEnqueueWriteBuffer(dev.queue(), arena.mem, CL_TRUE, 0, arena.host.size(),
                                      arena.host.data(), 0, nullptr, nullptr),
                 "write");
        const KvArgs args{kv.mem, 0, page_bytes, kPageTokens, kKvDim, 0, pt, pages, type};
        for (const std::string& kernel : kernels)
          for (const std::string& mc : min_chunks) {
            if (kernel == "shared")
              k.set_attention_kernel(GpuKernels::AttentionKernel::shared);
            else if (kernel == "per_head")
              k.set_attention_kernel(GpuKernels::AttentionKernel::per_head);
            else if (kernel == "portable")
              k.set_attention_kernel(GpuKernels::AttentionKernel::portable);
            else if (kernel == "work_group")
              k.set_attention_kernel(GpuKernels::AttentionKernel::work_group);
            else
              throw duet::Error(
                  duet::Errc::invalid_argument,
                  "--kernels: " + kernel + " (shared, per_head, portable, work_group)");
            const uint32_t least = mc == "whole" ? (max_ctx + 15) / 16 * 16 : std::stoul(mc);
            k.set_attention_min_chunk_keys(least);
            std::vector<double> us;
            for (int r = 0; r < reps + 1; ++r) {
              if (cold) evict_caches();
              const auto t0 = std::chrono::steady_clock::now();
              cl_event e = k.attention(arena.mem, q_off, kQDim, out_off, kQDim, args, tok, kHeads,
                                       kKvHeads, kHeadDim, {0, n}, ctx);
              check_cl(clWaitForEvents(1, &e), "wait");
              clReleaseEvent(e);
              const double t =
                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                      .count();
              if (r > 0) us.push_back(t);  // the first launch of a shape compiles
            }
            std::sort(us.begin(), us.end());
            const double kv_bytes = 2.0 * ctx * static_cast<double>(row);
            nlohmann::json j = {
                {"kernel", k.attention_kernel_name(kHeads, kKvHeads, kHeadDim, type)},
                {"context", ctx},
                {"tokens", n},
                {"kv_type", kv_type_text},
                {"min_chunk_keys", mc},
                {"cold", cold},
                {"chunks", k.attention_chunks(ctx)},
                {"median_us", us[us.size() / 2]},
                {"min_us", us.front()},
                {"kv_read_gbps", kv_bytes / us[us.size() / 2] / 1e3},
                {"device", dev.info().name}};
            std::cout << j.dump() << std::endl;
          }
      }
  } catch (const std::exception& e) {
    std::cerr << "attention_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
