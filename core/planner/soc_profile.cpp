#include "core/planner/soc_profile.h"

#include <unistd.h>

#include <toml++/toml.h>  // Debian 12 ships toml++ 3.3, whose header is toml.h
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/base/error.h"
#include "core/base/settings.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

// Reads the keys of one table into fields, rejecting missing, non-numeric, non-positive
// (unless allowed) and unknown keys, so a typo in a profile never silently becomes a default.
class TableReader {
 public:
  TableReader(const toml::table& root, std::string section, std::string origin)
      : section_(std::move(section)), origin_(std::move(origin)) {
    const toml::node* node = root.get(section_);
    if (!node || !node->is_table())
      throw Error(Errc::bad_format, origin_ + ": missing table [" + section_ + "]");
    table_ = node->as_table();
  }

  double number(const std::string& key, bool allow_zero = false) {
    seen_.insert(key);
    const toml::node* node = table_->get(key);
    if (!node) throw Error(Errc::bad_format, where(key) + " is missing");
    double v;
    if (auto i = node->value_exact<int64_t>())
      v = static_cast<double>(*i);
    else if (auto d = node->value_exact<double>())
      v = *d;
    else
      throw Error(Errc::bad_format, where(key) + " must be a number");
    if (!std::isfinite(v) || v < 0 || (v == 0 && !allow_zero))
      throw Error(Errc::bad_format, where(key) + " must be " + (allow_zero ? ">= 0" : "> 0"));
    return v;
  }

  // A key older profiles (and the SoC files) may leave out: `fallback` when absent.
  double optional_number(const std::string& key, double fallback) {
    if (!table_->get(key)) {
      seen_.insert(key);
      return fallback;
    }
    return number(key, true);
  }

  int integer(const std::string& key) {
    const double v = number(key);
    if (v != std::floor(v) || v > 1 << 20)
      throw Error(Errc::bad_format, where(key) + " must be a whole number");
    return static_cast<int>(v);
  }

  // Every key of the table must have been read, except `allowed_subtables`.
  void reject_unknown(const std::set<std::string>& allowed_subtables = {}) const {
    for (const auto& [key, node] : *table_) {
      const std::string k(key.str());
      if (!seen_.count(k) && !allowed_subtables.count(k))
        throw Error(Errc::bad_format, where(k) + " is not a known key");
    }
  }

  const toml::table& table() const { return *table_; }

 private:
  std::string where(const std::string& key) const {
    return origin_ + ": [" + section_ + "] " + key;
  }
  const toml::table* table_ = nullptr;
  std::string section_, origin_;
  std::set<std::string> seen_;
};

std::string self_dir() {
  std::vector<char> buf(4096);
  const ssize_t n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return {};
  return fs::path(std::string(buf.data(), static_cast<size_t>(n))).parent_path().string();
}

}  // namespace

double SocProfile::Gpu::param(std::string_view key) const {
  auto it = params.find(key);
  if (it == params.end())
    throw Error(Errc::not_found, "SoC profile has no [gpu.params] " + std::string(key));
  return it->second;
}

double SocProfile::Gpu::param_or(std::string_view key, double fallback) const {
  auto it = params.find(key);
  return it == params.end() ? fallback : it->second;
}

