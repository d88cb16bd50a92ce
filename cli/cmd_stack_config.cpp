// What `duet stack up` settles before it starts anything (cli/stack_settings.h): the models it
// serves, the KV pools its settings make; and `duet stack config --stack ID [--json]` / `--keys`:
// the stack's effective settings with their sources, and the registry they come from.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/stack_settings.h"
#include "core/base/error.h"
#include "core/base/settings.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_config.h"
#include "core/model/kv_budget.h"
#include "core/model/model.h"

namespace duet::cli {
namespace {

// The frontend's running requests (FrontendOptions::max_running): what the KV pool is capped by.
constexpr int kStackMaxRunning = 16;

}  // namespace

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

// Several --model flags, or one with a name, become DUET_MODELS (a flag overrides the config
// file's `models`); one plain path stays the services' --model alone, as before.
std::string models_flag(const std::vector<std::string>& specs) {
  if (specs.size() == 1 && specs[0].find('=') == std::string::npos) return "";
  return joined(specs);
}

// The models `up` serves, with absolute paths that exist (the supervisor runs from elsewhere);
// DUET_MODELS is rewritten with them for the services when there is more than a plain --model.
std::vector<ServedModel> resolve_models(const std::vector<std::string>& specs) {
  std::vector<ServedModel> models;
  const auto listed = setting_override("DUET_MODELS");
  if (specs.size() == 1 && specs[0].find('=') == std::string::npos)
    models = {ServedModel{"", specs[0]}};
  else if (listed && !listed->empty())
    models = parse_models_setting(*listed);
  else
    models = {ServedModel{"", kDefaultModel}};
  for (ServedModel& m : models) {
    const std::string given = m.path;
    m.path = absolute_path(given);
    // The default is relative to the repo root: found from elsewhere next to the build too.
    if (given == kDefaultModel && !std::filesystem::exists(m.path))
      m.path = absolute_path(executable_dir() + "/../../" + kDefaultModel);
    if (!std::filesystem::exists(m.path) || access(m.path.c_str(), R_OK) != 0)
      throw Error(Errc::not_found, "model '" + given + "' does not exist or is not readable");
  }
  if (!models.front().name.empty())
    setenv("DUET_MODELS", models_setting(models).c_str(), 1);
  else
    unsetenv("DUET_MODELS");  // one model by its file: the services' --model, as before
  return models;
}

// Plans the KV pool the frontend will make (core/model/kv_budget.h) before anything starts, so that
// a setting the stack cannot serve (a budget too small for one sequence of the context, a pool
// larger than /dev/shm) is refused here with the reason instead of failing requests later. The
// budget goes to the frontend in bytes (DUET_KV_MEMORY): a restarted frontend makes the same
// pool. Returns the line `up` prints about it.
std::string plan_stack_kv(const std::string& stack, const std::vector<ServedModel>& models,
                          const std::string& plan_flag, const std::string& kv_memory_flag,
                          const std::string& kv_type_flag) {
  // The file's values are in the environment by now (export_stack_settings).
  const auto env_budget = setting_override("DUET_KV_MEMORY");
  const bool default_budget = kv_memory_flag.empty() && !env_budget;
  const uint64_t budget = !kv_memory_flag.empty() ? parse_memory_size(kv_memory_flag)
                          : env_budget            ? parse_memory_size(*env_budget)
                                                  : default_kv_memory_bytes();
  setenv("DUET_KV_MEMORY", std::to_string(budget).c_str(), 1);
  const std::string plan = !plan_flag.empty() ? plan_flag : setting_text("DUET_PLAN");
  if (plan == "reference") return "";
  const int max_ctx = static_cast<int>(setting_int("DUET_MAX_CTX"));
  const int sharers = setting_on("DUET_AGENT") ? 2 : 1;
  const std::string type_text = !kv_type_flag.empty() ? kv_type_flag : setting_text("DUET_KV_TYPE");
  const DType kv_type = parse_kv_type(type_text);
  setenv("DUET_KV_TYPE", type_text.c_str(), 1);
  std::vector<KvPoolPlan> pools;
  try {
    std::vector<KvPoolRequest> requests;
    for (const ServedModel& m : models) {
      KvPoolRequest request = kv_pool_request(LlamaModel::load(m.path)->hp(), max_ctx,
                                              kStackMaxRunning, sharers, budget);
      request.bytes_per_value = static_cast<uint32_t>(dtype_block_bytes(kv_type));
      request.values_per_block = static_cast<uint32_t>(dtype_block_elems(kv_type));
      requests.push_back(request);
    }
    pools = plan_kv_pools(std::move(requests), budget);
  } catch (const Error& e) {
    // The default budget is capped by /dev/shm's free space: name the real shortage.
    const std::string shm_note = default_budget && budget >= shm_free_bytes()
                                     ? " (the default budget is /dev/shm's free space, " +
                                           format_bytes(budget) + ": free or enlarge /dev/shm)"
                                     : "";
    throw Error(e.code(), "cannot start stack " + stack + ": " + e.what() + shm_note);
  }
  const uint64_t shm_free = shm_free_bytes();
  uint64_t pool_bytes = 0;
  std::string summary;
  for (size_t i = 0; i < pools.size(); ++i) {
    pool_bytes += pools[i].pool_bytes;
    summary +=
        (i ? "; " : "") +
        (pools.size() > 1 ? models[i].name + ": " + format_bytes(pools[i].budget_bytes) + " for "
                          : std::string()) +
        pools[i].summary();
  }
  if (pool_bytes > shm_free)
    throw Error(Errc::invalid_argument,
                "cannot start stack " + stack + ": its KV pool" + (pools.size() > 1 ? "s" : "") +
                    " (" + summary + ") need" + (pools.size() > 1 ? "" : "s") + " " +
                    format_bytes(pool_bytes) + " of /dev/shm, which has " + format_bytes(shm_free) +
                    " free: give a smaller --kv-memory");
  return "KV pool" + std::string(pools.size() > 1 ? "s" : "") + ": " + summary + " of " +
         std::string(dtype_name(kv_type)) + ", budget " + format_bytes(budget);
}

void print_stack_config(const std::string& run_dir, const std::string& stack, bool json) {
  const std::string path = stack_settings_path(run_dir);
  std::ifstream f(path);
  if (!f)
    throw Error(Errc::not_found, "stack '" + stack + "' has no settings record (" + path +
                                     "): is it up? (`duet stack up --stack " + stack + "`)");
  nlohmann::json s;
  try {
    s = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw Error(Errc::bad_format, "'" + path + "' is not JSON: " + e.what());
  }
  if (json) {
    std::printf("%s\n", s.dump(2).c_str());
    return;
  }
  std::printf("stack %s: effective settings (source: default, file, env or flag)\n", stack.c_str());
  if (s.contains("config_file") && !s["config_file"].get<std::string>().empty())
    std::printf("config file: %s\n", s["config_file"].get<std::string>().c_str());
  std::printf("%-30s %-24s %-8s %s\n", "KEY", "VALUE", "SOURCE", "VARIABLE");
  for (const auto& e : s["settings"]) {
    const std::string v = e.value("value", "");
    std::printf("%-30s %-24s %-8s %s\n", e.value("key", "?").c_str(), v.empty() ? "-" : v.c_str(),
                e.value("source", "?").c_str(), e.value("env", "?").c_str());
  }
}

void print_setting_keys() {
  std::printf("%s", settings_markdown().c_str());
}

}  // namespace duet::cli
