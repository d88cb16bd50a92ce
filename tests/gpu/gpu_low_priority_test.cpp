// The low-priority queue for proactive steps (cl_device.h, DeviceOptions::low_priority;
// Transformer-Lite's execution priority): created exactly where the device lists
// cl_khr_priority_hints, the status string says which (or why none), use_low_priority routes the
// commands that follow to it, and DUET_GPU_LOW_PRIORITY turns it off or is refused when garbled.
// On PoCL (no such extension) this checks the "none" side; on the H100 run, the other.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "core/base/error.h"
#include "services/gpu_svc/cl_device.h"
#include "tests/gpu/gpu_test_util.h"

namespace duet::gpu {
namespace {

TEST(LowPriorityQueue, ExtensionsAreMatchedAsWholeTokens) {
  EXPECT_TRUE(
      has_extension("cl_khr_fp64 cl_khr_priority_hints cl_khr_icd", "cl_khr_priority_hints"));
  EXPECT_TRUE(has_extension("cl_khr_priority_hints", "cl_khr_priority_hints"));
  EXPECT_FALSE(
      has_extension("cl_khr_priority_hints_x cl_qcom_priority_hint", "cl_khr_priority_hints"));
  EXPECT_FALSE(has_extension("", "cl_khr_priority_hints"));
}

TEST(LowPriorityQueue, ExistsExactlyWhereTheDeviceOffersPriorityHints) {
  ClDevice& dev = shared_device();
  const DeviceInfo& d = dev.info();
  std::printf("[ low priority ] %s: %s\n", d.name.c_str(), d.low_priority.c_str());
  if (has_extension(d.extensions, "cl_khr_priority_hints")) {
    EXPECT_TRUE(dev.has_low_priority()) << d.low_priority;
    EXPECT_EQ(d.low_priority, "cl_khr_priority_hints");
  } else {
    EXPECT_FALSE(dev.has_low_priority());
    EXPECT_EQ(d.low_priority, "none: the device has no cl_khr_priority_hints");
  }
}

TEST(LowPriorityQueue, UseLowPriorityRoutesCommandsToItAndBack) {
  ClDevice& dev = shared_device();
  const cl_command_queue normal = dev.queue();
  dev.use_low_priority(true);
  EXPECT_EQ(dev.low_priority_active(), dev.has_low_priority());
  if (dev.has_low_priority())
    EXPECT_NE(dev.queue(), normal);
  else
    EXPECT_EQ(dev.queue(), normal);  // no such queue: a no-op
  // The routed queue runs commands: a marker completes.
  cl_event e = nullptr;
  check_cl(clEnqueueMarkerWithWaitList(dev.queue(), 0, nullptr, &e), "marker");
  dev.wait(e, std::chrono::steady_clock::now() + std::chrono::seconds(10), "marker");
  clReleaseEvent(e);
  dev.use_low_priority(false);
  EXPECT_FALSE(dev.low_priority_active());
  EXPECT_EQ(dev.queue(), normal);
}

TEST(LowPriorityQueue, TheEnvironmentTurnsItOffOrIsRefused) {
  {
    testing::ScopedEnv off("DUET_GPU_LOW_PRIORITY", "off");
    const auto dev = ClDevice::open();
    EXPECT_FALSE(dev->has_low_priority());
    EXPECT_EQ(dev->info().low_priority, "off: DUET_GPU_LOW_PRIORITY=off");
  }
  testing::ScopedEnv bad("DUET_GPU_LOW_PRIORITY", "lowest");
  try {
    ClDevice::open();
    FAIL() << "a garbled DUET_GPU_LOW_PRIORITY was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("DUET_GPU_LOW_PRIORITY"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace duet::gpu
