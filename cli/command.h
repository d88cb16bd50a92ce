#pragma once
// Each verb of `duet` lives in its own cmd_<verb>.cpp and registers itself here, so adding a
// verb never touches main.cpp.
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace duet::cli {

using CommandInstaller = std::function<void(CLI::App& app)>;

inline std::vector<CommandInstaller>& command_installers() {
  static std::vector<CommandInstaller> all;
  return all;
}

struct RegisterCommand {
  explicit RegisterCommand(CommandInstaller f) { command_installers().push_back(std::move(f)); }
};

}  // namespace duet::cli
