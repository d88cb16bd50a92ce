// The real frontend executable (ReferenceEngine, DUET_PLAN=reference) and the `duet` verbs on
// top of it: generate through the stack equals `duet generate --local`, chat keeps its session,
// status reports the frontend's metrics.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "frontend_fixture.h"
#include "tests/support/temp_dir.h"

namespace duet::frontend::testing {
namespace {

const std::string kBin = DUET_BINARY_DIR "/bin/";

// Runs a shell command and returns its stdout (commands are bounded by `timeout`).
std::string run(const std::string& cmd, int* status = nullptr) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int st = pclose(p);
  if (status) *status = st;
  return out;
}

class FrontendProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    run_dir_ = root_ + "/fetest";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      setenv("DUET_RUN_ROOT", root_.c_str(), 1);
      setenv("DUET_PLAN", "reference", 1);
      // The fp32 oracle (a stack's reference plan follows its KV type, f16 by default): these
      // tests compare it bit for bit with local `duet eval` and ReferenceForward.
      setenv("DUET_KV_TYPE", "f32", 1);
      for (const auto& [name, value] : extra_env_) setenv(name.c_str(), value.c_str(), 1);
      const std::string exe = kBin + "frontend";
      execl(exe.c_str(), exe.c_str(), "--stack", "fetest", "--model", kModelPath.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    const std::string sock = client_socket_path(run_dir_);
    struct stat st {};
    for (int i = 0; i < 2000 && stat(sock.c_str(), &st) != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(stat(sock.c_str(), &st), 0) << "the frontend never bound " << sock;
    // bind() creates it under the services' umask (0700, owner-only) and the frontend then
    // narrows it to 0600: the file can appear a moment before the chmod.
    for (int i = 0; i < 100 && stat(sock.c_str(), &st) == 0 && (st.st_mode & 0777) != 0600; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    env_ = "timeout 60 env DUET_RUN_ROOT=" + root_ + " ";
  }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 500 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        ADD_FAILURE() << "the frontend did not stop on SIGTERM";
      }
    }
  }

  test_support::TempDir tmp_{"duet-fe-proc"};
  const std::string root_ = tmp_.path();
  std::string run_dir_, env_;
  std::vector<std::pair<std::string, std::string>> extra_env_;  // for the frontend process
  pid_t pid_ = -1;
};

// The same frontend started with DUET_MAX_QUEUE=2.
class FrontendProcessQueueOf2 : public FrontendProcess {
 protected:
  FrontendProcessQueueOf2() { extra_env_ = {{"DUET_MAX_QUEUE", "2"}}; }
};

