// The stack on real processes: `duet stack up/status/restart/logs/down` start and stop
// duet-supervisor and the four services; the tests kill them, crash them and feed them garbage.
// Each test uses its own stack id and tears its stack down (hard, if need be) afterwards.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/ipc/messaging.h"
#include "core/ipc/run_dir.h"
#include "shm/segment.h"
#include "tests/support/stack_support.h"

namespace duet {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test_support::CliResult;
using test_support::run_duet;

bool shm_exists(const std::string& stack) {
  return !shm::list_stack_segments(stack).empty();
}

class StackTest : public test_support::StackFixture {
 protected:
  StackTest() : StackFixture("t_", 22) {}

  std::optional<nlohmann::json> try_status() { return test_support::stack_status(run_dir_); }
  nlohmann::json status() {
    auto s = try_status();
    if (!s) ADD_FAILURE() << "stack " << id_ << " does not answer status";
    return s ? *s : nlohmann::json{{"services", nlohmann::json::array()}};
  }
  static const nlohmann::json& service(const nlohmann::json& s, const std::string& name) {
    for (const auto& svc : s["services"])
      if (svc["name"] == name) return svc;
    static const nlohmann::json none = {{"pid", 0}, {"state", "absent"}};
    return none;
  }
  std::map<std::string, int> service_pids() {
    std::map<std::string, int> out;
    const nlohmann::json s = status();
    for (const auto& svc : s["services"]) out[svc["name"]] = svc["pid"];
    return out;
  }
  void up() {
    CliResult r = run_duet("stack up --stack " + id_);
    ASSERT_EQ(r.rc, 0) << r.out;
  }
};

const std::vector<std::string> kServices = {"frontend", "gpu_svc", "npu_svc", "solver_svc"};

TEST_F(StackTest, UpShowsFourHealthyAndDownLeavesNothing) {
  up();
  CliResult st = run_duet("stack status --stack " + id_);
  EXPECT_EQ(st.rc, 0) << st.out;
  EXPECT_NE(st.out.find("healthy"), std::string::npos) << st.out;

  nlohmann::json s = status();
  EXPECT_EQ(s["state"], "healthy");
  ASSERT_EQ(s["services"].size(), 4u);
  std::vector<int> pids = {s["pid"].get<int>()};
  for (const auto& name : kServices) {
    const auto& svc = service(s, name);
    EXPECT_EQ(svc["state"], "healthy") << name;
    EXPECT_EQ(svc["restarts"], 0) << name;
    EXPECT_TRUE(svc["heartbeat_age_ms"].is_number()) << name;
    EXPECT_TRUE(process_alive(svc["pid"])) << name;
    pids.push_back(svc["pid"]);
  }
  // A segment the way a service makes one: down must remove it with the rest.
  shm::Segment seg = shm::Segment::create(shm::segment_name(id_, "arena"), 4096);
  ASSERT_TRUE(shm_exists(id_));

  CliResult down = run_duet("stack down --stack " + id_);
  EXPECT_EQ(down.rc, 0) << down.out;
  EXPECT_FALSE(shm_exists(id_));
  EXPECT_FALSE(std::filesystem::exists(run_dir_)) << "sockets, logs or the pid file remain";
  for (int pid : pids) EXPECT_FALSE(process_alive(pid)) << "pid " << pid;
}

TEST_F(StackTest, KilledServiceIsBackWithinOneSecondAndOthersNeverNotice) {
  up();
  for (const auto& victim : kServices) {
    std::map<std::string, int> before = service_pids();
    nlohmann::json s0 = status();
    const int old_pid = before[victim];
    ASSERT_GT(old_pid, 0) << victim;  // kill(0) would hit this test's own process group
    ASSERT_EQ(kill(old_pid, SIGKILL), 0);
    const auto t0 = Clock::now();
    int new_pid = 0;
    while (Clock::now() - t0 < 5s) {
      const auto s = status();
      const auto& svc = service(s, victim);
      if (svc["state"] == "healthy" && svc["pid"] != old_pid && svc["pid"] != 0) {
        new_pid = svc["pid"];
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
    std::printf("[ stack ] %s kill -9 -> healthy again in %lld ms\n", victim.c_str(),
                static_cast<long long>(ms));
    ASSERT_NE(new_pid, 0) << victim << " did not come back";
    EXPECT_LT(ms, 1000) << victim;
    nlohmann::json s1 = status();
    EXPECT_EQ(service(s1, victim)["restarts"], 1) << victim;
    for (const auto& other : kServices) {
      if (other == victim) continue;
      EXPECT_EQ(service(s1, other)["pid"], before[other]) << other << " was restarted too";
      EXPECT_EQ(service(s1, other)["restarts"], service(s0, other)["restarts"]) << other;
      EXPECT_EQ(service(s1, other)["state"], "healthy") << other;
    }
  }
  EXPECT_EQ(status()["state"], "healthy");
}

TEST_F(StackTest, ServiceCrashingAtStartTripsTheIntensityLimit) {
  // DUET_CRASH_AT_START is the service runtime's test hook: npu_svc aborts before binding.
  CliResult r = run_duet("stack up --stack " + id_, "DUET_CRASH_AT_START=npu_svc");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("degraded"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("npu_svc failed"), std::string::npos) << r.out;

  nlohmann::json s = status();
  EXPECT_EQ(s["state"], "degraded");
  const auto& npu = service(s, "npu_svc");
  EXPECT_EQ(npu["state"], "failed");
  EXPECT_EQ(npu["restarts"], 5);  // the default limit: 5 restarts in 10 s, the 6th crash fails it
  EXPECT_EQ(npu["pid"], 0);
  EXPECT_NE(npu["last_exit"].get<std::string>().find("signal 6"), std::string::npos) << npu;
  // The others may still be starting when npu_svc's crash loop ends; they come up regardless.
  const auto t0 = Clock::now();
  auto others_healthy = [&] {
    s = status();
    for (const auto& other : {"frontend", "gpu_svc", "solver_svc"})
      if (service(s, other)["state"] != "healthy") return false;
    return true;
  };
  while (!others_healthy() && Clock::now() - t0 < 5s) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE(others_healthy()) << s.dump();
  EXPECT_EQ(s["state"], "degraded");
  CliResult text = run_duet("stack status --stack " + id_);
  EXPECT_NE(text.out.find("degraded"), std::string::npos) << text.out;
}

TEST_F(StackTest, GarbageToEverySocketGetsAnErrorReplyAndNobodyDies) {
  up();
  const std::map<std::string, int> before = service_pids();
  const int supervisor_pid = status()["pid"];
  msg::Bytes heartbeat = msg::make_heartbeat(1, 1);
  msg::Bytes corrupt = heartbeat;
  corrupt[heartbeat.size() - 6] ^= 0x7f;
  const std::vector<msg::Bytes> inputs = {
      {},
      {0x00},
      {0xde, 0xad, 0xbe, 0xef, 'D', 'U', 'C', 'T', 0xff, 0xff, 0xff, 0x7f},
      msg::Bytes(65536, 0xa5),
      msg::Bytes(heartbeat.begin(), heartbeat.begin() + 12),
      msg::make_client_error(1, Errc::busy, "a client buffer on a control socket"),
  };
  std::vector<std::string> sockets;
  for (ServiceId id : kAllServices) sockets.push_back(control_socket_path(run_dir_, id));
  sockets.push_back(supervisor_socket_path(run_dir_));
  const std::string client_sock = client_socket_path(run_dir_);
  sockets.push_back(client_sock);

  for (const auto& path : sockets) {
    msg::RequestClient c(ipc_endpoint(path));
    for (const auto& in : inputs) {
      msg::Bytes reply;
      ASSERT_NO_THROW(reply = c.call_raw(in, 2000ms))
          << path << " stalled on " << in.size() << " bytes";
      if (path == client_sock) {
        const fb::client::ClientMessage* m = nullptr;
        ASSERT_NO_THROW(m = msg::verify_client(reply)) << path;
        EXPECT_EQ(m->body_type(), fb::client::ClientBody::Error) << path;
      } else {
        const fb::Message* m = nullptr;
        ASSERT_NO_THROW(m = msg::verify_control(reply)) << path;
        ASSERT_EQ(m->body_type(), fb::Body::ErrorReply) << path << " " << in.size() << " bytes";
        EXPECT_EQ(m->body_as_ErrorReply()->code(), fb::Code::BadFormat) << path;
      }
    }
    // Below ZeroMQ: bytes that are not even ZMTP, straight onto the unix socket.
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << path;
    std::string junk(1000, '\xff');
    (void)!write(fd, junk.data(), junk.size());
    close(fd);
  }
  std::this_thread::sleep_for(200ms);  // a heartbeat or two later
  nlohmann::json s = status();
  EXPECT_EQ(s["state"], "healthy");
  EXPECT_EQ(s["pid"], supervisor_pid);
  for (const auto& [name, pid] : before) {
    EXPECT_EQ(service(s, name)["pid"], pid) << name;
    EXPECT_EQ(service(s, name)["state"], "healthy") << name;
    EXPECT_LT(service(s, name)["heartbeat_age_ms"].get<int>(), 1000) << name;
  }
}

TEST_F(StackTest, SecondUpWithTheSameIdFailsClearly) {
  up();
  const int pid = status()["pid"];
  CliResult again = run_duet("stack up --stack " + id_);
  EXPECT_NE(again.rc, 0);
  EXPECT_NE(again.out.find("already up (supervisor pid " + std::to_string(pid)), std::string::npos)
      << again.out;
  nlohmann::json s = status();
  EXPECT_EQ(s["pid"], pid);
  EXPECT_EQ(s["state"], "healthy");
}

// The services outlive a killed supervisor (issue 22): they keep serving, `status` says the stack
// is degraded and names them, and the next `up` adopts them (same pids) and supervises them again.
TEST_F(StackTest, NextUpAdoptsTheServicesAKilledSupervisorLeft) {
  up();
  nlohmann::json s = status();
  const int supervisor_pid = s["pid"];
  ASSERT_GT(supervisor_pid, 0);
  ASSERT_EQ(kill(supervisor_pid, SIGKILL), 0);
  const auto t0 = Clock::now();
  while (process_alive(supervisor_pid) && Clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(300ms);
  for (const auto& svc : s["services"]) EXPECT_TRUE(process_alive(svc["pid"])) << svc["name"];

  CliResult st = run_duet("stack status --stack " + id_);
  EXPECT_NE(st.rc, 0);
  EXPECT_NE(st.out.find("degraded: its supervisor (pid " + std::to_string(supervisor_pid) +
                        ") died; still running, unsupervised: frontend pid"),
            std::string::npos)
      << st.out;
  // Unsupervised, the stack still serves.
  CliResult gen = run_duet("generate --stack " + id_ + " --max-tokens 4 'Q: Why'");
  EXPECT_EQ(gen.rc, 0) << gen.out;

  CliResult r = run_duet("stack up --stack " + id_);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("adopted 4 running services of dead supervisor pid " +
                       std::to_string(supervisor_pid)),
            std::string::npos)
      << r.out;
  const nlohmann::json after = status();
  EXPECT_EQ(after["state"], "healthy");
  EXPECT_EQ(after["takeover"]["from_supervisor_pid"], supervisor_pid);
  EXPECT_EQ(after["takeover"]["adopted"].size(), 4u) << after.dump();
  for (const auto& svc : s["services"]) {
    EXPECT_EQ(service(after, svc["name"])["pid"], svc["pid"]) << svc["name"];
    EXPECT_TRUE(service(after, svc["name"])["adopted"].get<bool>()) << svc["name"];
  }
  // Supervised again: a crash of an adopted service is seen (through its pidfd) and restarted.
  const int gpu = service(after, "gpu_svc")["pid"];
  ASSERT_EQ(kill(gpu, SIGKILL), 0);
  const auto t1 = Clock::now();
  while (Clock::now() - t1 < 10s && !(service(status(), "gpu_svc")["pid"] != gpu &&
                                      service(status(), "gpu_svc")["state"] == "healthy"))
    std::this_thread::sleep_for(50ms);
  const nlohmann::json restarted = service(status(), "gpu_svc");
  EXPECT_NE(restarted["pid"], gpu);
  EXPECT_EQ(restarted["state"], "healthy");
  EXPECT_EQ(restarted["restarts"], 1);
  EXPECT_NE(restarted["last_exit"].get<std::string>().find("adopted"), std::string::npos);
}

// With nothing left running, the next `up` reclaims what the dead supervisor left, as before.
TEST_F(StackTest, NextUpReclaimsWhatAKilledStackLeft) {
  up();
  nlohmann::json s = status();
  const int supervisor_pid = s["pid"];
  // The stack's own segments: its journal and, warmed up at `up`, its engines' arenas, flags and
  // KV pool.
  const std::vector<std::string> own = shm::list_stack_segments(id_);
  (void)shm::Segment::create(shm::segment_name(id_, "kv"),
                             4096);  // persists: a killed stack's data plane
  ASSERT_EQ(kill(supervisor_pid, SIGKILL), 0);
  for (const auto& svc : s["services"]) kill(svc["pid"].get<int>(), SIGKILL);
  // SIGKILL is not instant: until the supervisor is gone too, `status` still finds it alive
  // and asks its socket, which no longer answers (a 2 s timeout instead of "died").
  std::vector<int> killed = {supervisor_pid};
  for (const auto& svc : s["services"]) killed.push_back(svc["pid"]);
  const auto t0 = Clock::now();
  for (const int pid : killed)
    while (process_alive(pid) && Clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  ASSERT_FALSE(process_alive(supervisor_pid));
  ASSERT_TRUE(shm_exists(id_));
  ASSERT_TRUE(std::filesystem::exists(pid_file_path(run_dir_)));

  CliResult st = run_duet("stack status --stack " + id_);
  EXPECT_NE(st.rc, 0);
  EXPECT_NE(st.out.find("supervisor (pid " + std::to_string(supervisor_pid) + ") died"),
            std::string::npos)
      << st.out;

  CliResult r = run_duet("stack up --stack " + id_);
  ASSERT_EQ(r.rc, 0) << r.out;
  // The data plane above and every segment the killed stack held.
  EXPECT_NE(r.out.find("reclaimed " + std::to_string(own.size() + 1) + " segments"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("dead supervisor pid " + std::to_string(supervisor_pid)), std::string::npos)
      << r.out;
  // What is left is the new stack's own (the same names as the old one's, made afresh), nothing
  // else of the old stack.
  EXPECT_EQ(shm::list_stack_segments(id_), own);
  EXPECT_NE(std::find(own.begin(), own.end(), shm::segment_name(id_, "journal")), own.end());
  EXPECT_EQ(status()["state"], "healthy");
}

// `down` without a supervisor stops the services it left (they outlive it) and removes the rest.
TEST_F(StackTest, DownAfterAKilledSupervisorStopsItsServicesAndRemovesWhatItLeft) {
  up();
  nlohmann::json s = status();
  const int supervisor_pid = s["pid"];
  ASSERT_GT(supervisor_pid, 0);
  (void)shm::Segment::create(shm::segment_name(id_, "extra"), 4096);
  ASSERT_EQ(kill(supervisor_pid, SIGKILL), 0);
  const auto t0 = Clock::now();
  while (process_alive(supervisor_pid) && Clock::now() - t0 < 5s) std::this_thread::sleep_for(10ms);
  CliResult down = run_duet("stack down --stack " + id_);
  EXPECT_EQ(down.rc, 0) << down.out;
  EXPECT_NE(down.out.find("stopped 4 services"), std::string::npos) << down.out;
  EXPECT_FALSE(shm_exists(id_));
  EXPECT_FALSE(std::filesystem::exists(run_dir_));
  for (const auto& svc : s["services"]) EXPECT_FALSE(process_alive(svc["pid"])) << svc["name"];
}

TEST_F(StackTest, FrozenServiceIsReportedUnresponsiveAndDownStillKillsIt) {
  CliResult r = run_duet("stack up --unresponsive-ms 400 --stop-timeout-ms 300 --stack " + id_);
  ASSERT_EQ(r.rc, 0) << r.out;
  nlohmann::json s = status();
  const int frozen = service(s, "npu_svc")["pid"];
  ASSERT_GT(frozen, 0);
  ASSERT_EQ(kill(frozen, SIGSTOP), 0);  // alive, but answers nothing (and ignores SIGTERM)
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < 8s && service(status(), "npu_svc")["state"] != "unresponsive")
    std::this_thread::sleep_for(50ms);
  s = status();
  EXPECT_EQ(service(s, "npu_svc")["state"], "unresponsive");
  EXPECT_GE(service(s, "npu_svc")["heartbeat_age_ms"].get<int>(), 400);
  EXPECT_EQ(s["state"], "degraded");
  EXPECT_EQ(service(s, "npu_svc")["pid"], frozen);  // reported, not restarted behind our back

  CliResult down = run_duet("stack down --stack " + id_);  // SIGTERM stays pending: SIGKILL
  EXPECT_EQ(down.rc, 0) << down.out;
  EXPECT_FALSE(process_alive(frozen));
  EXPECT_FALSE(std::filesystem::exists(run_dir_));
}

TEST_F(StackTest, RestartAndLogsVerbs) {
  up();
  const int old_pid = service(status(), "gpu_svc")["pid"];
  CliResult r = run_duet("stack restart gpu --stack " + id_);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("gpu_svc restarted: pid " + std::to_string(old_pid)), std::string::npos)
      << r.out;
  nlohmann::json s = status();
  EXPECT_NE(service(s, "gpu_svc")["pid"], old_pid);
  EXPECT_EQ(s["state"], "healthy");

  CliResult logs = run_duet("stack logs gpu_svc --stack " + id_);
  EXPECT_EQ(logs.rc, 0) << logs.out;
  EXPECT_NE(logs.out.find("gpu_svc pid " + std::to_string(old_pid) + " bound"), std::string::npos)
      << logs.out;
  CliResult sup = run_duet("stack logs supervisor -n 3 --stack " + id_);
  EXPECT_EQ(sup.rc, 0) << sup.out;
  EXPECT_NE(sup.out.find("gpu_svc"), std::string::npos) << sup.out;
}

TEST_F(StackTest, BadInputIsAClearErrorAndStartsNothing) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"stack up --stack 'no/slash'", "invalid stack id"},
      {"stack up --stack " + id_ + " --model /nonexistent.gguf", "does not exist"},
      {"stack up --stack " + id_ + " --soc nosuchsoc", "unknown SoC profile 'nosuchsoc'"},
      {"stack status --stack " + id_, "is not up"},
      {"stack down --stack " + id_, "is not up"},
      {"stack restart cpu_svc --stack " + id_, "unknown service 'cpu_svc'"},
  };
  for (const auto& c : cases) {
    CliResult r = run_duet(c.args);
    EXPECT_NE(r.rc, 0) << c.args;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << " -> " << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(run_dir_));
}

// `gpu_svc --prepare` (deploy/build.sh runs it): builds the kernel program into the binary cache
// and says so; the next run loads it from there; a device that does not exist is an error
// naming it, exit 1.
TEST(GpuSvcPrepare, BuildsTheProgramIntoTheCacheOnceAndSaysWhere) {
  const std::string dir = "/tmp/duet-prepare-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  const std::string gpu_svc = "env DUET_CACHE_DIR=" + dir + " '" DUET_BINARY_DIR "/bin/gpu_svc'";
  auto run = [](const std::string& cmd) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int st = pclose(p);
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  const auto [rc1, out1] = run(gpu_svc + " --prepare");
  EXPECT_EQ(rc1, 0) << out1;
  EXPECT_NE(out1.find("program built"), std::string::npos) << out1;
  ASSERT_NE(out1.find(dir + "/opencl-"), std::string::npos) << out1;
  const auto [rc2, out2] = run(gpu_svc + " --prepare");
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("loaded from the cache"), std::string::npos) << out2;
  const auto [rc3, out3] = run("DUET_OPENCL_DEVICE=9:0 " + gpu_svc + " --prepare");
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_NE(out3.find("OpenCL platform 9 does not exist"), std::string::npos) << out3;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace duet
