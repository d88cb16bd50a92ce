#pragma once
// A mobile SoC as the timing models see it: the NPU (systolic arrays), the GPU (roofline) and
// the shared memory system. Profiles are TOML files, deploy/soc/<name>.toml, parsed with
// toml++; a missing or unknown key is an error naming the file and the key.
#include <map>
#include <string>
#include <string_view>

namespace duet {

struct SocProfile {
  std::string name;
  std::string path;  // the file it was loaded from

  struct Npu {
    int cores = 0;                       // independent matrix units (one systolic array each)
    int array_rows = 0, array_cols = 0;  // PEs per array (32 x 32 on Hexagon-class NPUs)
    double clock_ghz = 0;                // array clock
    double sram_bytes = 0;               // on-chip SRAM (VTCM) usable by one graph
    double dma_gbps = 0;                 // DRAM <-> SRAM bandwidth the NPU's DMA reaches
    double launch_us = 0;                // fixed cost of executing one graph
    double compile_us_per_mb = 0;        // graph preparation cost per MB of operands
    double compile_base_us = 0;          // fixed graph preparation cost
    double activation_io_us_per_mb = 0;  // per execution: activations into and out of the graph
    double stationary_load_cycles = 0;   // cycles to (re)load one stationary tile into an array
    double stationary_fetch_cycles = 0;  // extra per load when the stationary operand is in DRAM
    double fill_cycles = 0;              // pipeline fill + drain per pass through an array
    // Optional (default 0): the NPU side's idle time between two ops of a running step beyond
    // its flag waits (a host profile fitted from `duet trace` steps; core/planner/timeline.h).
    double op_gap_us = 0;
    double op_gap_us_per_token = 0;  // optional: more per token of the step beyond the first
    // Optional (default 0: the systolic model): an NPU that is a processor which reads the
    // weights and then computes, one after the other (this host's "NPU", the emulator's CPU GEMM:
    // services/npu_svc/npu_gemm.cpp). cpu_gflops > 0 selects it: a graph costs cpu_call_us +
    // weight bytes / cpu_weight_gbps + 2 m k n / cpu_gflops (core/planner/npu_timing.h).
    double cpu_gflops = 0, cpu_weight_gbps = 0, cpu_call_us = 0;
    // ... and from cpu_dequant_min_tokens tokens on (the emulator's prefill path) the weights are
    // first dequantised into a buffer: + weight bytes / cpu_dequant_gbps (0: no such path).
    double cpu_dequant_gbps = 0, cpu_dequant_min_tokens = 0;
  } npu;

  struct Gpu {
    double peak_gflops = 0;
    double achievable_gflops = 0;
    double bandwidth_gbps = 0;
    double sync_us = 0;    // a blocking clFinish-style synchronisation
    double launch_us = 0;  // one kernel enqueue
    // Extra roofline parameters the GPU timing model needs ([gpu.params] in the file).
    std::map<std::string, double, std::less<>> params;
    double param(std::string_view key) const;  // throws Errc::not_found naming the key
    // Optional parameters (a host profile's: gpu_timing.h, timeline.h): `fallback` when absent.
    double param_or(std::string_view key, double fallback) const;
  } gpu;

  struct Memory {
    double peak_gbps = 0;    // theoretical DRAM bandwidth
    double single_gbps = 0;  // what one processor reaches alone
    double dual_gbps = 0;    // what GPU + NPU reach together
    // A host whose "GPU" and "NPU" are processes on the same CPU cores (0 on a SoC): an op that
    // overlaps the other device's ops is lengthened by shared_cores x the overlap (1: the two take
    // turns on the cores), or by the bandwidth rule's penalty where that is larger (timeline.h).
    double shared_cores = 0;
  } mem;
};

// "sd8gen3" -> deploy/soc/sd8gen3.toml, searched in $DUET_SOC_DIR, ./deploy/soc, and the
// running binary's ../../deploy/soc and ../deploy/soc; anything with a '/' or ending in .toml
// is a path. Throws duet::Error (not_found, bad_format) naming the file and the problem.
SocProfile load_soc_profile(std::string_view name_or_path);

// Parses profile text (the same checks as load_soc_profile); `origin` names it in errors.
SocProfile parse_soc_profile(std::string_view toml_text, std::string_view origin);

}  // namespace duet
