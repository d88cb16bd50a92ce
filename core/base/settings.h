#pragma once
// The registry of a stack's settings: one table (settings.cpp) of every DUET_* variable a
// process reads, with its config-file key, type, default, range and doc. `duet stack up
// --config stack.toml` reads the file through it, flags override the file, and the effective
// values reach the services as DUET_* variables in the environment the supervisor starts them
// with (the one channel they had before the file existed); a variable set in the environment of
// `duet stack up` overrides the file too (for tests and experiments). Every reader goes through
// setting_*() below, so a bad value fails the same way, naming the variable and its key.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace duet {

enum class SettingType {
  text,     // any string (paths, device names)
  integer,  // a whole number in [min, max]
  number,   // a real number in [min, max] (max may be inf)
  choice,   // one of `choices` (on/off switches are choices too)
  size,     // a memory size: bytes, or a number with K/M/G/T (as --kv-memory)
};

struct Setting {
  std::string_view env;      // DUET_MAX_QUEUE
  std::string_view key;      // frontend.max_queue (the TOML key); empty: environment only
  SettingType type;          //
  std::string_view def;      // the default as text; empty: none (the reader's own fallback)
  double min = 0, max = 0;   // integer, number
  std::string_view choices;  // choice: "a|b|c"
  std::string_view doc;      // what it does, for `duet stack config --keys` and docs/CONFIG.md

  std::string type_name() const;  // "integer [0, 1048576]", "on|off", ...
};

// Every setting, in the table's order.
std::span<const Setting> all_settings();
const Setting* find_setting_env(std::string_view env);
const Setting* find_setting_key(std::string_view key);

// Throws Error(invalid_argument) naming the key (or the variable when it has none) unless
// `value` is valid for `s`.
void check_setting(const Setting& s, std::string_view value);

// The value a process runs with: its DUET_* variable when set and not empty, else the default.
// Checked (the error names the variable); the variable must be in the table (a typo in a
// reader's name is Errc::internal, not a silent default).
std::string setting_text(std::string_view env);
int64_t setting_int(std::string_view env);
double setting_number(std::string_view env);
bool setting_on(std::string_view env);  // a choice of on|off: true for on
// The variable's value when set and not empty (checked), else nullopt: for settings whose
// default depends on something else (the proactive plan follows the stack's plan).
std::optional<std::string> setting_override(std::string_view env);

// "64 KiB"-style sizes as --kv-memory takes them: 2G, 512M, 1048576 (bytes).
uint64_t parse_setting_size(std::string_view text);

}  // namespace duet
