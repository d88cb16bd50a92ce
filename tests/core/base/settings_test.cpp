// The settings registry (core/base/settings.h): every DUET_* value a process reads comes from one
// table, with its default, checked against its type and range, and a bad value names itself.
#include "core/base/settings.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>

#include "core/base/error.h"
#include "tests/support/error_code.h"
#include "tests/support/scoped_env.h"

namespace duet {
namespace {

using test_support::ScopedEnv;

std::string message_of(const Setting& s, const std::string& value) {
  try {
    check_setting(s, value);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    return e.what();
  }
  return "";
}

TEST(Settings, EveryNameAndKeyIsUniqueAndEveryDefaultIsValid) {
  std::set<std::string> envs, keys;
  for (const Setting& s : all_settings()) {
    EXPECT_TRUE(envs.insert(std::string(s.env)).second) << s.env;
    if (!s.key.empty()) {
      EXPECT_TRUE(keys.insert(std::string(s.key)).second) << s.key;
    }
    if (!s.def.empty()) {
      EXPECT_NO_THROW(check_setting(s, s.def)) << s.env;
    }
    EXPECT_FALSE(s.doc.empty()) << s.env;
  }
  EXPECT_EQ(find_setting_key("kv.memory"), find_setting_env("DUET_KV_MEMORY"));
}

TEST(Settings, ABadValueNamesTheKeyAndTheVariable) {
  const Setting& queue = *find_setting_env("DUET_MAX_QUEUE");
  for (const char* bad : {"2.5", "-1", "many", "", "2000000"}) {
    const std::string msg = message_of(queue, bad);
    EXPECT_NE(msg.find("frontend.max_queue"), std::string::npos) << msg;
    EXPECT_NE(msg.find("DUET_MAX_QUEUE='" + std::string(bad) + "'"), std::string::npos) << msg;
  }
  EXPECT_EQ(message_of(queue, "64"), "");
  const std::string overlap = message_of(*find_setting_env("DUET_AGENT_OVERLAP"), "sometimes");
  EXPECT_NE(overlap.find("off proactive all"), std::string::npos) << overlap;
  EXPECT_NE(message_of(*find_setting_env("DUET_KV_MEMORY"), "lots").find("kv.memory"),
            std::string::npos);
  EXPECT_EQ(message_of(*find_setting_env("DUET_KV_MEMORY"), "1.5G"), "");
  EXPECT_EQ(message_of(*find_setting_env("DUET_AGENT_RIDER_SLACK"), "inf"), "");
  // Empty is a value only where the choices list it.
  EXPECT_EQ(message_of(*find_setting_env("DUET_TIMING"), ""), "");
  EXPECT_NE(message_of(*find_setting_env("DUET_PLAN"), ""), "");
}

TEST(Settings, AReaderGetsTheDefaultOrTheCheckedVariable) {
  unsetenv("DUET_MAX_QUEUE");
  EXPECT_EQ(setting_int("DUET_MAX_QUEUE"), 64);
  EXPECT_EQ(setting_override("DUET_MAX_QUEUE"), std::nullopt);
  {
    ScopedEnv env("DUET_MAX_QUEUE", "7");
    EXPECT_EQ(setting_int("DUET_MAX_QUEUE"), 7);
    EXPECT_EQ(setting_override("DUET_MAX_QUEUE"), "7");
  }
  {
    ScopedEnv env("DUET_MAX_QUEUE", "seven");
    EXPECT_THROW(setting_int("DUET_MAX_QUEUE"), Error);
  }
  {
    ScopedEnv env("DUET_KV_PREFIX", "off");
    EXPECT_FALSE(setting_on("DUET_KV_PREFIX"));
  }
  EXPECT_TRUE(setting_on("DUET_KV_PREFIX"));
  EXPECT_DOUBLE_EQ(setting_number("DUET_AGENT_AGING_MS"), 30000);
}

TEST(Settings, ANameMissingFromTheTableIsAnInternalError) {
  std::string message;
  EXPECT_EQ(test_support::error_code_of([] { setting_text("DUET_NO_SUCH_SETTING"); }, &message),
            Errc::internal);
  EXPECT_NE(message.find("DUET_NO_SUCH_SETTING"), std::string::npos) << message;
}

TEST(Settings, MemorySizesTakeSuffixes) {
  EXPECT_EQ(parse_setting_size("512M"), 512ull << 20);
  EXPECT_EQ(parse_setting_size("2G"), 2ull << 30);
  EXPECT_EQ(parse_setting_size("4096"), 4096u);
  EXPECT_THROW(parse_setting_size("2X"), Error);
  EXPECT_THROW(parse_setting_size("0"), Error);
}

}  // namespace
}  // namespace duet
