#pragma once
// One OpenCL device, its context and in-order profiling queue (plus, on PoCL's CPU device, a
// narrow queue on PoCL's single-threaded driver for small steps), and the kernel program built
// once per device: the binary is cached on disk keyed by a hash of the device, driver, build
// options and source, so only the first run on a machine pays PoCL's (or a GPU driver's)
// compile time.
#include <CL/cl.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace duet::gpu {

// Throws duet::Error(internal or unavailable) naming the call and the OpenCL error code.
void check_cl(cl_int err, const char* what);
std::string cl_error_name(cl_int err);

struct DeviceInfo {
  std::string platform;
  std::string name;
  std::string vendor;
  std::string version;
  std::string driver;
  std::string type;  // "gpu", "cpu", "accelerator", "other"
  std::string extensions;
  int compute_units = 0;
  uint64_t global_mem_bytes = 0;
  uint64_t local_mem_bytes = 0;
  uint64_t max_alloc_bytes = 0;
  size_t max_work_group = 0;
  bool host_unified = false;
  bool fp64 = false;
  std::string narrow;  // the narrow queue's device (below), empty when there is none
  // The low-priority queue (below): "cl_khr_priority_hints" when there is one, else why not
  // ("none: ..." or "off: ...").
  std::string low_priority;
};

// `name` is one of the space-separated tokens of an extension string (CL_DEVICE_EXTENSIONS).
bool has_extension(const std::string& extensions, const std::string& name);

// The host CPU runs AVX-512 VNNI (vpdpbusd): the int8 kernels' fast family (matmul_int8.cl).
bool host_has_vnni();

struct DeviceOptions {
  // Which device: "" picks the first GPU, else the first device of any type;
  // "P:D" picks device D of platform P. Env DUET_OPENCL_DEVICE overrides an empty value.
  std::string select;
  // Where built program binaries are cached: "" = $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet,
  // else $HOME/.cache/duet. "-" disables the cache.
  std::string cache_dir;
  // Treat the device as discrete (copy in and out) even if it shares host memory: exercises the
  // copies path on PoCL. Env DUET_GPU_FORCE_COPIES=1 sets it too.
  bool force_copies = false;
  // PoCL's CPU device: also open PoCL's single-threaded "basic" driver as the narrow queue
  // (queue_picker.h says when it wins). Env DUET_GPU_NARROW=off turns it off. PoCL lists basic
  // only when POCL_DEVICES names it: open() sets POCL_DEVICES="pthread basic" when it is unset
  // and the platform was not loaded yet in this process (a user's own POCL_DEVICES is kept).
  bool narrow = true;
  // Also build the GEMV tuning variants (matmul_gpu.cl under DUET_GEMV_TUNING,
  // GpuKernels::kGemvTuningVariants) for gpu_bench --gemv-variants: a second program, cached
  // apart, ~4x the GEMV kernels of the default one, which holds only those GpuKernels picks.
  bool gemv_tuning = false;
  // A second queue of the same device created with CL_QUEUE_PRIORITY_LOW_KHR, for background
  // (proactive, Agent.xpu) steps: Transformer-Lite sets its kernels' priority to the lowest so
  // the GPU's other users (on a phone, rendering) go first. Only where the device offers
  // cl_khr_priority_hints (PoCL's CPU device does not); env DUET_GPU_LOW_PRIORITY=off turns it
  // off.
  bool low_priority = true;
};

class ClDevice {
 public:
  static std::unique_ptr<ClDevice> open(const DeviceOptions& options = {});
  ~ClDevice();
  ClDevice(const ClDevice&) = delete;
  ClDevice& operator=(const ClDevice&) = delete;

