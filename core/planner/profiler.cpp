#include "core/planner/profiler.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/messaging.h"
#include "core/model/model.h"
#include "core/planner/gpu_timing.h"
#include "core/planner/npu_timing.h"

namespace duet {
namespace {

std::string device_key(Device d) {
  return d == Device::gpu ? "gpu" : "npu";
}

Device device_from_key(const std::string& s) {
  if (s == "gpu") return Device::gpu;
  if (s == "npu") return Device::npu;
  throw Error(Errc::bad_format, "profile: unknown device '" + s + "'");
}

DType dtype_from_name(const std::string& s) {
  for (DType t : {DType::F32, DType::F16, DType::Q4_0, DType::Q8_0})
    if (dtype_name(t) == s) return t;
  throw Error(Errc::bad_format, "profile: unknown weight type '" + s + "'");
}

// File names carry keys: anything but [A-Za-z0-9._-] becomes '_'.
std::string file_safe(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return out;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

std::vector<WeightShape> model_weight_shapes(const ModelShape& s, DType wtype) {
  const int64_t head_dim = s.n_embd / s.n_head;
  const int64_t kv_dim = head_dim * s.n_head_kv;
  using R = MatmulRole;
  return {
      {"q", OpKind::MatMul, wtype, s.n_embd, s.n_embd, {R::q}},
      {"k", OpKind::MatMul, wtype, kv_dim, s.n_embd, {R::k}},
      {"v", OpKind::MatMul, wtype, kv_dim, s.n_embd, {R::v}},
      {"o", OpKind::MatMul, wtype, s.n_embd, s.n_embd, {R::o}},
      {"gate+up", OpKind::MatMul, wtype, 2 * int64_t{s.n_ff}, s.n_embd, {R::gate, R::up}},
      {"down", OpKind::MatMul, wtype, s.n_embd, s.n_ff, {R::down}},
      {"logits", OpKind::Logits, wtype, s.n_vocab, s.n_embd, {R::logits}},
  };
}

std::vector<WeightShape> model_weight_shapes(const LlamaModel& model) {
  if (model.layers.empty()) throw Error(Errc::invalid_argument, "model has no layers to profile");
  const LlamaLayer& l = model.layers[0];
  using R = MatmulRole;
  auto shape = [](std::string name, OpKind kind, const ops::Matrix& w, int64_t m,
                  std::vector<R> roles) {
    return WeightShape{std::move(name), kind, w.type, m, w.cols, std::move(roles)};
  };
  return {
      shape("q", OpKind::MatMul, l.wq, l.wq.rows, {R::q}),
      shape("k", OpKind::MatMul, l.wk, l.wk.rows, {R::k}),
      shape("v", OpKind::MatMul, l.wv, l.wv.rows, {R::v}),
      shape("o", OpKind::MatMul, l.wo, l.wo.rows, {R::o}),
      shape("gate+up", OpKind::MatMul, l.w_gate, l.w_gate.rows + l.w_up.rows, {R::gate, R::up}),
      shape("down", OpKind::MatMul, l.w_down, l.w_down.rows, {R::down}),
      shape("logits", OpKind::Logits, model.output, model.output.rows, {R::logits}),
  };
}

std::vector<int64_t> standard_profile_lengths() {
  return {1, 32, 64, 128, 256, 512, 1024};
}
std::vector<int64_t> sweep_profile_lengths() {
  return {8, 16, 48, 96, 160, 192, 224, 320, 384, 448, 640, 768, 896};
}

std::string Profile::fingerprint() const {
  std::ostringstream os;
  os << timing << '|' << device << '|' << soc << '|' << shape << '|' << contention << '|'
     << handoff_us;
  for (const ProfileEntry& e : entries)
    os << '|' << static_cast<int>(e.device) << ',' << static_cast<int>(e.kind) << ','
       << static_cast<int>(e.wtype) << ',' << e.m << ',' << e.k << ',' << e.n << ',' << e.us;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(os.str())));
  return buf;
}

nlohmann::json Profile::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const ProfileEntry& e : entries)
    rows.push_back({device_key(e.device), op_kind_name(e.kind), std::string(dtype_name(e.wtype)),
                    e.m, e.k, e.n, e.us});
  return {{"timing", timing},
          {"device", device},
          {"soc", soc},
          {"shape", shape},
          {"profiling_s", profiling_s},
          {"contention", contention},
          {"contention_samples", contention_samples},
          {"handoff_us", handoff_us},
          {"columns", {"device", "kind", "wtype", "m", "k", "n", "us"}},
          {"entries", rows}};
}

