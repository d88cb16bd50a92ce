// The committed llama.cpp oracle data (tests/data/llamacpp/, tests/data/vocab/; how it was made:
// the READMEs there and tools/llamacpp-oracle/) is whole and still describes the files it names:
// every file parses, each answer names the sha256 of the vocab/model file it was computed on, and
// that file is still the same bytes. The comparisons of duet against this data live with the
// code they check (tokenizer, chat templates, forward pass).
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/gguf.h"
#include "reference_data.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string data_dir(const std::string& sub) {
  return std::string(DUET_SOURCE_DIR) + "/tests/data/" + sub + "/";
}

// sha256sum (coreutils) rather than a hash library: the data's READMEs quote the same command.
std::string sha256_of(const std::string& path) {
  if (!fs::exists(path)) throw std::runtime_error("no file " + path);
  const std::string cmd = "sha256sum -- '" + path + "'";
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::array<char, 65> hex{};
  if (std::fread(hex.data(), 1, 64, pipe.get()) != 64)
    throw std::runtime_error(cmd + " printed no hash");
  return std::string(hex.data(), 64);
}

// The file an oracle answer was computed on: vocab files first, then the tiny-fortune models.
std::string model_path(const std::string& name) {
  for (const auto& dir : {data_dir("vocab"), data_dir("tiny-fortune")})
    if (fs::exists(dir + name)) return dir + name;
  throw std::runtime_error("oracle data names " + name + ", which is in no data directory");
}

// Header fields every oracle answer carries, checked against the file it names.
void expect_header_matches_file(const json& j, const std::string& what) {
  SCOPED_TRACE(what);
  const std::string path = model_path(j.at("model").get<std::string>());
  EXPECT_EQ(j.at("model_sha256").get<std::string>(), sha256_of(path))
      << path << " changed since llama.cpp's answer was computed: rerun tools/llamacpp-oracle";
  const auto file = GgufFile::open(path);
  const auto n_vocab = static_cast<int64_t>(file->get_string_array("tokenizer.ggml.tokens").size());
  EXPECT_EQ(j.at("n_vocab").get<int64_t>(), n_vocab);
  for (const char* key : {"bos", "eos", "eot"}) {
    if (j.at(key).is_null()) continue;
    EXPECT_GE(j.at(key).get<int64_t>(), 0) << key;
    EXPECT_LT(j.at(key).get<int64_t>(), n_vocab) << key;
  }
  EXPECT_TRUE(j.at("add_bos").is_boolean());
  EXPECT_TRUE(j.at("add_eos").is_boolean());
}

void expect_ids_in_vocab(const json& ids, int64_t n_vocab, const std::string& what) {
  ASSERT_TRUE(ids.is_array()) << what;
  for (const auto& id : ids) {
    ASSERT_TRUE(id.is_number_integer()) << what;
    ASSERT_GE(id.get<int64_t>(), 0) << what;
    ASSERT_LT(id.get<int64_t>(), n_vocab) << what;
  }
}

TEST(LlamacppOracleData, VocabFilesAreVocabOnlyGgufsWithConsistentSpecialIds) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(data_dir("vocab"))) {
    if (entry.path().extension() != ".gguf") continue;
    ++files;
    SCOPED_TRACE(entry.path().string());
    const auto file = GgufFile::open(entry.path().string());
    EXPECT_TRUE(file->tensors().empty()) << "a vocab-only GGUF has no tensors";
    const auto model = file->get_string("tokenizer.ggml.model");
    EXPECT_TRUE(model == "gpt2" || model == "llama") << model;
    const auto n = file->get_string_array("tokenizer.ggml.tokens").size();
    EXPECT_EQ(file->get_int_array("tokenizer.ggml.token_type").size(), n);
    if (model == "gpt2") {
      EXPECT_FALSE(file->get_string("tokenizer.ggml.pre").empty());
      EXPECT_FALSE(file->get_string_array("tokenizer.ggml.merges").empty());
    } else {
      EXPECT_EQ(file->get_float_array("tokenizer.ggml.scores").size(), n);
    }
    for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                            "tokenizer.ggml.eot_token_id", "tokenizer.ggml.padding_token_id"})
      if (file->has(key)) {
        EXPECT_LT(file->get_uint(key), n) << key;
      }
    EXPECT_FALSE(file->get_string("tokenizer.chat_template").empty());
  }
  EXPECT_GE(files, 7);
}

