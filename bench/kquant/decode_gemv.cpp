// Issue 19's kernel-level decode bench: builds only the CPU integer GEMV kernels (T = 1, or KQH_T)
// of services/gpu_svc/kernels (or another copy of them: argv[1]) with PoCL, seconds instead of
// gpu_svc's whole program, and runs one llama3.2-1b decode token's GEMVs (16 layers of q k v o
// gate up down, then the 128256-row output; Q4_K_M by llama.cpp's mixing rule, or every tensor of
// one type) over tiled weights with random bits, each tensor its own copy, so weights stream
// from DRAM as in a decode (KQH_HOT=1: one copy per shape). Reports the best of the runs after the
// first: wall clock and the process's CPU time (on a machine shared by busy processes the CPU time
// is the steadier measure: a GEMV's memory stalls count in it, other processes' time does not),
// and a hash of the output projection's y (the same bits across kernel variants).
// Standalone (not in CMake): scratch for kernel variants, e.g. prefetch choices.
//   g++ -O2 -std=c++20 -o build-kqh/kqh bench/kquant/decode_gemv.cpp -lOpenCL
//   build-kqh/kqh services/gpu_svc/kernels vnni_a16 q4_k_m 5      # dir, ISA_aBITS, mix, runs
// env: KQH_ONLY=q6_k (time those tensors only), KQH_OPTS (build options, e.g. -DNAME=...),
// KQH_T=8 (the 8-token GEMM kernels), KQH_HOT=1, KQH_GROUP (work-group size, 4 as the runner).
#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

static std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
#define CK(x)                                                     \
  do {                                                            \
    cl_int e_ = (x);                                              \
    if (e_) {                                                     \
      std::fprintf(stderr, "%s: %d line %d\n", #x, e_, __LINE__); \
      std::exit(1);                                               \
    }                                                             \
  } while (0)

static std::string strip_defs(std::string s) {
  std::stringstream in(s), out;
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("DEFINE_MATMUL_INT8_ALL(", 0) != 0 &&
        line.rfind("DEFINE_MATMUL_INT8_AMX(", 0) != 0)
      out << line << "\n";
  return out.str();
}