Profile Profile::from_json(const nlohmann::json& j) {
  Profile p;
  try {
    p.timing = j.at("timing").get<std::string>();
    p.device = j.at("device").get<std::string>();
    p.soc = j.at("soc").get<std::string>();
    p.shape = j.at("shape").get<std::string>();
    p.profiling_s = j.at("profiling_s").get<double>();
    p.contention = j.value("contention", 0.0);  // older profiles: none measured
    if (!(p.contention >= 0 && p.contention <= 1))
      throw Error(Errc::bad_format, "profile: contention must be in [0, 1]");
    p.contention_samples = j.value("contention_samples", std::vector<double>{});
    p.handoff_us = j.value("handoff_us", 0.0);
    for (const auto& r : j.at("entries")) {
      if (!r.is_array() || r.size() != 7)
        throw Error(Errc::bad_format, "profile entry is not [7 values]: " + r.dump());
      ProfileEntry e;
      e.device = device_from_key(r[0].get<std::string>());
      const std::string kind = r[1].get<std::string>();
      if (kind == "MatMul")
        e.kind = OpKind::MatMul;
      else if (kind == "Logits")
        e.kind = OpKind::Logits;
      else
        throw Error(Errc::bad_format, "profile: op kind '" + kind + "' is not a matmul");
      e.wtype = dtype_from_name(r[2].get<std::string>());
      e.m = r[3].get<int64_t>();
      e.k = r[4].get<int64_t>();
      e.n = r[5].get<int64_t>();
      e.us = r[6].get<double>();
      p.entries.push_back(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::bad_format, std::string("profile JSON: ") + e.what());
  }
  return p;
}

double ModeledOpTimer::time_us(Device device, const OpShape& shape) {
  return device == Device::gpu ? gpu_modeled_us(soc_, shape) : npu_modeled_us(soc_, shape);
}

struct ServiceOpTimer::Clients {
  msg::RequestClient gpu, npu;
  Clients(const std::string& g, const std::string& n) : gpu(g), npu(n) {}
};

ServiceOpTimer::ServiceOpTimer(const std::string& gpu_endpoint, const std::string& npu_endpoint,
                               uint32_t reps, std::chrono::milliseconds timeout)
    : clients_(std::make_unique<Clients>(gpu_endpoint, npu_endpoint)),
      reps_(reps),
      timeout_(timeout) {
  if (reps_ == 0) throw Error(Errc::invalid_argument, "measured profiling needs reps >= 1");
}
ServiceOpTimer::~ServiceOpTimer() = default;

namespace {

double profile_op(msg::RequestClient& client, const OpShape& s, uint32_t reps,
                  std::chrono::milliseconds timeout) {
  const msg::Reply reply = client.call(
      [&](uint64_t id) {
        flatbuffers::FlatBufferBuilder fbb;
        auto body = fb::CreateProfileOp(fbb, static_cast<fb::OpKind>(s.kind),
                                        static_cast<fb::DTypeCode>(s.wtype),
                                        static_cast<uint32_t>(s.m), static_cast<uint32_t>(s.k),
                                        static_cast<uint32_t>(s.n), reps, false);
        return msg::finish_message(fbb, id, body);
      },
      timeout);
  const auto* result = reply.message().body_as_ProfileResult();
  if (!result)
    throw Error(Errc::bad_format,
                client.endpoint() + " answered ProfileOp with something else than a ProfileResult");
  if (!(result->measured_us() > 0))
    throw Error(Errc::internal, client.endpoint() + " measured no time for " + op_shape_name(s));
  return result->measured_us();
}

}  // namespace

double ServiceOpTimer::time_us(Device device, const OpShape& s) {
  return profile_op(device == Device::gpu ? clients_->gpu : clients_->npu, s, reps_, timeout_);
}

std::optional<double> ServiceOpTimer::handoff_us(Device device, const OpShape& s) {
  const auto t0 = std::chrono::steady_clock::now();
  const double op =
      profile_op(device == Device::gpu ? clients_->gpu : clients_->npu, s, 1, timeout_);
  const double wall =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  return std::max(0.0, wall - op);
}

std::optional<std::pair<double, double>> ServiceOpTimer::concurrent_us(const OpShape& gpu,
                                                                       uint32_t gpu_reps,
                                                                       const OpShape& npu,
                                                                       uint32_t npu_reps) {
  // Each client is used by one thread only; the NPU's result or error comes back by the future.
  auto npu_done = std::async(std::launch::async,
                             [&] { return profile_op(clients_->npu, npu, npu_reps, timeout_); });
  double gpu_us = 0;
  try {
    gpu_us = profile_op(clients_->gpu, gpu, gpu_reps, timeout_);
  } catch (...) {
    npu_done.wait();
    throw;
  }
  return std::make_pair(gpu_us, npu_done.get());
}

namespace {

// Half of a weight's rows on each device, alone and then both at once, at the shortest and the
// longest profiled length. The GPU repeats its half for ~400 ms and the NPU its half for ~50 ms,
// so every NPU repetition runs while the GPU does, whatever each does first (the NPU fills its
// weights, the GPU warms up): the NPU's slowdown under the GPU's load, b'/b - 1, is 0 for
// devices that share nothing and 1 for devices that split the same cores.
void measure_contention(const ProfileSpec& spec, OpTimer& timer,
                        const std::vector<int64_t>& lengths, Profile& p) {
  for (const WeightShape& w : spec.weights) {
    if (w.kind != OpKind::MatMul || w.m < 64) continue;
    const int64_t half = w.m / 2 / 32 * 32;
    for (int64_t n : {lengths.front(), lengths.back()}) {
      const OpShape g{w.kind, w.wtype, half, w.k, n, true};
      const OpShape q{w.kind, w.wtype, w.m - half, w.k, n, true};
      const double alone_gpu = timer.time_us(Device::gpu, g);
      const double alone_npu = timer.time_us(Device::npu, q);
      auto reps_for = [](double us, double window_us) {
        return static_cast<uint32_t>(std::clamp(window_us / std::max(us, 1.0), 3.0, 1000.0));
      };
      const auto both =
          timer.concurrent_us(g, reps_for(alone_gpu, 400000), q, reps_for(alone_npu, 50000));
      if (!both) return;
      p.contention_samples.push_back(std::clamp(both->second / alone_npu - 1.0, 0.0, 1.0));
    }
  }
  if (p.contention_samples.empty()) return;
  std::vector<double> s = p.contention_samples;
  std::sort(s.begin(), s.end());
  p.contention = s[s.size() / 2];
}

// The median overhead of 20 minimal requests to each device service.
void measure_handoff(const ProfileSpec& spec, OpTimer& timer, Profile& p) {
  const WeightShape& w = spec.weights.front();
  const OpShape tiny{w.kind, w.wtype, 32, w.k, 1, true};
  std::vector<double> samples;
  for (int i = 0; i < 20; ++i)
    for (Device d : {Device::gpu, Device::npu})
      if (const auto h = timer.handoff_us(d, tiny)) samples.push_back(*h);
  if (samples.empty()) return;
  std::sort(samples.begin(), samples.end());
  p.handoff_us = samples[samples.size() / 2];
}

}  // namespace

Profile run_profile(const ProfileSpec& spec, OpTimer& timer, const std::string& timing,
                    const std::string& soc, const std::string& shape) {
  if (spec.weights.empty())
    throw Error(Errc::invalid_argument, "profile spec names no weight shapes");
  if (spec.row_steps < 1)
    throw Error(Errc::invalid_argument, "profile spec: row_steps must be >= 1");
  std::vector<int64_t> lengths = spec.lengths;
  if (lengths.empty()) {
    lengths = standard_profile_lengths();
    for (int64_t n : sweep_profile_lengths()) lengths.push_back(n);
  }
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  if (lengths.front() < 1)
    throw Error(Errc::invalid_argument, "profile spec: token counts must be >= 1");

  Profile p;
  p.timing = timing;
  p.device = timer.device_name();
  p.soc = soc;
  p.shape = shape;
  const auto start = std::chrono::steady_clock::now();
  for (const WeightShape& w : spec.weights) {
    // The solver splits weights on a 32-row grid; rows below one tile are not worth profiling.
    std::vector<int64_t> rows;
    for (int j = 1; j <= spec.row_steps; ++j) {
      const int64_t r =
          j == spec.row_steps ? w.m : std::max<int64_t>(32, w.m * j / spec.row_steps / 32 * 32);
      if (r <= w.m && (rows.empty() || rows.back() != r)) rows.push_back(r);
    }
    for (Device d : {Device::gpu, Device::npu})
      for (int64_t r : rows)
        for (int64_t n : lengths) {
          const OpShape s{w.kind, w.wtype, r, w.k, n, true};
          p.entries.push_back({d, w.kind, w.wtype, r, w.k, n, timer.time_us(d, s)});
        }
  }
  measure_contention(spec, timer, lengths, p);
  measure_handoff(spec, timer, p);
  p.profiling_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return p;
}

std::string duet_cache_dir() {
  if (const auto d = setting_override("DUET_CACHE_DIR")) return *d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/duet";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/duet";
  throw Error(Errc::not_found, "no cache directory: set DUET_CACHE_DIR, XDG_CACHE_HOME or HOME");
}

std::string profile_cache_path(const std::string& timing, const std::string& device,
                               const std::string& soc, const std::string& shape) {
  return duet_cache_dir() + "/profiles/" +
         file_safe(timing + "-" + device + "-" + soc + "-" + shape) + ".json";
}

void save_profile(const Profile& profile, const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) throw Error(Errc::io, "cannot create the directory of " + path + ": " + ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << profile.to_json().dump() << '\n';
    if (!out) throw Error(Errc::io, "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(Errc::io, "cannot rename " + tmp + " to " + path + ": " + ec.message());
}

Profile load_profile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(Errc::not_found, "no profile at " + path);
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded()) throw Error(Errc::bad_format, path + ": not JSON");
  try {
    return Profile::from_json(j);
  } catch (const Error& e) {
    throw Error(e.code(), path + ": " + e.what());
  }
}