TEST(LlamacppOracleData, TokenizeAnswersCoverTheCorpusInOrder) {
  const auto corpus = testdata::load_json(data_dir("llamacpp") + "corpus.json");
  const auto& strings = corpus.at("strings");
  ASSERT_GE(strings.size(), 500u);
  const std::string corpus_sha = sha256_of(data_dir("llamacpp") + "corpus.json");
  for (const char* vocab : {"llama3", "qwen2", "fortune"}) {
    SCOPED_TRACE(vocab);
    const auto j = testdata::load_json(data_dir("llamacpp") + "tokenize-" + vocab + ".json");
    expect_header_matches_file(j, vocab);
    EXPECT_EQ(j.at("corpus_sha256").get<std::string>(), corpus_sha);
    const auto n_vocab = j.at("n_vocab").get<int64_t>();
    const auto& answers = j.at("strings");
    ASSERT_EQ(answers.size(), strings.size());
    size_t errors = 0;
    for (size_t i = 0; i < answers.size(); ++i) {
      const auto& a = answers[i];
      const char* key = strings[i].contains("hex") ? "hex" : "text";
      ASSERT_EQ(a.at(key), strings[i].at(key)) << "entry " << i;
      if (a.contains("error")) {  // llama.cpp died on these bytes: allowed only for byte strings
        EXPECT_STREQ(key, "hex") << "entry " << i;
        ++errors;
        continue;
      }
      expect_ids_in_vocab(a.at("plain"), n_vocab, "plain " + std::to_string(i));
      expect_ids_in_vocab(a.at("special"), n_vocab, "special " + std::to_string(i));
      if (std::string(key) == "text" && !a.at("text").get<std::string>().empty()) {
        EXPECT_FALSE(a.at("plain").empty()) << "entry " << i;
      }
    }
    EXPECT_LT(errors, answers.size() / 20);
  }
}

TEST(LlamacppOracleData, ChatAnswersFormatTheCommittedConversation) {
  const auto messages = testdata::load_json(data_dir("llamacpp") + "chat-messages.json");
  std::set<std::string> families;
  for (const auto& entry : fs::directory_iterator(data_dir("llamacpp"))) {
    const auto name = entry.path().filename().string();
    if (!name.starts_with("chat-") || name == "chat-messages.json") continue;
    SCOPED_TRACE(name);
    const auto j = testdata::load_json(entry.path().string());
    expect_header_matches_file(j, name);
    families.insert(j.at("family").get<std::string>());
    EXPECT_EQ(j.at("messages"), messages);
    const auto file = GgufFile::open(model_path(j.at("model").get<std::string>()));
    EXPECT_EQ(j.at("chat_template").get<std::string>(),
              file->get_string("tokenizer.chat_template"));
    EXPECT_FALSE(j.at("text").get<std::string>().empty());
    expect_ids_in_vocab(j.at("ids"), j.at("n_vocab").get<int64_t>(), "ids");
    EXPECT_GT(j.at("ids").size(), 20u);
  }
  for (const char* f : {"llama3", "chatml", "llama2", "mistral", "gemma", "zephyr"})
    EXPECT_TRUE(families.contains(f)) << "no chat answer for " << f;
}

TEST(LlamacppOracleData, NoiseMeasurementCoversEveryFortuneVariant) {
  const auto j = testdata::load_json(data_dir("llamacpp") + "noise-tiny-fortune.json");
  std::set<std::string> variants;
  for (const auto& r : j.at("results")) {
    variants.insert(r.at("variant").get<std::string>());
    EXPECT_GT(r.at("positions").get<int>(), 300);
    EXPECT_GE(r.at("max_abs_diff").get<double>(), 0.0);
    EXPECT_LT(r.at("max_abs_diff").get<double>(), 1.0);  // the tolerances derived from it
  }
  EXPECT_EQ(variants, (std::set<std::string>{"f16", "q8_0", "q4_0"}));
}

}  // namespace
}  // namespace duet