  const DeviceInfo& info() const { return info_; }
  cl_context context() const { return context_; }
  // The queue commands go to now: the device's own (wide) one, or the narrow one while
  // use_narrow(true). Both devices share the context and the buffers (host memory); each has the
  // program built from the same source and options (the narrow one's in the background: see
  // narrow_ready), and kernels get the same work-group sizes on both (the wide device's), so a
  // step gives the same bits on either.
  cl_command_queue queue() const {
    return low_active_      ? low_queue_
           : narrow_active_ ? narrow_queue_
           : op_timing_     ? queue_
                            : untimed_queue_;
  }
  bool has_narrow() const { return narrow_queue_ != nullptr; }
  // The narrow device's program is built on a thread of its own after open() returns: loading
  // a program binary into PoCL takes ~0.3 s a device, and a restarted gpu_svc serves on the wide
  // queue meanwhile (a supervisor restart is then ~0.45 s, not ~0.8). True once it is built;
  // false without a narrow queue or when its build failed (logged; the wide queue serves).
  bool narrow_ready() const { return narrow_ready_.load(std::memory_order_acquire); }
  // Waits for the narrow build; returns narrow_ready(). narrow_error(): why it failed, if it did
  // (valid after wait_narrow).
  bool wait_narrow();
  const std::string& narrow_error() const { return narrow_error_; }
  // Switches the queue for the commands that follow; the other queue is drained first (clFinish)
  // so nothing of it runs beside them. No-op without a narrow queue; waits for its program.
  void use_narrow(bool on);
  bool narrow_active() const { return narrow_active_; }
  // The low-priority queue (DeviceOptions::low_priority): the commands that follow
  // use_low_priority(true) go to it, the other queue drained first, as use_narrow. It takes
  // precedence over the narrow queue while on. No-op without one.
  bool has_low_priority() const { return low_queue_ != nullptr; }
  void use_low_priority(bool on);
  bool low_priority_active() const { return low_active_; }
  // Per-command device times (CL_QUEUE_PROFILING_ENABLE) on the wide queue: on by default. Off,
  // the commands that follow go to a second queue of the device without profiling, the other
  // drained first, as use_narrow; their events carry no times. On NVIDIA's OpenCL a launch that
  // asks for an event costs 18 us of host time on a profiling queue and 12 without
  // (launch_bench burst_raw), a third of a decode step there (gpu.op_timing, gpu_runner.h). The
  // narrow and low-priority queues keep their profiling.
  void use_op_timing(bool on);
  bool op_timing() const { return op_timing_; }
  // Whether queue()'s commands carry device times (every queue but the untimed one).
  bool queue_timed() const { return low_active_ || narrow_active_ || op_timing_; }
  // Flushes the queue and waits for `e` until `deadline`: a short spin, then a blocking wait on
  // the event's completion callback (on a discrete GPU: polling to the deadline). Throws
  // Error(timeout) at the deadline, Error(internal) when the command failed; both name `what`.
  void wait(cl_event e, std::chrono::steady_clock::time_point deadline, const char* what);
  // Waits, as wait(), until everything enqueued on the active queue so far has run (a marker).
  void drain(std::chrono::steady_clock::time_point deadline, const char* what);
  cl_device_id id() const { return device_; }
  // Host memory can be used in place (CL_MEM_USE_HOST_PTR without copies): CPU devices and
  // GPUs reporting host-unified memory. Otherwise the runner copies and says so.
  bool zero_copy() const { return zero_copy_; }
  // A kernel of the built program of the device the queue() is on, created on first use and kept.
  // On a VNNI host's CPU device the int8 kernels' portable family (DUET_GPU_INT8_VNNI=0, the
  // tests that hold it to the VNNI one's bits) is in a second program, loaded or built (then
  // cached) the first time one of its kernels is asked for.
  cl_kernel kernel(const std::string& name);
  // Builds that second program for both devices now (gpu_svc --prepare); a no-op without one.
  void build_other_isa_programs();
  bool program_from_cache() const { return program_from_cache_; }
  double program_build_ms() const { return program_build_ms_; }
  const std::string& cache_path() const { return cache_path_; }

 private:
  ClDevice() = default;
  void build_program(const DeviceOptions& options);
  // Builds the program for `device` with `build_options` from `binary`, or from the source where
  // it is empty, stale or foreign; `from_binary` says which. Throws for a source that fails.
  cl_program build_for(cl_device_id device, const std::vector<unsigned char>& binary,
                       const std::string& build_options, bool* from_binary = nullptr);
  void write_cache() const;  // both devices' binaries, when one was built from source
  // The cache file of a program built for `devices` (names) with `options`; "" without a cache.
  std::string cache_file(const std::string& devices, const std::string& options) const;
  static void write_binaries(const std::string& path, const std::vector<cl_program>& programs);
  cl_program other_isa_program(bool narrow);  // built on first use: kernel()
  void open_low_priority_queue(const DeviceOptions& options);
  std::vector<cl_device_id> devices() const;  // the device, then the narrow one if any

  DeviceInfo info_;
  cl_platform_id platform_ = nullptr;
  cl_device_id device_ = nullptr;
  cl_context context_ = nullptr;
  cl_command_queue queue_ = nullptr;
  cl_device_id narrow_device_ = nullptr;
  cl_command_queue narrow_queue_ = nullptr;
  bool narrow_active_ = false;
  cl_command_queue low_queue_ = nullptr;
  bool low_active_ = false;
  cl_command_queue untimed_queue_ = nullptr;
  bool op_timing_ = true;
  cl_program program_ = nullptr;
  std::map<std::string, cl_kernel> kernels_;
  cl_program narrow_program_ = nullptr;  // written by narrow_build_, read after narrow_ready_
  std::map<std::string, cl_kernel> narrow_kernels_;
  std::thread narrow_build_;
  std::atomic<bool> narrow_ready_{false};
  std::string narrow_error_;
  bool zero_copy_ = false;
  bool program_from_cache_ = false;
  double program_build_ms_ = 0;
  std::string cache_path_;
  std::string cache_dir_;
  std::string other_isa_options_;  // empty: the one program holds every kernel
  cl_program other_isa_program_ = nullptr, narrow_other_isa_program_ = nullptr;
};

// The process-wide device tests and benches share: building the program once per process keeps
// test binaries fast. Opened on first use with default options, its narrow program built before
// it returns: the same queues in every run, and no build thread left to run into the static
// objects' destruction at exit (clang's crashed under a 0.3 s test). gpu_svc opens its own.
ClDevice& shared_device();

}  // namespace duet::gpu
