#pragma once
// The profiler (HeteroInfer section 4.4): runs the matmuls a model needs on both devices over its
// weight shapes x a set of token counts x the row fractions the solver's weight splits use, and
// keeps the latencies as a Profile. Two ways to time an op:
//   modeled   the SoC profile's timing models (core/planner/gpu_timing, core/planner/npu_timing);
//   measured  ProfileOp requests to a running gpu_svc and npu_svc (real runs here).
// Profiles are cached on disk, keyed by timing mode, device, SoC profile and model shape.
// ProfiledLatency turns a profile into the solver's LatencySource through the latency functions
// (GPU-1 piecewise linear, NPU-1 steps) and interpolation over weight rows.
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/model/shapes.h"
#include "core/planner/latency_model.h"
#include "core/planner/op_shape.h"
#include "core/planner/soc_profile.h"
#include "core/program/plan.h"

namespace duet {

class LlamaModel;

// One partitionable matmul of a decoder layer (or the logits). gate and up are one fused
// [2 n_ff, n_embd] weight, as in HeteroInfer's Table 3.
struct WeightShape {
  std::string name;  // "q", "k", "v", "o", "gate+up", "down", "logits"
  OpKind kind = OpKind::MatMul;
  DType wtype = DType::Q4_0;
  int64_t m = 0, k = 0;
  std::vector<MatmulRole> roles;  // the plan roles it places (gate+up: gate and up)
};
// The paper's models are W4A16: named shapes default to Q4_0 weights.
std::vector<WeightShape> model_weight_shapes(const ModelShape& shape, DType wtype = DType::Q4_0);
std::vector<WeightShape> model_weight_shapes(const LlamaModel& model);  // types from the file

struct ProfileEntry {
  Device device = Device::gpu;
  OpKind kind = OpKind::MatMul;
  DType wtype = DType::Q4_0;
  int64_t m = 0, k = 0, n = 0;
  double us = 0;
};

struct Profile {
  std::string timing;  // "modeled" | "measured"
  std::string device;  // what ran the ops
  std::string soc;
  std::string shape;       // model shape name or model file
  double profiling_s = 0;  // wall time the profiling took
  std::vector<ProfileEntry> entries;
  // How much the two devices slow each other when they run at once (measured: both halves of a
  // weight split together): split time = max(gpu, npu) + contention * min(gpu, npu). 0 when the
  // devices share nothing (modelled: separate processors), ~1 when they share the same cores.
  double contention = 0;
  std::vector<double> contention_samples;
  // Measured: what handing work from one device process to another costs beyond the work (the
  // median request/reply overhead of a minimal op, both services): the solver's T_sync here.
  // 0: not measured (modelled: the SoC profile's fast sync).
  double handoff_us = 0;

  // Changes whenever any entry or key changes (plans built from it are versioned by it).
  std::string fingerprint() const;
  nlohmann::json to_json() const;
  static Profile from_json(const nlohmann::json& j);  // throws bad_format naming the field
};

// 1, 32, 64, 128, 256, 512, 1024: the NPU's standard graphs and the paper's profile lengths.
std::vector<int64_t> standard_profile_lengths();
// Lengths between the standard ones (held out from fits in the latency-function tests).
std::vector<int64_t> sweep_profile_lengths();

struct ProfileSpec {
  std::vector<WeightShape> weights;
  std::vector<int64_t> lengths;  // empty: standard + sweep
  int row_steps = 8;             // each weight also at rows m*j/row_steps (NPU-tile rounded)
};

// Times one op on one device.
class OpTimer {
 public:
  virtual ~OpTimer() = default;
  virtual double time_us(Device device, const OpShape& shape) = 0;
  virtual std::string device_name() const = 0;
  // Both ops at once, one per device, each repeated its own number of times (so that both run
  // for about as long): each one's median time while the other runs. nullopt: the timer has no
  // concurrency to measure (modelled devices are separate processors).
  virtual std::optional<std::pair<double, double>> concurrent_us(const OpShape&, uint32_t,
                                                                 const OpShape&, uint32_t) {
    return std::nullopt;
  }
  // Wall time of one request minus the op time it reports, for a minimal op. nullopt: no
  // processes to hand work between.
  virtual std::optional<double> handoff_us(Device, const OpShape&) { return std::nullopt; }
};

class ModeledOpTimer : public OpTimer {
 public:
  explicit ModeledOpTimer(SocProfile soc) : soc_(std::move(soc)) {}
  double time_us(Device device, const OpShape& shape) override;
  std::string device_name() const override { return "model:" + soc_.name; }

 private:
  SocProfile soc_;
};

// Measured mode: ProfileOp to gpu_svc / npu_svc of a running stack (their control sockets).
class ServiceOpTimer : public OpTimer {
 public:
  ServiceOpTimer(const std::string& gpu_endpoint, const std::string& npu_endpoint, uint32_t reps,
                 std::chrono::milliseconds timeout);
  ~ServiceOpTimer() override;
  double time_us(Device device, const OpShape& shape) override;
  std::string device_name() const override { return "services:gpu_svc+npu_svc"; }
  std::optional<std::pair<double, double>> concurrent_us(const OpShape& gpu, uint32_t gpu_reps,
                                                         const OpShape& npu,
                                                         uint32_t npu_reps) override;
  std::optional<double> handoff_us(Device device, const OpShape& shape) override;

 private:
  struct Clients;
  std::unique_ptr<Clients> clients_;
  uint32_t reps_;
  std::chrono::milliseconds timeout_;
};

// Every (device, weight, rows, length) of the spec through `timer`. Throws what the timer throws.
Profile run_profile(const ProfileSpec& spec, OpTimer& timer, const std::string& timing,
                    const std::string& soc, const std::string& shape);

// $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet, else $HOME/.cache/duet.
std::string duet_cache_dir();
std::string profile_cache_path(const std::string& timing, const std::string& device,
                               const std::string& soc, const std::string& shape);
void save_profile(const Profile& profile, const std::string& path);  // atomic rename; throws io
Profile load_profile(const std::string& path);                       // throws not_found, bad_format

// A profile as the solver's latencies. Per (device, op kind, weight type, k) the rows profiled
// form a ladder; a query fits the latency functions of the bracketing row counts at its token
// count and interpolates linearly in rows between them.
class ProfiledLatency : public LatencySource {
 public:
  explicit ProfiledLatency(const Profile& profile, int64_t npu_tile = 32);
  double gpu_us(const OpShape& s) const override;
  double npu_us(const OpShape& s) const override;

 private:
  using Group = std::tuple<int, int, uint32_t, int64_t>;  // device, kind, wtype, k
  struct Ladder {
    std::vector<int64_t> rows;  // ascending
    std::vector<GpuLatencyFn> gpu;
    std::vector<NpuLatencyFn> npu;
  };
  double lookup(Device device, const OpShape& s) const;
  std::map<Group, Ladder> ladders_;
};

}  // namespace duet
