#include "core/ipc/stack_config.h"

#include <toml++/toml.h>  // Debian 12 ships toml++ 3.3, whose header is toml.h
#include <cstdlib>
#include <sstream>

#include "core/base/error.h"

namespace duet {
namespace {

// A TOML value as the setting's text; the error names the key.
std::string value_text(const Setting& s, const std::string& key, const toml::node& node) {
  const auto refuse = [&](const std::string& what) {
    return Error(Errc::invalid_argument,
                 "config key '" + key + "': " + what + " (" + s.type_name() + ")");
  };
  if (const auto* v = node.as_string()) return v->get();
  if (const auto* v = node.as_integer()) {
    if (s.type == SettingType::text) throw refuse("a number where text is expected: quote it");
    return std::to_string(v->get());
  }
  if (const auto* v = node.as_floating_point()) {
    if (s.type != SettingType::number) throw refuse("a real number is not a value of it");
    std::ostringstream out;
    out.precision(17);
    out << v->get();
    return out.str();
  }
  if (const auto* v = node.as_boolean()) {
    if (s.type == SettingType::choice && s.choices == "on|off") return v->get() ? "on" : "off";
    if (s.type == SettingType::choice && s.choices == "0|1") return v->get() ? "1" : "0";
    throw refuse("true/false is not a value of it");
  }
  throw refuse("a table or array is not a value of it");
}

// Every leaf of the file as "a.b.c" -> node.
void flatten(const toml::table& t, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, node] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) {
      // A table that is itself a setting's key would be a value; none is, so recurse.
      flatten(*sub, key, out);
    } else {
      out.emplace_back(key, &node);
    }
  }
}

std::string escape_pipes(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '|') out += "\\";
    out += c;
  }
  return out;
}

}  // namespace

std::vector<EffectiveSetting> resolve_stack_settings(
    const std::string& config_path, const std::map<std::string, std::string>& flags) {
  std::vector<EffectiveSetting> out;
  for (const Setting& s : all_settings()) out.push_back({&s, std::string(s.def), "default"});
  auto entry = [&](const Setting* s) -> EffectiveSetting& {
    for (auto& e : out)
      if (e.setting == s) return e;
    throw Error(Errc::internal, "setting missing from the resolved list");
  };

  if (!config_path.empty()) {
    toml::table root;
    try {
      root = toml::parse_file(config_path);
    } catch (const toml::parse_error& e) {
      std::ostringstream where;
      where << e.source().begin;
      throw Error(Errc::invalid_argument, "config file '" + config_path + "' is not valid TOML (" +
                                              std::string(e.description()) + " at " + where.str() +
                                              ")");
    }
    std::vector<std::pair<std::string, const toml::node*>> leaves;
    flatten(root, "", leaves);
    for (const auto& [key, node] : leaves) {
      const Setting* s = find_setting_key(key);
      if (!s)
        throw Error(Errc::invalid_argument, "config file '" + config_path + "': unknown key '" +
                                                key + "' (`duet stack config --keys` lists them)");
      const std::string v = value_text(*s, key, *node);
      try {
        check_setting(*s, v);
      } catch (const Error& e) {
        throw Error(Errc::invalid_argument, "config file '" + config_path + "': " + e.what());
      }
      entry(s) = {s, v, "file"};
    }
  }
  for (const Setting& s : all_settings()) {
    const char* v = std::getenv(std::string(s.env).c_str());
    if (!v || !*v) continue;
    check_setting(s, v);
    entry(&s) = {&s, v, "env"};
  }
  for (const auto& [env, v] : flags) {
    if (v.empty()) continue;
    const Setting* s = find_setting_env(env);
    if (!s) throw Error(Errc::internal, "flag for '" + env + "', which is not in the registry");
    check_setting(*s, v);
    entry(s) = {s, v, "flag"};
  }
  return out;
}

void export_stack_settings(const std::vector<EffectiveSetting>& settings) {
  for (const auto& e : settings)
    if ((e.source == "file" || e.source == "flag") && !e.value.empty())
      setenv(std::string(e.setting->env).c_str(), e.value.c_str(), 1);
}

nlohmann::json stack_settings_json(const std::vector<EffectiveSetting>& settings) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& e : settings) {
    // The environment-only ones say where a stack is, not how it runs: not a stack's setting.
    if (e.setting->key.empty()) continue;
    list.push_back({{"key", e.setting->key},
                    {"env", e.setting->env},
                    {"value", e.value},
                    {"default", e.setting->def},
                    {"source", e.source}});
  }
  return {{"settings", list}};
}

std::string stack_settings_path(const std::string& run_dir) {
  return run_dir + "/settings.json";
}

std::string settings_markdown() {
  std::string out = "| key | variable | type | default | what it does |\n|---|---|---|---|---|\n";
  for (const Setting& s : all_settings()) {
    out += "| " +
           (s.key.empty() ? std::string("(environment only)") : "`" + std::string(s.key) + "`") +
           " | `" + std::string(s.env) + "` | " + escape_pipes(s.type_name()) + " | " +
           (s.def.empty() ? std::string("-") : "`" + std::string(s.def) + "`") + " | " +
           escape_pipes(s.doc) + " |\n";
  }
  return out;
}

}  // namespace duet
