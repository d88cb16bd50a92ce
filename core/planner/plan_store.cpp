#include "core/planner/plan_store.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/base/error.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/model/model.h"
#include "core/model/shapes.h"

namespace duet {
namespace {

const std::string kServiceDevices = "services:gpu_svc+npu_svc";

std::string file_safe(const std::string& s) {
  std::string out = s;
  for (char& c : out)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return out;
}

// Profiles and plans are keyed by the SoC profile's name, so "sd8gen3" and a path to its .toml
// (what a stack's services are given) find the same cache entries.
std::string soc_key(const std::string& soc) {
  return load_soc_profile(soc).name;
}

std::string options_fingerprint(const SolverOptions& o) {
  std::ostringstream os;
  os << "solver-v" << kSolverVersion << "|sync=" << o.sync_us << "|copy=" << o.copy_gbps
     << "|shared=" << o.shared_gbps << "|contention=" << o.contention
     << "|ratio=" << o.max_ratio_term << "|align=" << o.row_align << "|graphs=";
  for (int64_t t : o.npu_graph_tokens) os << t << ',';
  os << "|modes=";
  for (NpuGraphMode m : o.modes) os << npu_graph_mode_name(m) << ',';
  return os.str();
}

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  return j.is_discarded() ? nlohmann::json(nullptr) : j;
}

void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec) throw Error(Errc::io, "cannot create the directory of " + path + ": " + ec.message());
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp);
    out << j.dump() << '\n';
    if (!out) throw Error(Errc::io, "cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(Errc::io, "cannot rename " + tmp + " to " + path + ": " + ec.message());
}

std::string shape_text(const nlohmann::json& dims) {
  return std::to_string(dims.at(0).get<int64_t>()) + ", " +
         std::to_string(dims.at(1).get<int64_t>());
}

}  // namespace

void PlanQuery::validate() const {
  if (model_path.empty() && shape.empty())
    throw Error(Errc::invalid_argument, "plan query: no shape and no model");
  if (timing != "modeled" && timing != "measured")
    throw Error(Errc::invalid_argument,
                "plan query: timing must be modeled or measured, not '" + timing + "'");
  if (n_tokens < 1) throw Error(Errc::invalid_argument, "plan query: tokens must be >= 1");
  if (phase == Phase::decode && n_tokens != 1)
    throw Error(Errc::invalid_argument, "plan query: decode is one token per step");
  if (n_tokens > 65536) throw Error(Errc::invalid_argument, "plan query: tokens must be <= 65536");
  if (reps == 0) throw Error(Errc::invalid_argument, "plan query: reps must be >= 1");
  if (row_steps < 0 || row_steps > 64)
    throw Error(Errc::invalid_argument, "plan query: row_steps must be 0..64");
  for (int64_t n : profile_lengths)
    if (n < 1 || n > 65536)
      throw Error(Errc::invalid_argument, "plan query: profile lengths must be 1..65536");
  if (npu_mode != "auto" && npu_mode != "padding" && npu_mode != "pipe")
    throw Error(Errc::invalid_argument,
                "plan query: npu_mode must be auto, padding or pipe, not '" + npu_mode + "'");
}

QueryModel query_model(const PlanQuery& q) {
  QueryModel m;
  if (!q.model_path.empty()) {
    const auto model = LlamaModel::load(q.model_path);
    m.key = std::filesystem::path(q.model_path).filename().string();
    m.weights = model_weight_shapes(*model);
    m.n_layer = model->hp().n_layer;
  } else {
    const ModelShape& s = model_shape(q.shape);
    m.key = s.name;
    m.weights = model_weight_shapes(s);
    m.n_layer = s.n_layer;
  }
  return m;
}

