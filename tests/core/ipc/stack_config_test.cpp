// A stack's effective settings (core/ipc/stack_config.h): the config file's values over the
// defaults, DUET_* variables over the file, flags over both; an unknown key or a bad value in the
// file is refused naming the key; docs/CONFIG.md's table is the registry's.
#include "core/ipc/stack_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/base/error.h"

namespace duet {
namespace {

class StackConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("duet-stack-config-" + std::to_string(getpid()) + ".toml");
    // The test's own environment must not decide what it reads.
    for (const Setting& s : all_settings())
      if (!s.key.empty()) unsetenv(std::string(s.env).c_str());
  }
  void TearDown() override {
    std::filesystem::remove(path_);
    unsetenv("DUET_TRACE_STEPS");
  }
  std::string write(const std::string& toml) {
    std::ofstream(path_) << toml;
    return path_.string();
  }
  static const EffectiveSetting& find(const std::vector<EffectiveSetting>& all,
                                      const std::string& key) {
    for (const auto& e : all)
      if (e.setting->key == key) return e;
    throw std::runtime_error("no key " + key);
  }
  std::string refusal(const std::string& toml) {
    try {
      resolve_stack_settings(write(toml), {});
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      return e.what();
    }
    ADD_FAILURE() << "accepted:\n" << toml;
    return "";
  }
  std::filesystem::path path_;
};

TEST_F(StackConfig, NoFileIsEveryDefault) {
  for (const auto& e : resolve_stack_settings("", {})) {
    if (e.setting->key.empty()) continue;
    EXPECT_EQ(e.source, "default") << e.setting->key;
    EXPECT_EQ(e.value, e.setting->def) << e.setting->key;
  }
}

TEST_F(StackConfig, TheFileOverridesDefaultsTheEnvironmentTheFileAndFlagsEverything) {
  const std::string file = write(
      "plan = \"gpu-only\"\n"
      "[kv]\nmemory = \"64M\"\nprefix_sharing = false\n"
      "[frontend]\nmax_queue = 7\ntrace_steps = 10\n"
      "[agent]\nrider_slack = 0.25\n");
  setenv("DUET_TRACE_STEPS", "20", 1);
  const auto all = resolve_stack_settings(file, {{"DUET_KV_MEMORY", "96M"}, {"DUET_PLAN", ""}});
  EXPECT_EQ(find(all, "plan").value, "gpu-only");
  EXPECT_EQ(find(all, "plan").source, "file");  // an empty flag is no flag
  EXPECT_EQ(find(all, "kv.memory").value, "96M");
  EXPECT_EQ(find(all, "kv.memory").source, "flag");
  EXPECT_EQ(find(all, "kv.prefix_sharing").value, "off");
  EXPECT_EQ(find(all, "frontend.max_queue").value, "7");
  EXPECT_EQ(find(all, "frontend.trace_steps").value, "20");
  EXPECT_EQ(find(all, "frontend.trace_steps").source, "env");
  EXPECT_EQ(std::stod(find(all, "agent.rider_slack").value), 0.25);
  EXPECT_EQ(find(all, "kv.type").source, "default");

  // `up` hands the file's and flags' values to the supervisor through its environment.
  export_stack_settings(all);
  EXPECT_STREQ(std::getenv("DUET_MAX_QUEUE"), "7");
  EXPECT_STREQ(std::getenv("DUET_KV_MEMORY"), "96M");
  const nlohmann::json j = stack_settings_json(all);
  bool seen = false;
  for (const auto& e : j["settings"])
    if (e["key"] == "frontend.max_queue") {
      seen = true;
      EXPECT_EQ(e["source"], "file");
      EXPECT_EQ(e["env"], "DUET_MAX_QUEUE");
    }
  EXPECT_TRUE(seen) << j.dump();
  for (const Setting& s : all_settings()) unsetenv(std::string(s.env).c_str());
}

TEST_F(StackConfig, AnUnknownKeyIsRefusedByName) {
  const std::string msg = refusal("[kv]\nmemroy = \"1G\"\n");
  EXPECT_NE(msg.find("unknown key 'kv.memroy'"), std::string::npos) << msg;
}

TEST_F(StackConfig, ABadValueIsRefusedNamingItsKey) {
  std::string msg = refusal("[agent]\noverlap = \"sometimes\"\n");
  EXPECT_NE(msg.find("agent.overlap"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sometimes"), std::string::npos) << msg;
  msg = refusal("frontend.max_queue = 2.5\n");
  EXPECT_NE(msg.find("frontend.max_queue"), std::string::npos) << msg;
  msg = refusal("kv.max_ctx = \"long\"\n");
  EXPECT_NE(msg.find("kv.max_ctx"), std::string::npos) << msg;
  msg = refusal("gpu.device = 3\n");  // text must be quoted
  EXPECT_NE(msg.find("gpu.device"), std::string::npos) << msg;
  msg = refusal("plan = [\"gpu-only\"]\n");
  EXPECT_NE(msg.find("plan"), std::string::npos) << msg;
  msg = refusal("plan = \n");
  EXPECT_NE(msg.find("not valid TOML"), std::string::npos) << msg;
}

TEST_F(StackConfig, ABadVariableIsRefusedToo) {
  setenv("DUET_KV_TYPE", "f8", 1);
  try {
    resolve_stack_settings("", {});
    ADD_FAILURE() << "DUET_KV_TYPE=f8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DUET_KV_TYPE='f8'"), std::string::npos) << e.what();
  }
  unsetenv("DUET_KV_TYPE");
}

// docs/CONFIG.md holds the table `duet stack config --keys` prints: it cannot drift from the
// registry (regenerate it with that command when a setting changes).
TEST_F(StackConfig, TheDocsTableIsTheRegistrys) {
  std::ifstream f(DUET_SOURCE_DIR "/docs/CONFIG.md");
  ASSERT_TRUE(f) << "docs/CONFIG.md is missing";
  std::stringstream doc;
  doc << f.rdbuf();
  EXPECT_NE(doc.str().find(settings_markdown()), std::string::npos)
      << "docs/CONFIG.md's table differs from `duet stack config --keys`:\n"
      << settings_markdown();
}

}  // namespace
}  // namespace duet