SocProfile parse_soc_profile(std::string_view toml_text, std::string_view origin_view) {
  const std::string origin(origin_view);
  toml::table root;
  try {
    root = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream msg;
    msg << origin << ": TOML error at line " << e.source().begin.line << ": " << e.description();
    throw Error(Errc::bad_format, msg.str());
  }

  SocProfile p;
  const auto* name = root.get("name");
  if (!name || !name->is_string())
    throw Error(Errc::bad_format, origin + ": missing string key 'name'");
  p.name = name->value<std::string>().value();
  p.path = origin;
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (k != "name" && k != "npu" && k != "gpu" && k != "memory")
      throw Error(Errc::bad_format, origin + ": top-level key '" + k + "' is not known");
  }

  TableReader npu(root, "npu", origin);
  p.npu.cores = npu.integer("cores");
  p.npu.array_rows = npu.integer("array_rows");
  p.npu.array_cols = npu.integer("array_cols");
  p.npu.clock_ghz = npu.number("clock_ghz");
  p.npu.sram_bytes = npu.number("sram_bytes");
  p.npu.dma_gbps = npu.number("dma_gbps");
  p.npu.launch_us = npu.number("launch_us", true);
  p.npu.compile_us_per_mb = npu.number("compile_us_per_mb", true);
  p.npu.compile_base_us = npu.number("compile_base_us", true);
  p.npu.activation_io_us_per_mb = npu.number("activation_io_us_per_mb", true);
  p.npu.stationary_load_cycles = npu.number("stationary_load_cycles", true);
  p.npu.stationary_fetch_cycles = npu.number("stationary_fetch_cycles", true);
  p.npu.fill_cycles = npu.number("fill_cycles", true);
  p.npu.op_gap_us = npu.optional_number("op_gap_us", 0);
  p.npu.op_gap_us_per_token = npu.optional_number("op_gap_us_per_token", 0);
  p.npu.cpu_gflops = npu.optional_number("cpu_gflops", 0);
  p.npu.cpu_weight_gbps = npu.optional_number("cpu_weight_gbps", 0);
  p.npu.cpu_call_us = npu.optional_number("cpu_call_us", 0);
  p.npu.cpu_dequant_gbps = npu.optional_number("cpu_dequant_gbps", 0);
  p.npu.cpu_dequant_min_tokens = npu.optional_number("cpu_dequant_min_tokens", 0);
  if (p.npu.cpu_gflops > 0 && !(p.npu.cpu_weight_gbps > 0))
    throw Error(Errc::bad_format, origin + ": [npu] cpu_gflops needs cpu_weight_gbps > 0");
  npu.reject_unknown();

  TableReader gpu(root, "gpu", origin);
  p.gpu.peak_gflops = gpu.number("peak_gflops");
  p.gpu.achievable_gflops = gpu.number("achievable_gflops");
  p.gpu.bandwidth_gbps = gpu.number("bandwidth_gbps");
  p.gpu.sync_us = gpu.number("sync_us", true);
  p.gpu.launch_us = gpu.number("launch_us", true);
  if (const toml::node* params = gpu.table().get("params")) {
    if (!params->is_table())
      throw Error(Errc::bad_format, origin + ": [gpu] params must be a table [gpu.params]");
    for (const auto& [key, node] : *params->as_table()) {
      const std::string k(key.str());
      auto v = node.value<double>();
      if (!v || !std::isfinite(*v))
        throw Error(Errc::bad_format, origin + ": [gpu.params] " + k + " must be a number");
      p.gpu.params.emplace(k, *v);
    }
  }
  gpu.reject_unknown({"params"});

  TableReader mem(root, "memory", origin);
  p.mem.peak_gbps = mem.number("peak_gbps");
  p.mem.single_gbps = mem.number("single_gbps");
  p.mem.dual_gbps = mem.number("dual_gbps");
  p.mem.shared_cores = mem.optional_number("shared_cores", 0);
  mem.reject_unknown();
  if (!(p.mem.shared_cores >= 0 && p.mem.shared_cores <= 1))
    throw Error(Errc::bad_format, origin + ": [memory] shared_cores must be in [0, 1]");
  if (p.mem.single_gbps > p.mem.peak_gbps || p.mem.dual_gbps > p.mem.peak_gbps)
    throw Error(Errc::bad_format,
                origin + ": [memory] single_gbps and dual_gbps cannot exceed peak_gbps");
  return p;
}

SocProfile load_soc_profile(std::string_view name_or_path) {
  const std::string arg(name_or_path);
  if (arg.empty()) throw Error(Errc::invalid_argument, "SoC profile name is empty");
  std::vector<fs::path> candidates;
  const bool is_path = arg.find('/') != std::string::npos ||
                       (arg.size() > 5 && arg.substr(arg.size() - 5) == ".toml");
  if (is_path) {
    candidates.emplace_back(arg);
  } else {
    const std::string file = arg + ".toml";
    if (const auto env = setting_override("DUET_SOC_DIR"))
      candidates.push_back(fs::path(*env) / file);
    candidates.push_back(fs::path("deploy/soc") / file);
    if (const std::string dir = self_dir(); !dir.empty()) {
      candidates.push_back(fs::path(dir) / "../../deploy/soc" / file);
      candidates.push_back(fs::path(dir) / "../deploy/soc" / file);
    }
  }
  for (const auto& path : candidates) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) continue;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(Errc::io, "cannot read SoC profile " + path.string());
    std::ostringstream text;
    text << in.rdbuf();
    return parse_soc_profile(text.str(), path.lexically_normal().string());
  }
  std::string tried;
  for (const auto& path : candidates) tried += (tried.empty() ? "" : ", ") + path.string();
  throw Error(Errc::not_found, "SoC profile '" + arg + "' not found (tried " + tried + ")");
}

}  // namespace duet