Profile profile_for(const PlanQuery& q, const QueryModel& model, bool* from_cache) {
  ProfileSpec spec;
  spec.weights = model.weights;
  spec.lengths = q.profile_lengths;
  spec.row_steps = q.row_steps > 0 ? q.row_steps : q.timing == "modeled" ? 8 : 4;
  if (q.timing == "modeled") {
    ModeledOpTimer timer(load_soc_profile(q.soc));
    Profile p = run_profile(spec, timer, q.timing, soc_key(q.soc), model.key);
    if (from_cache) *from_cache = false;
    if (q.use_cache) save_profile(p, profile_cache_path(p.timing, p.device, p.soc, p.shape));
    return p;
  }
  const std::string run_dir = q.run_dir.empty() ? default_run_dir(q.stack_id) : q.run_dir;
  const std::string path = profile_cache_path(q.timing, kServiceDevices, soc_key(q.soc), model.key);
  if (profile_cached(q, model)) {
    if (from_cache) *from_cache = true;
    return load_profile(path);
  }
  // Fail fast when the devices are not there: a profiling run would otherwise wait out every
  // op's deadline.
  for (ServiceId id : {ServiceId::gpu, ServiceId::npu}) {
    const std::string socket = control_socket_path(run_dir, id);
    if (!std::filesystem::exists(socket))
      throw Error(Errc::unavailable, "measured timing needs a running " +
                                         std::string(service_name(id)) + ": no " + socket +
                                         " (start the stack, or use --timing modeled)");
    msg::RequestClient probe(ipc_endpoint(socket));
    try {
      probe.call([](uint64_t rid) { return msg::make_heartbeat(rid, 1); },
                 std::chrono::milliseconds(2000));
    } catch (const Error& e) {
      throw Error(Errc::unavailable, std::string(service_name(id)) + " at " + socket +
                                         " does not answer: " + e.what());
    }
  }
  const std::string gpu = ipc_endpoint(control_socket_path(run_dir, ServiceId::gpu));
  const std::string npu = ipc_endpoint(control_socket_path(run_dir, ServiceId::npu));
  ServiceOpTimer timer(gpu, npu, q.reps, q.op_timeout);
  Profile p = run_profile(spec, timer, q.timing, soc_key(q.soc), model.key);
  if (from_cache) *from_cache = false;
  save_profile(p, path);
  return p;
}

bool profile_cached(const PlanQuery& q, const QueryModel& model) {
  return q.timing == "measured" && !q.reprofile &&
         std::filesystem::exists(
             profile_cache_path(q.timing, kServiceDevices, soc_key(q.soc), model.key));
}

int64_t length_bucket(Phase phase, int64_t n_tokens) {
  return phase == Phase::decode ? 1 : n_tokens;
}

std::string plan_cache_path(const PlanQuery& q, const QueryModel& model) {
  return duet_cache_dir() + "/plans/" +
         file_safe(model.key + "-" + soc_key(q.soc) + "-" + q.timing + "-" +
                   std::string(phase_name(q.phase)) + "-" +
                   std::to_string(length_bucket(q.phase, q.n_tokens)) +
                   (q.npu_mode == "auto" ? "" : "-" + q.npu_mode)) +
         ".json";
}

Plan modeled_plan_for(const std::string& model_path, int64_t n_tokens) {
  PlanQuery q;
  q.model_path = model_path;
  q.phase = n_tokens <= 1 ? Phase::decode : Phase::prefill;
  q.n_tokens = n_tokens;
  q.use_cache = false;
  q.baselines = false;
  return plan_from_json(plan_json_for(q));
}

