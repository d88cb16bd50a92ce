#include "core/planner/soc_profile_fit.h"

#include <cmath>
#include <functional>
#include <sstream>
#include <vector>

#include "core/base/error.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"

namespace duet {
namespace {

struct Param {
  const char* name;
  std::function<double&(SocProfile&)> ref;
};

struct Fit {
  double rms_log = 0, worst = 1;
};

// Ops timed inside real steps (timing "steps", core/planner/trace_profile.h) are matched to the
// pipelined op models, ops timed one request at a time to the isolated ones.
Fit evaluate(const SocProfile& soc, const std::vector<ProfileEntry>& points, Device device,
             bool in_steps) {
  Fit f;
  double sum = 0;
  for (const ProfileEntry& e : points) {
    const OpShape s{e.kind, e.wtype, e.m, e.k, e.n, true};
    const double modelled = device == Device::gpu
                                ? (in_steps ? gpu_pipelined_us(soc, s) : gpu_modeled_us(soc, s))
                                : (in_steps ? npu_pipelined_us(soc, s) : npu_modeled_us(soc, s));
    const double r = std::log(std::max(modelled, 1e-3) / e.us);
    sum += r * r;
    if (std::abs(r) > std::abs(std::log(f.worst))) f.worst = std::exp(r);
  }
  f.rms_log = std::sqrt(sum / static_cast<double>(points.size()));
  return f;
}

// A coarse scan first: the rate parameters (`rates`) scaled together and the fixed costs
// (`costs`) scaled together over a grid of powers of two, so that the descent starts near a
// machine of the right speed (another machine can be 100x slower than the starting profile);
// then multiplicative coordinate descent: each parameter in turn is scaled by every factor while
// the error falls, the factors shrinking once a sweep finds nothing. The models have kinks (max,
// min), so the whole schedule runs twice.
void descend(SocProfile& soc, const std::vector<Param>& params, size_t rates, size_t costs,
             const std::vector<ProfileEntry>& points, Device device, bool in_steps) {
  double best = evaluate(soc, points, device, in_steps).rms_log;
  {
    const SocProfile base = soc;
    SocProfile pick = soc;
    for (int fr = -10; fr <= 4; ++fr)
      for (int fc = -8; fc <= 6; ++fc) {
        SocProfile trial = base;
        for (size_t i = 0; i < params.size(); ++i) {
          if (i < rates)
            params[i].ref(trial) *= std::ldexp(1.0, fr);
          else if (i < rates + costs)
            params[i].ref(trial) *= std::ldexp(1.0, fc);
        }
        const double e = evaluate(trial, points, device, in_steps).rms_log;
        if (e < best) {
          best = e;
          pick = trial;
        }
      }
    soc = pick;
  }
  for (int pass = 0; pass < 2; ++pass)
    for (double step : {4.0, 2.0, 1.4, 1.15, 1.05, 1.01}) {
      for (int sweep = 0; sweep < 40; ++sweep) {
        bool improved = false;
        for (const Param& p : params) {
          for (double f : {step, 1.0 / step}) {
            for (;;) {
              double& v = p.ref(soc);
              const double old = v;
              v = old * f;
              const double e = evaluate(soc, points, device, in_steps).rms_log;
              if (e < best - 1e-9) {
                best = e;
                improved = true;
              } else {
                v = old;
                break;
              }
            }
          }
        }
        if (!improved) break;
      }
    }
}

}  // namespace

SocFitReport fit_soc_profile(const Profile& measured, const SocProfile& start,
                             const std::string& name, double fast_sync_us) {
  std::vector<ProfileEntry> gpu, npu;
  for (const ProfileEntry& e : measured.entries) {
    if (e.us <= 0 || (e.kind != OpKind::MatMul && e.kind != OpKind::Logits)) continue;
    (e.device == Device::gpu ? gpu : npu).push_back(e);
  }
  if (gpu.empty() || npu.empty())
    throw Error(Errc::invalid_argument, "fit_soc_profile: the profile of " + measured.device +
                                            " needs GPU and NPU matmul entries");
  SocFitReport r;
  r.soc = start;
  r.soc.name = name;
  r.soc.path.clear();
  SocProfile& soc = r.soc;
  const bool in_steps = measured.timing == "steps";
  // A pipelined GEMV streams at memory.single_gbps when it is set; fitting in-step times, let it
  // stream at the fitted gpu.bandwidth_gbps instead (single_gbps is set from it below).
  if (in_steps) soc.mem.single_gbps = 0;
  // Zero-valued starting parameters cannot be scaled: give them a small positive start.
  for (const char* k : {"gemv_half_rows", "gemv_gflops", "gemm_half_tokens", "matmul_fixed_us"})
    if (!(soc.gpu.params[k] > 0)) soc.gpu.params[k] = 1;
  if (!(soc.gpu.launch_us > 0)) soc.gpu.launch_us = 1;
  if (!(soc.npu.launch_us > 0)) soc.npu.launch_us = 1;
  if (!(soc.npu.fill_cycles > 0)) soc.npu.fill_cycles = 1;
  if (!(soc.npu.stationary_load_cycles > 0)) soc.npu.stationary_load_cycles = 1;
  // The timeline adds an NPU graph's activation I/O to its op time in a step; a profile measured
  // here already holds whatever moving activations costs on this machine (in the ops' times).
  soc.npu.activation_io_us_per_mb = 0;

  // Rates first, then fixed costs, then the shape parameters (descend's scan groups them).
  const std::vector<Param> gpu_params = {
      {"bandwidth_gbps", [](SocProfile& s) -> double& { return s.gpu.bandwidth_gbps; }},
      {"achievable_gflops", [](SocProfile& s) -> double& { return s.gpu.achievable_gflops; }},
      {"gemv_gflops", [](SocProfile& s) -> double& { return s.gpu.params["gemv_gflops"]; }},
      {"launch_us", [](SocProfile& s) -> double& { return s.gpu.launch_us; }},
      {"matmul_fixed_us", [](SocProfile& s) -> double& { return s.gpu.params["matmul_fixed_us"]; }},
      {"gemv_half_rows", [](SocProfile& s) -> double& { return s.gpu.params["gemv_half_rows"]; }},
      {"gemm_half_tokens",
       [](SocProfile& s) -> double& { return s.gpu.params["gemm_half_tokens"]; }},
  };
  const std::vector<Param> npu_params = {
      {"clock_ghz", [](SocProfile& s) -> double& { return s.npu.clock_ghz; }},
      {"dma_gbps", [](SocProfile& s) -> double& { return s.npu.dma_gbps; }},
      {"launch_us", [](SocProfile& s) -> double& { return s.npu.launch_us; }},
      {"stationary_load_cycles",
       [](SocProfile& s) -> double& { return s.npu.stationary_load_cycles; }},
      {"fill_cycles", [](SocProfile& s) -> double& { return s.npu.fill_cycles; }},
      {"sram_bytes", [](SocProfile& s) -> double& { return s.npu.sram_bytes; }},
  };
  descend(soc, gpu_params, 3, 2, gpu, Device::gpu, in_steps);
  // The NPU's structure too: the machine measured may not be 32x32 arrays x 4 (this host's "NPU"
  // is an emulator's CPU GEMM, whose time grows with every token: 1x1 "arrays"). Each candidate
  // is fitted and the best kept.
  {
    SocProfile best = soc;
    double best_e = 1e300;
    for (int arr : {32, 16, 8, 4, 1})
      for (int cores : {1, 2, 4, 8, 16}) {
        SocProfile trial = soc;
        trial.npu.array_rows = trial.npu.array_cols = arr;
        trial.npu.cores = cores;
        descend(trial, npu_params, 2, 1, npu, Device::npu, in_steps);
        const double e = evaluate(trial, npu, Device::npu, in_steps).rms_log;
        if (e < best_e) {
          best_e = e;
          best = trial;
        }
      }
    // Or a processor that reads the weights and then computes (npu_timing.h, [npu] cpu_gflops):
    // the emulator's own cost structure. Kept when it fits better.
    SocProfile cpu = soc;
    cpu.npu.cpu_gflops = 10;
    cpu.npu.cpu_weight_gbps = 5;
    cpu.npu.cpu_call_us = 10;
    // npu_svc's GEMM dequantises a tile of weight rows first from 4 tokens on (npu_gemm.cpp's
    // kDequantiseMinTokens): a structural fact of this "NPU", not fitted; its rate is.
    cpu.npu.cpu_dequant_gbps = 5;
    cpu.npu.cpu_dequant_min_tokens = 4;
    const std::vector<Param> cpu_params = {
        {"cpu_gflops", [](SocProfile& s) -> double& { return s.npu.cpu_gflops; }},
        {"cpu_weight_gbps", [](SocProfile& s) -> double& { return s.npu.cpu_weight_gbps; }},
        {"cpu_dequant_gbps", [](SocProfile& s) -> double& { return s.npu.cpu_dequant_gbps; }},
        {"cpu_call_us", [](SocProfile& s) -> double& { return s.npu.cpu_call_us; }},
    };
    descend(cpu, cpu_params, 3, 1, npu, Device::npu, in_steps);
    if (evaluate(cpu, npu, Device::npu, in_steps).rms_log < best_e) best = cpu;
    soc = best;
  }
  const Fit g = evaluate(soc, gpu, Device::gpu, in_steps),
            n = evaluate(soc, npu, Device::npu, in_steps);
  r.gpu_points = gpu.size();
  r.npu_points = npu.size();
  r.gpu_rms_log = g.rms_log;
  r.gpu_worst = g.worst;
  r.npu_rms_log = n.rms_log;
  r.npu_worst = n.worst;

  // One processor's stream: the GPU's fitted bandwidth; together they get (2 - contention) x it.
  soc.mem.single_gbps = soc.gpu.bandwidth_gbps;
  soc.mem.dual_gbps = soc.gpu.bandwidth_gbps * (2.0 - std::clamp(measured.contention, 0.0, 1.0));
  soc.mem.peak_gbps = std::max(soc.mem.peak_gbps, soc.mem.dual_gbps);
  // Fitted from traced steps, the profile is this host's, whose two device processes share its
  // cores: where their ops overlap they take turns (the split plans' steps check it: the host
  // check runs the SoC's tensor plan, which the fit never sees).
  if (in_steps) soc.mem.shared_cores = 1;
  soc.gpu.peak_gflops = std::max(soc.gpu.peak_gflops, soc.gpu.achievable_gflops);
  if (fast_sync_us > 0) soc.gpu.params["fast_sync_us"] = fast_sync_us;
  return r;
}

nlohmann::json soc_fit_report_json(const SocFitReport& r, const Profile& measured) {
  return {{"gpu_points", r.gpu_points},        {"gpu_rms_log", r.gpu_rms_log},
          {"gpu_worst_ratio", r.gpu_worst},    {"npu_points", r.npu_points},
          {"npu_rms_log", r.npu_rms_log},      {"npu_worst_ratio", r.npu_worst},
          {"contention", measured.contention}, {"handoff_us", measured.handoff_us}};
}

std::string soc_profile_toml(const SocProfile& soc, const std::string& comment) {
  std::ostringstream t;
  t.precision(8);
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) t << "# " << line << "\n";
  t << "name = \"" << soc.name << "\"\n\n[npu]\n"
    << "cores = " << soc.npu.cores << "\narray_rows = " << soc.npu.array_rows
    << "\narray_cols = " << soc.npu.array_cols << "\nclock_ghz = " << soc.npu.clock_ghz
    << "\nsram_bytes = " << soc.npu.sram_bytes << "\ndma_gbps = " << soc.npu.dma_gbps
    << "\nlaunch_us = " << soc.npu.launch_us
    << "\ncompile_us_per_mb = " << soc.npu.compile_us_per_mb
    << "\ncompile_base_us = " << soc.npu.compile_base_us
    << "\nactivation_io_us_per_mb = " << soc.npu.activation_io_us_per_mb
    << "\nstationary_load_cycles = " << soc.npu.stationary_load_cycles
    << "\nstationary_fetch_cycles = " << soc.npu.stationary_fetch_cycles
    << "\nfill_cycles = " << soc.npu.fill_cycles << "\nop_gap_us = " << soc.npu.op_gap_us
    << "\nop_gap_us_per_token = " << soc.npu.op_gap_us_per_token;
  if (soc.npu.cpu_gflops > 0)
    t << "\ncpu_gflops = " << soc.npu.cpu_gflops
      << "\ncpu_weight_gbps = " << soc.npu.cpu_weight_gbps
      << "\ncpu_call_us = " << soc.npu.cpu_call_us
      << "\ncpu_dequant_gbps = " << soc.npu.cpu_dequant_gbps
      << "\ncpu_dequant_min_tokens = " << soc.npu.cpu_dequant_min_tokens;
  t << "\n\n[gpu]\n"
    << "peak_gflops = " << soc.gpu.peak_gflops
    << "\nachievable_gflops = " << soc.gpu.achievable_gflops
    << "\nbandwidth_gbps = " << soc.gpu.bandwidth_gbps << "\nsync_us = " << soc.gpu.sync_us
    << "\nlaunch_us = " << soc.gpu.launch_us << "\n\n[gpu.params]\n";
  for (const auto& [k, v] : soc.gpu.params) t << k << " = " << v << "\n";
  t << "\n[memory]\npeak_gbps = " << soc.mem.peak_gbps << "\nsingle_gbps = " << soc.mem.single_gbps
    << "\ndual_gbps = " << soc.mem.dual_gbps << "\n";
  if (soc.mem.shared_cores > 0) t << "shared_cores = " << soc.mem.shared_cores << "\n";
  return t.str();
}

}  // namespace duet