struct Shape {
  const char* type;  // q4_0 q8_0 q4_k q5_k q6_k
  unsigned rows, k;
  int count;  // per decode token
};
static unsigned tiled_bytes(const std::string& t) {
  return t == "q4_k" ? 2304 : t == "q6_k" ? 3392 : t == "q5_k" ? 2816 : t == "q8_0" ? 544 : 288;
}
static unsigned block_elems(const std::string& t) {
  return t.back() == 'k' ? 256 : 32;
}
// A block's bytes in the file (ggml's layouts), for the GB/s figures.
static unsigned block_bytes(const std::string& t) {
  return t == "q4_k" ? 144 : t == "q5_k" ? 176 : t == "q6_k" ? 210 : t == "q8_0" ? 34 : 18;
}

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "services/gpu_svc/kernels";
  const std::string variant = argc > 2 ? argv[2] : "vnni_a16";  // ISA_aBITS
  const std::string mix = argc > 3 ? argv[3] : "q4_k_m";
  const int reps = argc > 4 ? std::atoi(argv[4]) : 5;
  const int T = std::getenv("KQH_T") ? std::atoi(std::getenv("KQH_T")) : 1;
  const std::string extra_defs = std::getenv("KQH_DEFS") ? std::getenv("KQH_DEFS") : "";
  std::string src = slurp(dir + "/_common.cl") +
                    "inline int matmul_out_row(global const int* tok, int rows_from_table, uint t) "
                    "{ return rows_from_table ? tok[4 * t + TOK_LOGITS] : (int)t; }\n" +
                    strip_defs(slurp(dir + "/matmul_int8.cl")) +
                    strip_defs(slurp(dir + "/matmul_int8_amx.cl")) +
                    strip_defs(slurp(dir + "/matmul_kq_cpu.cl"));
  const std::string isa = variant.substr(0, variant.find('_'));
  const std::string bits = variant.substr(variant.find("_a") + 2);
  std::vector<std::string> types = {"q4_0", "q8_0", "q4_k", "q5_k", "q6_k"};
  std::string defs = "#if defined(__x86_64__) && defined(__clang__)\n";
  for (auto& t : types)
    defs += std::string("DEFINE_MATMUL_INT8(") + (t.back() == 'k' ? "KQ_ITEM" : "MMI_ITEM") + ", " +
            t + ", " + std::to_string(T) + ", " + isa + ", " + bits + ", tiled)\n";
  defs += extra_defs + "\n#endif\n";
  src += defs;

  // AMX kernels (KQH_T=16, ISA amx): the process asks for the tile state first (as gpu_svc).
  if (isa == "amx" &&
      syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) {
    std::perror("arch_prctl(ARCH_REQ_XCOMP_PERM)");
    return 1;
  }
  cl_platform_id plat;
  CK(clGetPlatformIDs(1, &plat, nullptr));
  cl_device_id dev;
  CK(clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, nullptr));
  cl_int err;
  cl_context ctx = clCreateContext(nullptr, 1, &dev, nullptr, nullptr, &err);
  CK(err);
  cl_command_queue qu = clCreateCommandQueue(ctx, dev, 0, &err);
  CK(err);
  const char* s = src.c_str();
  cl_program prog = clCreateProgramWithSource(ctx, 1, &s, nullptr, &err);
  CK(err);
  auto t0 = std::chrono::steady_clock::now();
  const std::string opts = std::string("-cl-std=CL1.2 -cl-mad-enable ") +
                           (std::getenv("KQH_OPTS") ? std::getenv("KQH_OPTS") : "");
  err = clBuildProgram(prog, 1, &dev, opts.c_str(), nullptr, nullptr);
  if (err) {
    size_t n;
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
    std::string log(n, 0);
    clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
    std::fprintf(stderr, "%s\n", log.c_str());
    return 1;
  }
  std::fprintf(stderr, "build %.1f s\n",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  // llama3.2-1b per layer (x16) + output; Q4_K_M by llama.cpp's rule: attn_v and ffn_down Q6_K
  // on layers i < 2, i >= 14, (i - 2) % 3 == 2 (use_more_bits), else Q4_K.
  std::vector<Shape> calls;
  auto kt = [&](const char* dflt) { return mix == "q4_k_m" ? dflt : mix.c_str(); };
  for (int l = 0; l < 16; ++l) {
    const bool more = l < 2 || l >= 14 || (l - 2) % 3 == 2;
    calls.push_back({kt("q4_k"), 2048, 2048, 1});
    calls.push_back({kt("q4_k"), 512, 2048, 1});
    calls.push_back({kt(more ? "q6_k" : "q4_k"), 512, 2048, 1});
    calls.push_back({kt("q4_k"), 2048, 2048, 1});
    calls.push_back({kt("q4_k"), 8192, 2048, 1});
    calls.push_back({kt("q4_k"), 8192, 2048, 1});
    calls.push_back({kt(more ? "q6_k" : "q4_k"), 2048, 8192, 1});
  }
  const char* only = std::getenv("KQH_ONLY");  // e.g. q6_k: time only those calls
  calls.push_back({kt("q6_k"), 128256, 2048, 1});
  std::vector<cl_mem> bufs;
  std::vector<void*> hosts;
  double bytes = 0, flops = 0;
  std::mt19937 rng(1);
  const bool hot = std::getenv("KQH_HOT") && *std::getenv("KQH_HOT") == 0x31;
  for (auto& c : calls) {
    if (hot && !bufs.empty() && &c != &calls.back()) {
      size_t j = 0;
      while (
          !(calls[j].rows == c.rows && calls[j].k == c.k && std::string(calls[j].type) == c.type))
        ++j;
      if (j < bufs.size()) {
        bufs.push_back(bufs[j]);
        if (!only || std::string(only) == c.type) {
          bytes += (double)c.rows * c.k / block_elems(c.type) * block_bytes(c.type);
          flops += 2.0 * c.rows * c.k;
        }
        continue;
      }
    }
    const size_t nb =
        (size_t)(c.rows + 15) / 16 * (c.k / block_elems(c.type)) * tiled_bytes(c.type);
    void* h = std::aligned_alloc(64, (nb + 63) / 64 * 64);
    auto* u = (uint32_t*)h;
    // Every fp16 half finite and normal (exponent field 1..14): the kernels' fp16 -> float
    // conversion (mmi_fp16_to_float) makes a subnormal half a subnormal float before its 2^112
    // scaling, and on Intel cores a subnormal operand costs a microcode assist per vector (Q4_0's
    // hot GEMVs ran 2x slower with the exponent field 0 allowed; real files' scales are normal).
    for (size_t i = 0; i < nb / 4; ++i) u[i] = (rng() & 0x3BFF3BFF) | 0x04000400;
    hosts.push_back(h);
    bufs.push_back(clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, nb, h, &err));
    CK(err);
    if (!only || std::string(only) == c.type) {
      bytes += (double)c.rows * c.k / block_elems(c.type) * block_bytes(c.type);
      flops += 2.0 * c.rows * c.k * T;
    }
  }
  // 16 tokens' quantised input at k = 8192 (16-token items read all), in the kernels' layout:
  // groups of MMI_TILE token slots (64 bytes each), then their float scales and int sums.
  const size_t at_tile = src.find("#define MMI_TILE ");
  const size_t tile = at_tile == std::string::npos ? 8 : std::stoul(src.substr(at_tile + 17));
  const size_t group_bytes = 80 * tile, qgroups = 16 / tile * 8192 / 32;
  const size_t qbytes = qgroups * group_bytes;
  std::vector<unsigned char> qh(qbytes);
  for (size_t g = 0; g < qgroups; ++g) {
    for (size_t i = 0; i < group_bytes; ++i) qh[g * group_bytes + i] = rng() & 0xFF;
    for (size_t s = 0; s < tile; ++s) {
      float d = 0.01f;
      std::memcpy(&qh[g * group_bytes + 64 * tile + 4 * s], &d, 4);
    }
  }
  cl_mem q = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, qbytes, qh.data(), &err);
  CK(err);
  cl_mem arena = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 128256 * 4 + 4096, nullptr, &err);
  CK(err);
  std::vector<cl_kernel> ks;
  for (auto& c : calls) {
    const std::string name =
        std::string("matmul_i8_") + c.type + "_t" + std::to_string(T) + "_" + variant + "_tiled";
    cl_kernel k = clCreateKernel(prog, name.c_str(), &err);
    if (err) {
      std::fprintf(stderr, "no kernel %s\n", name.c_str());
      return 1;
    }
    ks.push_back(k);
  }
  auto cpu_now = [] {
    rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
           u.ru_stime.tv_usec * 1e-6;
  };
  double best = 1e9, best_cpu = 1e9;
  for (int r = 0; r < reps; ++r) {
    auto a = std::chrono::steady_clock::now();
    const double c0 = cpu_now();
    for (size_t i = 0; i < calls.size(); ++i) {
      if (only && std::string(only) != calls[i].type) continue;
      cl_kernel k = ks[i];
      const cl_ulong zero = 0;
      const cl_uint kk = calls[i].k, ys = 0, rb = 0, re = calls[i].rows, tb = 0, te = T;
      const cl_int rft = 0;
      int a_ = 0;
      clSetKernelArg(k, a_++, sizeof(cl_mem), &bufs[i]);
      clSetKernelArg(k, a_++, 8, &zero);
      clSetKernelArg(k, a_++, 4, &kk);
      clSetKernelArg(k, a_++, sizeof(cl_mem), &arena);
      clSetKernelArg(k, a_++, 8, &zero);
      clSetKernelArg(k, a_++, 4, &ys);
      clSetKernelArg(k, a_++, 4, &rb);
      clSetKernelArg(k, a_++, 4, &re);
      clSetKernelArg(k, a_++, 4, &tb);
      clSetKernelArg(k, a_++, 4, &te);
      clSetKernelArg(k, a_++, 8, &zero);
      clSetKernelArg(k, a_++, 4, &rft);
      clSetKernelArg(k, a_++, sizeof(cl_mem), &q);
      const size_t items = (calls[i].rows + 15) / 16;
      const size_t group = std::getenv("KQH_GROUP") ? std::atoi(std::getenv("KQH_GROUP")) : 4;
      const size_t global[2] = {(items + group - 1) / group * group, 1}, local[2] = {group, 1};
      CK(clEnqueueNDRangeKernel(qu, k, 2, nullptr, global, local, 0, nullptr, nullptr));
    }
    CK(clFinish(qu));
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
    const double cpu = cpu_now() - c0;
    if (r > 0 && sec < best) best = sec;
    if (r > 0 && cpu < best_cpu) best_cpu = cpu;
    std::printf("rep %d: %.2f ms wall, %.2f ms cpu\n", r, sec * 1e3, cpu * 1e3);
  }
  {
    std::vector<float> y(128256);
    CK(clEnqueueReadBuffer(qu, arena, CL_TRUE, 0, y.size() * 4, y.data(), 0, nullptr, nullptr));
    double sum = 0;
    for (float v : y) sum += v;
    uint64_t h = 1469598103934665603ull;
    for (float v : y) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      h = (h ^ b) * 1099511628211ull;
    }
    std::printf("y checksum %.6g hash %016llx\n", sum, (unsigned long long)h);
  }
  std::printf(
      "%s %s%s: best wall %.2f ms = %.1f tok/s, %.1f GB/s; best cpu %.2f ms (/2 = %.1f tok/s at 2 "
      "cores, %.1f GB/s)\n",
      mix.c_str(), variant.c_str(), only ? (std::string(" only ") + only).c_str() : "", best * 1e3,
      1 / best, bytes / best / 1e9, best_cpu * 1e3, 2 / best_cpu, 2 * bytes / best_cpu / 1e9);
  return 0;
}
