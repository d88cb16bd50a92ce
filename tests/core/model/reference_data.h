#pragma once
// Paths and loaders for the tiny-fortune reference (tests/data/tiny-fortune/README.md).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace duet::testdata {

inline std::string fortune_dir() {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/tiny-fortune/";
}
inline std::string fortune_model(const std::string& variant) {
  return fortune_dir() + "fortune-" + variant + ".gguf";
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(in);
}

inline const nlohmann::json& hf_reference() {
  static const nlohmann::json j = load_json(fortune_dir() + "hf-reference.json");
  return j;
}

inline std::vector<float> load_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<float> v(static_cast<size_t>(in.tellg()) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

}  // namespace duet::testdata