TEST_F(FrontendProcess, GenerateThroughTheStackEqualsLocalGenerate) {
  int status = 0;
  const std::string local = run("timeout 60 " + kBin + "duet generate --local --model " +
                                    kModelPath + " --max-tokens 24 'The man who' 2>/dev/null",
                                &status);
  ASSERT_EQ(status, 0);
  client::Client c(client::stack_endpoint("fetest", run_dir_));
  client::GenerateRequest r;
  r.prompt = "The man who";
  r.max_tokens = 24;
  EXPECT_EQ(c.generate(r).text + "\n", local);
  // The same through the CLI verb.
  const std::string stacked =
      run(env_ + kBin + "duet generate --stack fetest --max-tokens 24 'The man who' 2>/dev/null",
          &status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(stacked, local);
  const auto j = nlohmann::json::parse(run(
      env_ + kBin + "duet generate --stack fetest --max-tokens 24 --json 'The man who'", &status));
  EXPECT_EQ(j["text"].get<std::string>() + "\n", local);
  EXPECT_EQ(j["stats"]["plan"], "reference");
  EXPECT_EQ(j["stats"]["kv_bytes_copied"], 0);
  const std::string err = run(
      env_ + kBin + "duet generate --stack fetest --priority urgent 'x' 2>&1 >/dev/null", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("unknown priority 'urgent'"), std::string::npos) << err;
}

TEST_F(FrontendProcess, EvalThroughTheStackMatchesLocalEval) {
  // 300 positions: the frontend runs them in chunks of the engine's step budget.
  std::vector<int32_t> ids = {1};
  std::string ids_text = "1";
  for (int i = 1; i < 300; ++i) {
    ids.push_back(3 + (i * 37) % 2000);
    ids_text += " " + std::to_string(ids.back());
  }
  const std::string local_file = root_ + "/local.f32";
  int status = 0;
  run("timeout 60 " + kBin + "duet eval --model " + kModelPath + " --ids '" + ids_text +
          "' --logits-out " + local_file + " 2>/dev/null",
      &status);
  ASSERT_EQ(status, 0);
  std::ifstream in(local_file, std::ios::binary);
  std::vector<float> local(ids.size() * 2048);
  in.read(reinterpret_cast<char*>(local.data()), std::streamsize(local.size() * sizeof(float)));
  ASSERT_TRUE(in) << "the local logits file is short";
  const std::string stack_file = root_ + "/stack.f32";
  run(env_ + kBin + "duet eval --stack fetest --plan reference --model " + kModelPath + " --ids '" +
          ids_text + "' --logits-out " + stack_file + " 2>/dev/null",
      &status);
  ASSERT_EQ(status, 0);
  std::ifstream sin(stack_file, std::ios::binary);
  std::vector<float> stacked(local.size() + 1);
  sin.read(reinterpret_cast<char*>(stacked.data()), std::streamsize(stacked.size() * 4));
  ASSERT_EQ(sin.gcount(), std::streamsize(local.size() * 4)) << "the stack's logits file size";
  float max_diff = 0;
  for (size_t i = 0; i < local.size(); ++i)
    max_diff = std::max(max_diff, std::abs(stacked[i] - local[i]));
  EXPECT_LT(max_diff, 1e-4f);
  // A model that is not the stack's is refused, naming both.
  const std::string err =
      run(env_ + kBin +
              "duet eval --stack fetest --model " DUET_SOURCE_DIR
              "/tests/data/tiny-fortune/fortune-f16.gguf --ids '1 2' --logits-out " +
              root_ + "/x.f32 2>&1",
          &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("is not this stack's model"), std::string::npos) << err;
}

TEST_F(FrontendProcess, ChatKeepsItsSessionAndStatusReportsIt) {
  int status = 0;
  const std::string out = run("printf 'A fool\\n and his money\\n' | " + env_ + kBin +
                                  "duet chat --stack fetest --raw --max-tokens 8",
                              &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  const std::string js =
      run(env_ + kBin + "duet status --stack fetest --json 2>/dev/null", &status);
  EXPECT_EQ(status, 0) << js;
  const auto j = nlohmann::json::parse(js);
  EXPECT_EQ(j["frontend"]["plan"], "reference");
  EXPECT_EQ(j["frontend"]["sessions"], 0);  // chat closed it at end of input
  EXPECT_EQ(j["frontend"]["metrics"]["requests"]["completed"], 2);
  EXPECT_TRUE(j["supervisor"].contains("error"));  // none runs in this test
  const std::string human = run(env_ + kBin + "duet status --stack fetest", &status);
  EXPECT_NE(human.find("measured: TTFT"), std::string::npos) << human;
}

// The tiny model has no chat template: `duet chat` needs --chat-template, and with it each line
// is a user message of one session; `generate --chat` is one user message.
TEST_F(FrontendProcess, ChatFormatsTurnsWithTheNamedTemplate) {
  int status = 0;
  const std::string refused =
      run("printf 'A fool\\n' | " + env_ + kBin + "duet chat --stack fetest --max-tokens 4 2>&1",
          &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(refused.find("has no chat template"), std::string::npos) << refused;
  const std::string out = run("printf 'A fool\\n and his money\\n' | " + env_ + kBin +
                                  "duet chat --stack fetest --chat-template llama2 --system "
                                  "'Be wise' --max-tokens 8",
                              &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_GE(std::count(out.begin(), out.end(), '\n'), 2) << out;  // a reply may hold newlines
  // generate --chat through the stack equals generate --chat --local.
  const std::string args =
      " --chat --chat-template llama2 --system 'Be wise' --max-tokens 12 "
      "'What is a fool?' 2>/dev/null";
  const std::string local =
      run("timeout 60 " + kBin + "duet generate --local --model " + kModelPath + args, &status);
  ASSERT_EQ(status, 0);
  const std::string stacked = run(env_ + kBin + "duet generate --stack fetest" + args, &status);
  ASSERT_EQ(status, 0);
  EXPECT_EQ(stacked, local);
  EXPECT_FALSE(local.empty());
}

TEST_F(FrontendProcess, VerbsOnAStackThatIsNotUpSayWhy) {
  int status = 0;
  const std::string err =
      run(env_ + kBin + "duet status --stack nosuchstack 2>&1 >/dev/null", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("has no frontend socket"), std::string::npos) << err;
}

TEST_F(FrontendProcessQueueOf2, DuetMaxQueueSetsTheQueueLimit) {
  int status = 0;
  const std::string js =
      run(env_ + kBin + "duet status --stack fetest --json 2>/dev/null", &status);
  ASSERT_EQ(status, 0) << js;
  EXPECT_EQ(nlohmann::json::parse(js)["frontend"]["limits"]["max_queue"], 2) << js;
}

// A queue limit that is not a whole number in range stops the frontend at start with the
// variable's name, before it binds anything.
TEST(FrontendProcessEnv, ABadDuetMaxQueueIsRefusedByName) {
  for (const char* bad : {"2.5", "-1", "many"}) {
    int status = 0;
    const std::string err = run(
        "timeout 30 env DUET_RUN_ROOT=/tmp/duet-fe-badq DUET_PLAN=reference "
        "DUET_MAX_QUEUE=" +
            std::string(bad) + " " + kBin + "frontend --stack badq --model " + kModelPath + " 2>&1",
        &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 124)
        << bad << ": " << err;
    EXPECT_NE(err.find("DUET_MAX_QUEUE='" + std::string(bad) + "'"), std::string::npos)
        << bad << ": " << err;
  }
  std::filesystem::remove_all("/tmp/duet-fe-badq");
}

}  // namespace
}  // namespace duet::frontend::testing
