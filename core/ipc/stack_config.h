#pragma once
// A stack's effective settings (core/base/settings.h's registry): each from its default, the
// config file (`duet stack up --config stack.toml`), the environment of `duet stack up` or a
// flag of it, later ones overriding earlier ones. `up` exports the file's and the flags' values
// as DUET_* variables, so the supervisor starts the services with them (its environment is the
// services' one channel for settings) and records them in <run dir>/settings.json, which
// `duet stack config` prints.
//
// The file is TOML; a key's dots are tables, so these two say the same:
//   kv.memory = "2G"          [kv]
//                             memory = "2G"
// Strings, integers, floats and booleans (true/false for on|off switches) are accepted where the
// setting's type takes them; an unknown key or a bad value is Error(invalid_argument) naming it.
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/base/settings.h"

namespace duet {

struct EffectiveSetting {
  const Setting* setting = nullptr;
  std::string value;   // empty: no value (the reader's own fallback)
  std::string source;  // "default", "file", "env" or "flag"
};

// `flags`: DUET_* name -> value of the `stack up` flags given (empty values are not given).
std::vector<EffectiveSetting> resolve_stack_settings(
    const std::string& config_path, const std::map<std::string, std::string>& flags);

// Sets the DUET_* variable of every setting that came from the file or a flag in this process's
// environment (what the supervisor it starts passes on).
void export_stack_settings(const std::vector<EffectiveSetting>& settings);

nlohmann::json stack_settings_json(const std::vector<EffectiveSetting>& settings);
std::string stack_settings_path(const std::string& run_dir);  // <run dir>/settings.json

// The registry as a Markdown table (key, variable, type, default, doc): docs/CONFIG.md's.
std::string settings_markdown();

}  // namespace duet