ProfiledLatency::ProfiledLatency(const Profile& profile, int64_t npu_tile) {
  // group -> rows -> points
  std::map<Group, std::map<int64_t, std::vector<LatencyPoint>>> points;
  for (const ProfileEntry& e : profile.entries)
    points[{static_cast<int>(e.device), static_cast<int>(e.kind), static_cast<uint32_t>(e.wtype),
            e.k}][e.m]
        .push_back({e.n, e.us});
  for (auto& [group, by_rows] : points) {
    Ladder& l = ladders_[group];
    for (auto& [rows, pts] : by_rows) {
      l.rows.push_back(rows);
      if (std::get<0>(group) == static_cast<int>(Device::gpu))
        l.gpu.push_back(GpuLatencyFn::fit(pts));
      else
        l.npu.push_back(NpuLatencyFn::fit(pts, npu_tile));
    }
  }
}

double ProfiledLatency::lookup(Device device, const OpShape& s) const {
  if (s.m <= 0 || s.k <= 0 || s.n <= 0)
    throw Error(Errc::invalid_argument, "latency of an empty op: " + op_shape_name(s));
  const auto it = ladders_.find(
      {static_cast<int>(device), static_cast<int>(s.kind), static_cast<uint32_t>(s.wtype), s.k});
  if (it == ladders_.end())
    throw Error(Errc::not_found,
                "the profile has no " + device_key(device) + " entries for " + op_shape_name(s));
  const Ladder& l = it->second;
  auto at = [&](size_t i) { return device == Device::gpu ? l.gpu[i](s.n) : l.npu[i](s.n); };
  if (l.rows.size() == 1) return at(0) * static_cast<double>(s.m) / static_cast<double>(l.rows[0]);
  size_t hi = 1;
  while (hi + 1 < l.rows.size() && l.rows[hi] < s.m) ++hi;
  const double r0 = static_cast<double>(l.rows[hi - 1]), r1 = static_cast<double>(l.rows[hi]);
  const double t0 = at(hi - 1), t1 = at(hi);
  const double t = t0 + (t1 - t0) * (static_cast<double>(s.m) - r0) / (r1 - r0);
  // Below the smallest profiled row count the line may dip under zero; a matmul never costs less
  // than a proportional share of its smallest profiled sibling.
  if (s.m < l.rows[0]) return std::max(t, t0 * static_cast<double>(s.m) / r0);
  return std::max(t, 0.0);
}

double ProfiledLatency::gpu_us(const OpShape& s) const {
  return lookup(Device::gpu, s);
}
double ProfiledLatency::npu_us(const OpShape& s) const {
  return lookup(Device::npu, s);
}

}  // namespace duet