nlohmann::json plan_json_for(const PlanQuery& q) {
  q.validate();
  const QueryModel model = query_model(q);
  const SocProfile soc = load_soc_profile(q.soc);
  SolverOptions options = solver_options_for(soc);
  if (q.npu_mode == "padding") options.modes = {NpuGraphMode::padding};
  if (q.npu_mode == "pipe") options.modes = {NpuGraphMode::pipe};
  bool profile_cached = false;
  const Profile profile = profile_for(q, model, &profile_cached);
  if (q.timing == "measured") {
    // This machine's devices, not the SoC's: no SoC bandwidth floor, their measured contention.
    options.shared_gbps = 0;
    options.contention = profile.contention;
    // A cross-device wait between the services costs what handing them work costs here, not
    // the SoC's fast sync.
    options.sync_us = std::max(options.sync_us, profile.handoff_us);
  }
  const std::string fingerprint =
      options_fingerprint(options) + "|profile=" + profile.fingerprint();
  const std::string path = plan_cache_path(q, model);

  const nlohmann::json cached = q.use_cache ? read_json_file(path) : nlohmann::json(nullptr);
  uint32_t version = 1;
  if (cached.is_object() && cached.contains("version") && cached.contains("fingerprint")) {
    if (cached["fingerprint"] == fingerprint) {
      nlohmann::json j = cached;
      j["cached"] = true;
      return j;
    }
    version = cached["version"].get<uint32_t>() + 1;
  }

  const ProfiledLatency latency(profile);
  const int64_t n = length_bucket(q.phase, q.n_tokens);
  const PlanResult plan = solve_plan(model.weights, model.n_layer, q.phase, n, latency, options);
  nlohmann::json j = plan_to_json(plan);
  j["version"] = version;
  j["fingerprint"] = fingerprint;
  j["key"] = std::filesystem::path(path).stem().string();
  j["shape"] = model.key;
  j["soc"] = q.soc;
  j["timing"] = q.timing;
  j["profile"] = {{"device", profile.device},           {"contention", profile.contention},
                  {"handoff_us", profile.handoff_us},   {"entries", profile.entries.size()},
                  {"profiling_s", profile.profiling_s}, {"cached", profile_cached}};
  if (q.baselines) {
    nlohmann::json b = nlohmann::json::object();
    std::string best_single;
    double best_single_us = 0;
    for (const std::string& name : baseline_names()) {
      const PlanResult r =
          baseline_plan(name, model.weights, model.n_layer, q.phase, n, latency, options);
      b[name] = r.total_us;
      const bool single = name == "gpu-only" || name == "npu-only" || name == "npu-pipe";
      if (single && (best_single.empty() || r.total_us < best_single_us)) {
        best_single = name;
        best_single_us = r.total_us;
      }
    }
    j["baselines"] = b;
    j["best_single_device"] = {{"name", best_single}, {"total_us", best_single_us}};
  }
  if (q.use_cache) write_json_file(path, j);
  j["cached"] = false;
  return j;
}

std::string format_plan_table(const std::vector<nlohmann::json>& plans) {
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "%-8s %-8s %-7s %-14s %-15s %10s %10s  %-10s %-28s %10s\n",
                "phase", "tokens", "weight", "weight shape", "activation", "T_gpu us", "T_npu us",
                "strategy", "ratio (GPU:NPU)", "chosen us");
  os << line;
  for (const nlohmann::json& p : plans) {
    for (const nlohmann::json& r : p.at("rows")) {
      std::snprintf(
          line, sizeof line, "%-8s %-8lld %-7s [%-12s] [%-13s] %10.0f %10.0f  %-10s %-28s %10.0f\n",
          p.at("phase").get<std::string>().c_str(),
          static_cast<long long>(p.at("n_tokens").get<int64_t>()),
          r.at("weight").get<std::string>().c_str(), shape_text(r.at("weight_shape")).c_str(),
          shape_text(r.at("activation_shape")).c_str(), r.at("t_gpu_us").get<double>(),
          r.at("t_npu_us").get<double>(), r.at("strategy").get<std::string>().c_str(),
          r.at("ratio").get<std::string>().c_str(), r.at("chosen_us").get<double>());
      os << line;
    }
    std::snprintf(line, sizeof line, "  -> plan v%u (%s, npu graphs: %s): %.2f ms per step",
                  p.value("version", 0u), p.value("cached", false) ? "cached" : "solved",
                  p.at("npu_mode").get<std::string>().c_str(),
                  p.at("total_us").get<double>() / 1000);
    os << line;
    if (p.contains("baselines")) {
      os << "; baselines:";
      for (const auto& [name, us] : p.at("baselines").items()) {
        std::snprintf(line, sizeof line, " %s %.2f", name.c_str(), us.get<double>() / 1000);
        os << line;
      }
      os << " ms";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace duet
