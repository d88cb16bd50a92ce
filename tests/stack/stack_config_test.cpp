// `duet stack up --config stack.toml` (issue 26): a stack started from a config file runs with
// its settings and reports them back with their sources (`duet stack config`); a bad key and a
// bad value are refused at `up`, naming them, before anything starts; no file is as before.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/ipc/run_dir.h"
#include "tests/support/stack_support.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

using test_support::CliResult;
using test_support::run_duet;

class StackConfigFile : public test_support::StackFixture {
 protected:
  StackConfigFile() : StackFixture("cfg26_", 16) {}
  std::string write(const std::string& toml) {
    std::ofstream(file_) << toml;
    return file_.string();
  }
  // `duet stack config --json` as key -> {value, source}.
  nlohmann::json effective() {
    CliResult r = run_duet("stack config --json --stack " + id_);
    EXPECT_EQ(r.rc, 0) << r.out;
    nlohmann::json by_key;
    const nlohmann::json out = nlohmann::json::parse(r.out);
    EXPECT_TRUE(out.contains("settings")) << r.out;
    for (const auto& e : out.value("settings", nlohmann::json::array())) by_key[e["key"]] = e;
    return by_key;
  }
  test_support::TempDir tmp_{"duet-stack-config"};
  const std::filesystem::path file_ = tmp_ / "stack.toml";
};

TEST_F(StackConfigFile, AStackFromAConfigFileRunsWithItsSettingsAndReportsTheirSources) {
  const std::string file = write(
      "plan = \"reference\"\n"
      "[kv]\ntype = \"f32\"\nmemory = \"64M\"\n"
      "[frontend]\nmax_queue = 7\n");
  CliResult up = run_duet("stack up --stack " + id_ + " --config " + file + " --kv-memory 96M",
                          "DUET_TRACE_STEPS=100");
  ASSERT_EQ(up.rc, 0) << up.out;
  const nlohmann::json s = effective();
  EXPECT_EQ(s["plan"]["value"], "reference");
  EXPECT_EQ(s["plan"]["source"], "file");
  EXPECT_EQ(s["kv.type"]["value"], "f32");
  EXPECT_EQ(s["kv.memory"]["value"], "96M");  // the flag over the file
  EXPECT_EQ(s["kv.memory"]["source"], "flag");
  EXPECT_EQ(s["frontend.max_queue"]["source"], "file");
  EXPECT_EQ(s["frontend.trace_steps"]["value"], "100");
  EXPECT_EQ(s["frontend.trace_steps"]["source"], "env");
  EXPECT_EQ(s["agent.overlap"]["source"], "default");
  EXPECT_EQ(s["agent.overlap"]["value"], "off");

  // The frontend runs with the file's queue limit: the setting reached the service.
  CliResult status = run_duet("status --json --stack " + id_);
  ASSERT_EQ(status.rc, 0) << status.out;
  EXPECT_EQ(nlohmann::json::parse(status.out)["frontend"]["limits"]["max_queue"], 7) << status.out;
  // The table form names the file.
  CliResult table = run_duet("stack config --stack " + id_);
  ASSERT_EQ(table.rc, 0) << table.out;
  EXPECT_NE(table.out.find(file), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("frontend.max_queue"), std::string::npos) << table.out;
}

TEST_F(StackConfigFile, ABadKeyAndABadValueAreRefusedAtUpByName) {
  CliResult bad_key =
      run_duet("stack up --stack " + id_ + " --config " + write("[kv]\nmemroy = \"1G\"\n"));
  EXPECT_NE(bad_key.rc, 0) << bad_key.out;
  EXPECT_NE(bad_key.out.find("kv.memroy"), std::string::npos) << bad_key.out;
  EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "a refused stack started something";

  CliResult bad_value = run_duet("stack up --stack " + id_ + " --config " +
                                 write("[agent]\noverlap = \"sometimes\"\n"));
  EXPECT_NE(bad_value.rc, 0) << bad_value.out;
  EXPECT_NE(bad_value.out.find("agent.overlap"), std::string::npos) << bad_value.out;
  EXPECT_NE(bad_value.out.find("sometimes"), std::string::npos) << bad_value.out;
  EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "a refused stack started something";
}

TEST_F(StackConfigFile, WithoutAFileEverySettingIsItsDefault) {
  CliResult up = run_duet("stack up --stack " + id_ + " --plan reference");
  ASSERT_EQ(up.rc, 0) << up.out;
  const nlohmann::json s = effective();
  ASSERT_FALSE(s.empty());
  for (const auto& [key, e] : s.items()) {
    if (key == "plan") {
      EXPECT_EQ(e["source"], "flag");
      continue;
    }
    // ctest's environment sets none of them; a developer's shell might.
    if (e["source"] == "env") continue;
    EXPECT_EQ(e["source"], "default") << key;
    EXPECT_EQ(e["value"], e["default"]) << key;
  }
}

}  // namespace
}  // namespace duet
