#pragma once
// What the real-process stack tests (tests/stack, tests/chaos, tests/solver) share: running the
// built `duet` CLI, a stack id unique to the running test, the supervisor's status, and a teardown
// that leaves no process, segment or run directory behind even when a test failed half way.
// Header-only: DUET_BINARY_DIR is defined per test executable (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/base/error.h"
#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "core/ipc/stack_record.h"
#include "shm/segment.h"
#include "tests/support/shell.h"

namespace duet::test_support {

// Runs build/bin/duet with `args` (shell words) and `env` ("NAME=value ..." put before it); its
// output is stdout and stderr.
inline CliResult run_duet(const std::string& args, const std::string& env = "") {
  return run_shell(env + " '" DUET_BINARY_DIR "/bin/duet' " + args + " 2>&1");
}

// "<prefix><test name, first name_chars, [A-Za-z0-9_] only>_<pid>": tests running at once (ctest
// -j, several engineers) never share a stack.
inline std::string unique_stack_id(const std::string& prefix, size_t name_chars) {
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return prefix + name.substr(0, name_chars) + "_" + std::to_string(getpid() % 100000);
}

// The supervisor's status (nullopt when it does not answer within 2 s).
inline std::optional<nlohmann::json> stack_status(const std::string& run_dir) {
  const std::string sock = supervisor_socket_path(run_dir);
  if (!std::filesystem::exists(sock)) return std::nullopt;
  try {
    msg::RequestClient c(ipc_endpoint(sock));
    auto r = c.call([](uint64_t id) { return msg::make_status_request(id); },
                    std::chrono::milliseconds(2000));
    return nlohmann::json::parse(r.message().body_as_StatusReply()->json()->str());
  } catch (const Error&) {
    return std::nullopt;
  }
}

// The supervisor's pid and its services' pids, as its status gives them (empty: no answer).
inline std::vector<int> stack_pids(const std::string& run_dir) {
  std::vector<int> pids;
  if (auto s = stack_status(run_dir)) {
    pids.push_back((*s)["pid"].get<int>());
    for (const auto& svc : (*s)["services"]) pids.push_back(svc["pid"].get<int>());
  }
  // Services outlive a killed supervisor: its record names them (checked against their start).
  if (auto record = read_stack_record(run_dir))
    for (const ServiceRecord& svc : record->services)
      if (process_start_ticks(svc.pid) == svc.start_ticks) pids.push_back(svc.pid);
  return pids;
}

// A second small model of another architecture and shape than tiny-fortune (issue 25's
// several-model stacks): mkmodel's tiny qwen2 (Qwen2's vocab, q/k/v biases, NEOX rope), Q8_0,
// written to `dir` once; its path.
inline std::string make_tiny_qwen2(const std::filesystem::path& dir) {
  const std::filesystem::path out = dir / "qwen2-q8_0.gguf";
  if (std::filesystem::exists(out)) return out.string();
  std::filesystem::create_directories(dir);
  const CliResult r = run_duet("mkmodel --shape tiny-qwen2 --arch qwen2 --vocab '" DUET_SOURCE_DIR
                               "/tests/data/vocab/qwen2.gguf' --type q8_0 --std 0.08 --out '" +
                               out.string() + "'");
  if (r.rc != 0) throw Error(Errc::internal, "mkmodel tiny-qwen2 failed: " + r.out);
  return out.string();
}

// `duet generate --stack S --max-tokens N --ignore-eos --json` of `prompt`, written to `file`
// first (a long prompt is no shell word); its parsed reply (discarded where the command failed,
// which the test is told).
inline nlohmann::json generate_json(const std::string& stack, const std::string& prompt,
                                    int max_tokens, const std::filesystem::path& file) {
  std::ofstream(file) << prompt;
  const CliResult r =
      run_duet("generate --stack " + stack + " --max-tokens " + std::to_string(max_tokens) +
                   " --ignore-eos --json \"$(cat '" + file.string() + "')\"",
               "timeout 120");
  EXPECT_EQ(r.rc, 0) << r.out.substr(0, 2000);
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << r.out.substr(0, 2000);
  return j;
}

// `stack down` first; then whatever a failed test left: processes, segments, files.
inline void tear_down_stack(const std::string& id, const std::string& run_dir) {
  const std::vector<int> pids = stack_pids(run_dir);
  if (std::filesystem::exists(run_dir)) run_duet("stack down --stack " + id);
  for (int pid : pids)
    if (pid > 0 && process_alive(pid)) kill(pid, SIGKILL);  // never kill(0): our own group
  shm::remove_stack_segments(id);
  std::filesystem::remove_all(run_dir);
}

// The fixture of a test that brings up a real stack: id_ is unique to the running test
// (unique_stack_id(prefix, name_chars)), run_dir_ its default run dir, and TearDown leaves
// nothing of it behind. A fixture that overrides TearDown calls StackFixture::TearDown() last.
class StackFixture : public ::testing::Test {
 protected:
  StackFixture(const std::string& prefix, size_t name_chars)
      : id_(unique_stack_id(prefix, name_chars)), run_dir_(default_run_dir(id_)) {}
  void TearDown() override { tear_down_stack(id_, run_dir_); }

  const std::string id_;
  const std::string run_dir_;
};

}  // namespace duet::test_support
