// Tokenizer throughput, one thread: the whole text through Tokenizer::encode (no special-token
// parsing, no BOS: what llama.cpp's model.tokenize(text) does on the node side), best of
// --repeat runs after one warm-up, printed as JSON.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/model/gguf.h"
#include "core/model/tokenizer.h"

int main(int argc, char** argv) {
  CLI::App app("Tokenizer throughput: MB/s of text through duet's encode, one thread");
  std::string model, text_path;
  int repeat = 5;
  app.add_option("--model", model, "GGUF (a vocab-only one is enough)")->required();
  app.add_option("--text", text_path, "UTF-8 text file")->required();
  app.add_option("--repeat", repeat, "timed runs (the best is reported)");
  CLI11_PARSE(app, argc, argv);

  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", text_path.c_str());
    return 1;
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  const auto file = duet::GgufFile::open(model);
  const auto load_start = std::chrono::steady_clock::now();
  const duet::Tokenizer tokenizer(duet::Vocab::from_gguf(*file));
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  // Warm-up, and a hash of the ids (FNV-1a over their values) that llamacpp_tokenize.mjs
  // computes the same way: equal hashes mean both gave the same ids for the whole text.
  const std::vector<int32_t> ids = tokenizer.encode(text, false);
  size_t n_tokens = ids.size();
  uint32_t hash = 2166136261u;
  for (int32_t id : ids) hash = (hash ^ static_cast<uint32_t>(id)) * 16777619u;
  double best = 1e30;
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    n_tokens = tokenizer.encode(text, false).size();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const nlohmann::json out = {{"impl", "duet"},
                              {"model", model},
                              {"bytes", text.size()},
                              {"tokens", n_tokens},
                              {"ids_fnv1a", hash},
                              {"best_s", best},
                              {"mb_per_s", static_cast<double>(text.size()) / 1e6 / best},
                              {"load_s", load_s},
                              {"repeat", repeat}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
