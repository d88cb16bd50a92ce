// `stack up` and `stack restart`'s warm-up (schemas/client.fbs Warmup; the frontend's side is
// services/frontend/frontend_warmup.cpp): each model's engines built and run once per token
// bucket before the verb returns, so the first request does not pay for it.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/stack_warmup.h"
#include "core/base/error.h"
#include "core/ipc/client.h"
#include "core/ipc/stack_config.h"

namespace duet::cli {

void warm_up(const std::string& stack, const std::string& run_dir, int timeout_s,
             const std::vector<WarmupTarget>& targets) {
  client::Client client(client::stack_endpoint(stack, run_dir));
  for (const WarmupTarget& t : targets) {
    client.set_model(t.model);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const nlohmann::json j = client.warmup(std::chrono::seconds(timeout_s));
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - t0)
                          .count();
      if (j.contains("skipped") || j.contains("interrupted")) {
        std::printf("  %s: warm-up %s (%s)\n", t.label.c_str(),
                    j.contains("skipped") ? "skipped" : "interrupted",
                    j.value("skipped", j.value("interrupted", "")).c_str());
        continue;
      }
      size_t steps = 0;
      for (const auto& e : j.value("engines", nlohmann::json::array()))
        steps += e.value("steps", nlohmann::json::array()).size();
      std::printf("  %s: warmed up in %lld ms (%zu steps)\n", t.label.c_str(),
                  static_cast<long long>(ms), steps);
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "duet: warning: %s: warm-up failed [%s]: %s (the first request builds the "
                   "engine; --no-warmup skips the warm-up)\n",
                   t.label.c_str(), std::string(errc_name(e.code())).c_str(), e.what());
    }
  }
}

bool recorded_warmup_on(const std::string& run_dir) {
  std::ifstream f(stack_settings_path(run_dir));
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (j.is_discarded()) return true;
  for (const auto& e : j.value("settings", nlohmann::json::array()))
    if (e.value("env", "") == "DUET_WARMUP") return e.value("value", "on") != "off";
  return true;
}

// Several models: the frontend's status has them by name under "models".
std::vector<WarmupTarget> served_models(const std::string& stack, const std::string& run_dir) {
  client::Client client(client::stack_endpoint(stack, run_dir));
  const nlohmann::json s = client.status();
  std::vector<WarmupTarget> out;
  if (s.contains("models") && s["models"].is_object()) {
    for (const auto& [name, _] : s["models"].items()) out.push_back({name, name});
  } else {
    out.push_back({"", s.value("model", std::string("the model"))});
  }
  return out;
}

}  // namespace duet::cli
