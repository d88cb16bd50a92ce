// core/ipc/log_file: a process's log is capped by size and rotated, and its stderr follows the
// rotation when the supervisor pointed it at the log.
#include "core/ipc/log_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/logger.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/base/error.h"
#include "core/ipc/run_dir.h"
#include "tests/support/temp_dir.h"

namespace duet {
namespace {

namespace fs = std::filesystem;

class LogFileTest : public ::testing::Test {
 protected:
  std::string read(const std::string& path) {
    std::ifstream f(path);
    return {std::istreambuf_iterator<char>(f), {}};
  }
  test_support::TempDir tmp_{"duet-logtest"};
  const std::string dir_ = tmp_.path();
};

TEST_F(LogFileTest, ALogPastItsCapRotatesAndKeepsOnlyItsFiles) {
  spdlog::logger log("svc", make_log_file_sink(dir_, "svc", LogLimits{8192, 2}));
  const std::string line(100, 'x');
  for (int i = 0; i < 2000; ++i) log.info("{} {}", i, line);  // ~250 KB through an 8 KB cap
  log.flush();
  EXPECT_TRUE(fs::exists(dir_ + "/svc.log"));
  EXPECT_TRUE(fs::exists(dir_ + "/svc.1.log"));
  EXPECT_TRUE(fs::exists(dir_ + "/svc.2.log"));
  EXPECT_FALSE(fs::exists(dir_ + "/svc.3.log")) << "only 2 rotated files are kept";
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_LE(e.file_size(), 8192u + 200) << e.path();
    total += e.file_size();
  }
  EXPECT_LE(total, 3u * (8192 + 200));
  EXPECT_NE(read(dir_ + "/svc.log").find("1999 "), std::string::npos)
      << "the newest line is current";
}

TEST_F(LogFileTest, StderrPointedAtTheLogFollowsItThroughRotation) {
  // A child process, as the supervisor starts a service: stdio opened on <name>.log, then the
  // service's own sink. An abort message written after rotations must be in the current file.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string path = log_path(dir_, "svc");
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd < 0 || dup2(fd, 2) < 0) _exit(2);
    close(fd);
    spdlog::logger log("svc", make_log_file_sink(dir_, "svc", LogLimits{4096, 1}));
    for (int i = 0; i < 500; ++i) log.info("line {} of the service's own log", i);
    log.flush();
    const char mark[] = "ABORT-MESSAGE-AFTER-ROTATION\n";
    if (write(2, mark, sizeof mark - 1) < 0) _exit(3);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(fs::exists(dir_ + "/svc.1.log")) << "the log rotated";
  EXPECT_NE(read(dir_ + "/svc.log").find("ABORT-MESSAGE-AFTER-ROTATION"), std::string::npos);
}

TEST_F(LogFileTest, ABadLimitInTheEnvironmentIsRefusedByName) {
  setenv("DUET_LOG_MAX_BYTES", "12k", 1);
  try {
    (void)LogLimits::from_env();
    ADD_FAILURE() << "12k accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DUET_LOG_MAX_BYTES"), std::string::npos) << e.what();
  }
  unsetenv("DUET_LOG_MAX_BYTES");
  EXPECT_EQ(LogLimits::from_env().max_bytes, LogLimits{}.max_bytes);
}

}  // namespace
}  // namespace duet
