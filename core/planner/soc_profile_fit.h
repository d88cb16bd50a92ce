#pragma once
// A SoC profile for the machine the profiler measured (issue 23, item 4): the timing models'
// parameters (core/planner/gpu_timing, core/planner/npu_timing) fitted to a measured Profile
// (core/planner/profiler.h, `duet plan --timing measured`), so the modelled timeline of a run
// (core/planner/timeline.h) can be set beside its measured time on the same hardware.
//
// A profile measured inside real steps (timing "steps": core/planner/trace_profile.h) is fitted
// with the pipelined op models (gpu_pipelined_us, npu_pipelined_us), one measured an op per
// request with the isolated ones.
//
// The fit is a coordinate descent in log space over each device's free parameters, minimising the
// mean squared log ratio modelled / measured over that device's entries (both models are
// positive and monotone in each parameter; a coarse scan of the rates first, since another
// machine can be 100x off the start). The structure is the starting profile's except the NPU's
// array size and core count, chosen among a few (32x32 down to 1x1, 1 to 16 cores) by the same
// error, or the NPU as a processor that reads its weights and then computes ([npu] cpu_gflops,
// cpu_weight_gbps, cpu_call_us, cpu_dequant_gbps: npu_timing.h; this host's emulator), when that
// fits better. Host-side costs the profile measured go in directly: fast_sync_us (a flag hand-off
// between the device processes) and the contention between the two devices (memory.dual_gbps: both
// draw no more together than (2 - contention) x one alone).
#include <nlohmann/json.hpp>
#include <string>

#include "core/planner/profiler.h"
#include "core/planner/soc_profile.h"

namespace duet {

struct SocFitReport {
  SocProfile soc;
  size_t gpu_points = 0, npu_points = 0;
  double gpu_rms_log = 0, npu_rms_log = 0;  // root mean squared log(modelled / measured)
  double gpu_worst = 1, npu_worst = 1;      // the worst modelled / measured (farthest from 1)
};

// `start` supplies the structure and the starting values (e.g. sd8gen3). fast_sync_us <= 0 keeps
// start's. Throws invalid_argument when the profile has no GPU or no NPU matmul entries.
SocFitReport fit_soc_profile(const Profile& measured, const SocProfile& start,
                             const std::string& name, double fast_sync_us);

// The fit's figures as JSON (points, rms log error and worst ratio per device, and the measured
// profile's contention and handoff_us), as host_check fit and duet profile --report-json write.
nlohmann::json soc_fit_report_json(const SocFitReport& r, const Profile& measured);

// The profile as deploy/soc/<name>.toml text (load_soc_profile reads it back unchanged);
// `comment` becomes the file's leading comment lines.
std::string soc_profile_toml(const SocProfile& soc, const std::string& comment);

}  // namespace duet
