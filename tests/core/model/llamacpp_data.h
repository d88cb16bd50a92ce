#pragma once
// The committed llama.cpp answers (tests/data/llamacpp/, made by tools/llamacpp-oracle; formats
// in tests/data/llamacpp/README.md) and the model files they were computed on: the committed
// tiny-fortune GGUFs, and the mkmodel files of models.json, regenerated on demand.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "reference_data.h"
#include "tests/support/temp_dir.h"

namespace duet::testdata {

inline std::string data_dir(const std::string& sub) {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/" + sub + "/";
}
inline std::string llamacpp_dir() {
  return data_dir("llamacpp");
}

// sha256sum (coreutils) rather than a hash library: the data's READMEs quote the same command.
inline std::string sha256_of(const std::string& path) {
  if (!std::filesystem::exists(path)) throw std::runtime_error("no file " + path);
  const std::string cmd = "sha256sum -- '" + path + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::array<char, 65> hex{};
  if (std::fread(hex.data(), 1, 64, pipe.get()) != 64)
    throw std::runtime_error(cmd + " printed no hash");
  return std::string(hex.data(), 64);
}

inline void run_or_throw(const std::string& cmd) {
  if (std::system((cmd + " > /dev/null 2>&1").c_str()) != 0)
    throw std::runtime_error("failed: " + cmd);
}

// Writes every model of models.json into `dir` with today's `duet mkmodel` / `duet quantize` and
// the recorded arguments (run from the source tree: the vocab and source paths are relative to
// it). K-quant entries (`quantize_args`) quantise their `source`: an mkmodel file written first,
// or a committed file. Returns models.json.
inline nlohmann::json regenerate_mkmodel_files(const std::filesystem::path& dir) {
  const auto models = load_json(llamacpp_dir() + "models.json");
  std::filesystem::create_directories(dir);
  const std::string cd = "cd '" + std::string(DUET_SOURCE_DIR) + "' && '" +
                         std::string(DUET_BINARY_DIR) + "/bin/duet'";
  auto mkmodel = [&](const nlohmann::json& args, const std::string& file) {
    std::string cmd = cd + " mkmodel";
    for (const auto& a : args) cmd += " '" + a.get<std::string>() + "'";
    run_or_throw(cmd + " --out '" + (dir / file).string() + "'");
  };
  for (const auto& m : models.at("models")) {
    if (!m.contains("quantize_args")) {
      mkmodel(m.at("mkmodel_args"), m.at("file").get<std::string>());
      continue;
    }
    const auto& src = m.at("source");
    std::string src_path;
    if (src.contains("mkmodel_args")) {
      const auto file = src.at("file").get<std::string>();
      if (!std::filesystem::exists(dir / file)) mkmodel(src.at("mkmodel_args"), file);
      src_path = (dir / file).string();
    } else {
      src_path = std::string(DUET_SOURCE_DIR) + "/" + src.at("path").get<std::string>();
    }
    std::string cmd = cd + " quantize '" + src_path + "' '" +
                      (dir / m.at("file").get<std::string>()).string() + "'";
    for (const auto& a : m.at("quantize_args")) cmd += " '" + a.get<std::string>() + "'";
    run_or_throw(cmd);
  }
  return models;
}

// The file a llama.cpp answer names: a committed tiny-fortune GGUF, else one of models.json's
// mkmodel files, all regenerated on first use into a directory of this process (ctest runs each
// test as its own process, in parallel) that goes when the process ends. Throws if neither has it.
inline std::string answer_model_path(const std::string& name) {
  const std::string fortune = fortune_dir() + name;
  if (std::filesystem::exists(fortune)) return fortune;
  static const test_support::TempDir regenerated("duet-llamacpp-models");
  static const bool written = (regenerate_mkmodel_files(regenerated.path()), true);
  (void)written;
  const std::string path = regenerated / name;
  if (!std::filesystem::exists(path))
    throw std::runtime_error("no model file " + name + " for a llama.cpp answer");
  return path;
}

}  // namespace duet::testdata
