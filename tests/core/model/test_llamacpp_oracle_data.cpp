// The committed llama.cpp oracle data (tests/data/llamacpp/, tests/data/vocab/; how it was made:
// the READMEs there and tools/llamacpp-oracle/) is whole and still describes the files it names:
// every file parses, each answer names the sha256 of the vocab/model file it was computed on, and
// that file is still the same bytes. The comparisons of duet against this data live with the
// code they check (tokenizer, chat templates, forward pass).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/model/gguf.h"
#include "llamacpp_data.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testdata::data_dir;
using testdata::sha256_of;

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

TEST(LlamacppOracleData, LogitsAndGreedyAnswersOnTinyFortuneNameTheirFiles) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(data_dir("llamacpp"))) {
    const auto name = entry.path().filename().string();
    if (!name.ends_with("-fortune-f16.json") && !name.ends_with("-fortune-q8_0.json") &&
        !name.ends_with("-fortune-q4_0.json"))
      continue;
    if (!name.starts_with("logits-") && !name.starts_with("greedy-")) continue;
    ++files;
    const auto j = testdata::load_json(entry.path().string());
    expect_header_matches_file(j, name);
    const auto n_vocab = j.at("n_vocab").get<int64_t>();
    if (name.starts_with("greedy-")) {
      expect_ids_in_vocab(j.at("generated"), n_vocab, name);
      EXPECT_EQ(j.at("generated").size(), j.at("n").get<size_t>());
      continue;
    }
    expect_ids_in_vocab(j.at("ids"), n_vocab, name);
    ASSERT_EQ(j.at("positions").size(), j.at("ids").size());
    for (const auto& p : j.at("positions")) {
      expect_ids_in_vocab(p.at("top_ids"), n_vocab, name);
      const auto logits = p.at("top_logits").get<std::vector<double>>();
      EXPECT_TRUE(std::is_sorted(logits.rbegin(), logits.rend())) << "top-k not highest first";
      EXPECT_GE(p.at("logsumexp").get<double>(), logits.front());
      EXPECT_NEAR(p.at("margin").get<double>(), logits[0] - logits[1], 1e-9);
    }
  }
  EXPECT_EQ(files, 4);
}

// CI cannot rerun llama.cpp, so the mkmodel files its answers were computed on must still be
// what mkmodel writes: same arguments, same bytes.
TEST(LlamacppOracleData, MkmodelWritesTheModelsLlamacppWasRunOnByteForByte) {
  const auto dir =
      fs::path(::testing::TempDir()) / ("duet-llamacpp-models-sha-" + std::to_string(::getpid()));
  const auto models = testdata::regenerate_mkmodel_files(dir);
  std::set<std::string> archs, types;
  for (const auto& m : models.at("models")) {
    const auto name = m.at("name").get<std::string>();
    SCOPED_TRACE(name);
    archs.insert(m.at("arch").get<std::string>());
    types.insert(m.at("type").get<std::string>());
    EXPECT_EQ(sha256_of((dir / m.at("file").get<std::string>()).string()),
              m.at("sha256").get<std::string>())
        << "mkmodel no longer writes the file llama.cpp's answers were computed on: rerun "
           "tools/llamacpp-oracle/make_models.py";
    const auto logits = testdata::load_json(data_dir("llamacpp") + "logits-" + name + ".json");
    EXPECT_EQ(logits.at("model_sha256"), m.at("sha256"));
    EXPECT_EQ(logits.at("ids"), m.at("ids"));
    if (m.at("type") == "f16") {
      const auto greedy = testdata::load_json(data_dir("llamacpp") + "greedy-" + name + ".json");
      EXPECT_EQ(greedy.at("model_sha256"), m.at("sha256"));
    }
  }
  fs::remove_all(dir);
  EXPECT_EQ(archs, (std::set<std::string>{"llama", "qwen2", "internlm2", "gemma"}));
  EXPECT_EQ(types, (std::set<std::string>{"f16", "q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"}));
}

TEST(LlamacppOracleData, NoiseMeasurementCoversEveryFortuneVariant) {
  const auto j = testdata::load_json(data_dir("llamacpp") + "noise-tiny-fortune.json");
  std::set<std::string> variants;
  for (const auto& r : j.at("results")) {
    variants.insert(r.at("variant").get<std::string>());
    EXPECT_GT(r.at("positions").get<int>(), 300);
    EXPECT_GE(r.at("max_abs_diff").get<double>(), 0.0);
    EXPECT_LT(r.at("max_abs_diff").get<double>(), 1.0);  // the tolerances derived from it
    EXPECT_EQ(r.at("vs_duet").at("positions"), r.at("positions"));
  }
  EXPECT_EQ(variants, (std::set<std::string>{"f16", "q8_0", "q4_0"}));
}

}  // namespace
}  // namespace duet
