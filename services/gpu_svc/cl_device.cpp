#include "services/gpu_svc/cl_device.h"

#include <CL/cl_ext.h>
#include <dlfcn.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "core/base/error.h"
#include "core/base/settings.h"
#include "services/gpu_svc/queue_picker.h"

namespace duet::gpu {

extern const unsigned char kKernelSource[];
extern const size_t kKernelSourceSize;

namespace {

constexpr cl_int kPlatformNotFoundKhr = -1001;  // cl_khr_icd: the loader found no platform

std::string platform_string(cl_platform_id p, cl_platform_info what) {
  size_t n = 0;
  check_cl(clGetPlatformInfo(p, what, 0, nullptr, &n), "clGetPlatformInfo");
  std::string s(n, '\0');
  check_cl(clGetPlatformInfo(p, what, n, s.data(), nullptr), "clGetPlatformInfo");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::string device_string(cl_device_id d, cl_device_info what) {
  size_t n = 0;
  check_cl(clGetDeviceInfo(d, what, 0, nullptr, &n), "clGetDeviceInfo");
  std::string s(n, '\0');
  check_cl(clGetDeviceInfo(d, what, n, s.data(), nullptr), "clGetDeviceInfo");
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T device_value(cl_device_id d, cl_device_info what) {
  T v{};
  check_cl(clGetDeviceInfo(d, what, sizeof v, &v, nullptr), "clGetDeviceInfo");
  return v;
}

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string default_cache_dir() {
  if (const auto d = setting_override("DUET_CACHE_DIR")) return *d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/duet";
  if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/duet";
  return "";
}

bool is_pocl_basic(const std::string& device_name) {
  return device_name.rfind("basic", 0) == 0;
}

const char* type_name(cl_device_type t) {
  if (t & CL_DEVICE_TYPE_GPU) return "gpu";
  if (t & CL_DEVICE_TYPE_CPU) return "cpu";
  if (t & CL_DEVICE_TYPE_ACCELERATOR) return "accelerator";
  return "other";
}

}  // namespace

std::string cl_error_name(cl_int err) {
  switch (err) {
    case CL_DEVICE_NOT_FOUND:
      return "CL_DEVICE_NOT_FOUND";
    case CL_OUT_OF_RESOURCES:
      return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY:
      return "CL_OUT_OF_HOST_MEMORY";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
      return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_BUILD_PROGRAM_FAILURE:
      return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_VALUE:
      return "CL_INVALID_VALUE";
    case CL_INVALID_BUFFER_SIZE:
      return "CL_INVALID_BUFFER_SIZE";
    case CL_INVALID_HOST_PTR:
      return "CL_INVALID_HOST_PTR";
    case CL_INVALID_KERNEL_NAME:
      return "CL_INVALID_KERNEL_NAME";
    case CL_INVALID_KERNEL_ARGS:
      return "CL_INVALID_KERNEL_ARGS";
    case CL_INVALID_ARG_INDEX:
      return "CL_INVALID_ARG_INDEX";
    case CL_INVALID_ARG_SIZE:
      return "CL_INVALID_ARG_SIZE";
    case CL_INVALID_WORK_GROUP_SIZE:
      return "CL_INVALID_WORK_GROUP_SIZE";
    case CL_INVALID_WORK_ITEM_SIZE:
      return "CL_INVALID_WORK_ITEM_SIZE";
    case CL_INVALID_GLOBAL_WORK_SIZE:
      return "CL_INVALID_GLOBAL_WORK_SIZE";
    case CL_INVALID_BINARY:
      return "CL_INVALID_BINARY";
    case kPlatformNotFoundKhr:
      return "kPlatformNotFoundKhr (no OpenCL ICD)";
    default:
      return "OpenCL error " + std::to_string(err);
  }
}

void check_cl(cl_int err, const char* what) {
  if (err == CL_SUCCESS) return;
  const Errc code = (err == CL_DEVICE_NOT_FOUND || err == kPlatformNotFoundKhr) ? Errc::unavailable
                    : (err == CL_OUT_OF_RESOURCES || err == CL_OUT_OF_HOST_MEMORY ||
                       err == CL_MEM_OBJECT_ALLOCATION_FAILURE)
                        ? Errc::busy
                        : Errc::internal;
  throw Error(code, std::string(what) + " failed: " + cl_error_name(err));
}

std::unique_ptr<ClDevice> ClDevice::open(const DeviceOptions& options) {
  std::unique_ptr<ClDevice> dev(new ClDevice());
  // DUET_GPU_NARROW is read (and a bad value refused) where the runner reads it too.
  const bool narrow_wanted =
      options.narrow && QueuePicker::from_env().mode != QueuePicker::Mode::off;
  // PoCL reads POCL_DEVICES once, when its platform loads (the first clGetPlatformIDs).
  if (narrow_wanted) ::setenv("POCL_DEVICES", "pthread basic", /*overwrite=*/0);
  cl_uint n_platforms = 0;
  check_cl(clGetPlatformIDs(0, nullptr, &n_platforms), "clGetPlatformIDs");
  if (n_platforms == 0) throw Error(Errc::unavailable, "no OpenCL platform (is an ICD installed?)");
  std::vector<cl_platform_id> platforms(n_platforms);
  check_cl(clGetPlatformIDs(n_platforms, platforms.data(), nullptr), "clGetPlatformIDs");

  std::string select = options.select;
  if (select.empty()) select = setting_text("DUET_OPENCL_DEVICE");
  auto devices_of = [](cl_platform_id p, cl_device_type t) {
    cl_uint n = 0;
    if (clGetDeviceIDs(p, t, 0, nullptr, &n) != CL_SUCCESS || n == 0)
      return std::vector<cl_device_id>{};
    std::vector<cl_device_id> ids(n);
    check_cl(clGetDeviceIDs(p, t, n, ids.data(), nullptr), "clGetDeviceIDs");
    return ids;
  };
  if (!select.empty()) {
    unsigned p = 0, d = 0;
    char colon = 0;
    std::istringstream in(select);
    if (!(in >> p >> colon >> d) || colon != ':')
      throw Error(Errc::invalid_argument,
                  "OpenCL device selector '" + select + "' is not PLATFORM:DEVICE");
    if (p >= n_platforms)
      throw Error(Errc::not_found, "OpenCL platform " + std::to_string(p) + " does not exist (" +
                                       std::to_string(n_platforms) + " platforms)");
    auto ids = devices_of(platforms[p], CL_DEVICE_TYPE_ALL);
    if (d >= ids.size())
      throw Error(Errc::not_found, "OpenCL device " + select + " does not exist");
    dev->platform_ = platforms[p];
    dev->device_ = ids[d];
  } else {
    for (cl_device_type want :
         {cl_device_type{CL_DEVICE_TYPE_GPU}, cl_device_type{CL_DEVICE_TYPE_ALL}}) {
      for (auto p : platforms) {
        auto ids = devices_of(p, want);
        if (ids.empty()) continue;
        // PoCL lists its single-threaded driver first: the all-cores one is the device.
        auto all_cores = std::find_if(ids.begin(), ids.end(), [](cl_device_id d) {
          return !is_pocl_basic(device_string(d, CL_DEVICE_NAME));
        });
        dev->platform_ = p;
        dev->device_ = all_cores != ids.end() ? *all_cores : ids[0];
        break;
      }
      if (dev->device_) break;
    }
    if (!dev->device_) throw Error(Errc::unavailable, "no OpenCL device on any platform");
  }

  DeviceInfo& in = dev->info_;
  in.platform = platform_string(dev->platform_, CL_PLATFORM_NAME) + " " +
                platform_string(dev->platform_, CL_PLATFORM_VERSION);
  in.name = device_string(dev->device_, CL_DEVICE_NAME);
  in.vendor = device_string(dev->device_, CL_DEVICE_VENDOR);
  in.version = device_string(dev->device_, CL_DEVICE_VERSION);
  in.driver = device_string(dev->device_, CL_DRIVER_VERSION);
  in.extensions = device_string(dev->device_, CL_DEVICE_EXTENSIONS);
  const auto type = device_value<cl_device_type>(dev->device_, CL_DEVICE_TYPE);
  in.type = type_name(type);
  in.compute_units =
      static_cast<int>(device_value<cl_uint>(dev->device_, CL_DEVICE_MAX_COMPUTE_UNITS));
  in.global_mem_bytes = device_value<cl_ulong>(dev->device_, CL_DEVICE_GLOBAL_MEM_SIZE);
  in.local_mem_bytes = device_value<cl_ulong>(dev->device_, CL_DEVICE_LOCAL_MEM_SIZE);
  in.max_alloc_bytes = device_value<cl_ulong>(dev->device_, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  in.max_work_group = device_value<size_t>(dev->device_, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  in.host_unified = device_value<cl_bool>(dev->device_, CL_DEVICE_HOST_UNIFIED_MEMORY) == CL_TRUE;
  in.fp64 = in.extensions.find("cl_khr_fp64") != std::string::npos;
  dev->zero_copy_ = (type & CL_DEVICE_TYPE_CPU) || in.host_unified;
  if (options.force_copies || setting_text("DUET_GPU_FORCE_COPIES") == "1") dev->zero_copy_ = false;

  // The narrow queue: PoCL's single-threaded driver beside its all-cores one (queue_picker.h).
  if (narrow_wanted && (type & CL_DEVICE_TYPE_CPU) && in.name.rfind("pthread", 0) == 0)
    for (cl_device_id d : devices_of(dev->platform_, CL_DEVICE_TYPE_CPU))
      if (is_pocl_basic(device_string(d, CL_DEVICE_NAME))) {
        dev->narrow_device_ = d;
        in.narrow = device_string(d, CL_DEVICE_NAME);
        break;
      }

  cl_int err = CL_SUCCESS;
  const std::vector<cl_device_id> devices = dev->devices();
  dev->context_ = clCreateContext(nullptr, static_cast<cl_uint>(devices.size()), devices.data(),
                                  nullptr, nullptr, &err);
  check_cl(err, "clCreateContext");
  dev->queue_ = clCreateCommandQueue(dev->context_, dev->device_, CL_QUEUE_PROFILING_ENABLE, &err);
  check_cl(err, "clCreateCommandQueue");
  dev->untimed_queue_ = clCreateCommandQueue(dev->context_, dev->device_, 0, &err);
  check_cl(err, "clCreateCommandQueue(untimed)");
  if (dev->narrow_device_) {
    dev->narrow_queue_ =
        clCreateCommandQueue(dev->context_, dev->narrow_device_, CL_QUEUE_PROFILING_ENABLE, &err);
    check_cl(err, "clCreateCommandQueue(narrow)");
  }
  dev->open_low_priority_queue(options);
  dev->build_program(options);
  return dev;
}

bool host_has_vnni() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

bool has_extension(const std::string& extensions, const std::string& name) {
  std::istringstream in(extensions);
  std::string token;
  while (in >> token)
    if (token == name) return true;
  return false;
}

void ClDevice::open_low_priority_queue(const DeviceOptions& options) {
  if (!options.low_priority || !setting_on("DUET_GPU_LOW_PRIORITY")) {  // checked: on|off
    info_.low_priority = "off: DUET_GPU_LOW_PRIORITY=off";
    return;
  }
  if (!has_extension(info_.extensions, "cl_khr_priority_hints")) {
    info_.low_priority = "none: the device has no cl_khr_priority_hints";
    return;
  }
  // An OpenCL 2.0 entry point (queue properties); duet builds against the 1.2 API, so it is
  // looked up in the ICD loader, which exports it when the platform is 2.0 or later.
  using CreateWithProperties =
      cl_command_queue(CL_API_CALL*)(cl_context, cl_device_id, const cl_ulong*, cl_int*);
  const auto create = reinterpret_cast<CreateWithProperties>(
      ::dlsym(RTLD_DEFAULT, "clCreateCommandQueueWithProperties"));
  if (!create) {
    info_.low_priority = "none: no clCreateCommandQueueWithProperties in the OpenCL loader";
    return;
  }
  const cl_ulong props[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, CL_QUEUE_PRIORITY_KHR,
                            CL_QUEUE_PRIORITY_LOW_KHR, 0};
  cl_int err = CL_SUCCESS;
  low_queue_ = create(context_, device_, props, &err);
  if (err != CL_SUCCESS || !low_queue_) {
    low_queue_ = nullptr;
    info_.low_priority =
        "none: clCreateCommandQueueWithProperties(CL_QUEUE_PRIORITY_LOW_KHR) "
        "failed: " +
        cl_error_name(err);
    return;
  }
  info_.low_priority = "cl_khr_priority_hints";
}

void ClDevice::use_low_priority(bool on) {
  on = on && low_queue_;
  if (on == low_active_) return;
  check_cl(clFinish(queue()), "clFinish(queue switch)");
  low_active_ = on;
}

std::vector<cl_device_id> ClDevice::devices() const {
  std::vector<cl_device_id> d{device_};
  if (narrow_device_) d.push_back(narrow_device_);
  return d;
}

void ClDevice::use_op_timing(bool on) {
  if (on == op_timing_) return;
  check_cl(clFinish(queue()), "clFinish(queue switch)");
  op_timing_ = on;
}

void ClDevice::use_narrow(bool on) {
  on = on && narrow_queue_ && wait_narrow();
  if (on == narrow_active_) return;
  check_cl(clFinish(queue()), "clFinish(queue switch)");
  narrow_active_ = on;
}

// The cache file: "DUETCLB2", a u32 count, then per device (the devices() order) a u64 size and
// that many bytes of the program binary.
namespace {

constexpr char kBinaryMagic[8] = {'D', 'U', 'E', 'T', 'C', 'L', 'B', '2'};
const std::vector<unsigned char> kNoBinary;

std::vector<std::vector<unsigned char>> read_binaries(const std::string& path, size_t n) {
  if (path.empty()) return {};  // no cache
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  uint32_t count = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, kBinaryMagic, 8) != 0 ||
      !f.read(reinterpret_cast<char*>(&count), 4) || count != n)
    return {};
  std::vector<std::vector<unsigned char>> bins(n);
  for (auto& b : bins) {
    uint64_t size = 0;
    if (!f.read(reinterpret_cast<char*>(&size), 8) || size == 0 || size > (uint64_t{1} << 32))
      return {};
    b.resize(size);
    if (!f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(size))) return {};
  }
  return bins;
}

}  // namespace

void ClDevice::build_program(const DeviceOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const std::string base_options = std::string("-cl-std=CL1.2 -cl-mad-enable") +
                                   (options.gemv_tuning ? " -DDUET_GEMV_TUNING" : "");
  // On a VNNI host's CPU device the int8 kernels' portable family goes to a second program
  // (matmul_int8.cl, INT8_ISA_*), built on first use (kernel()): half the IR PoCL parses when a
  // restarted gpu_svc loads its program.
  const bool split_isa = info_.type == "cpu" && host_has_vnni();
  const std::string build_options = base_options + (split_isa ? " -DDUET_INT8_ISA_VNNI_ONLY" : "");
  if (split_isa) other_isa_options_ = base_options + " -DDUET_INT8_ISA_PORTABLE_ONLY";
  const std::vector<cl_device_id> devs = devices();
  cache_dir_ = options.cache_dir.empty() ? default_cache_dir() : options.cache_dir;
  cache_path_ = cache_file(info_.name + "\n" + info_.narrow, build_options);

  std::vector<std::vector<unsigned char>> bins = read_binaries(cache_path_, devs.size());
  program_ =
      build_for(device_, bins.empty() ? kNoBinary : bins[0], build_options, &program_from_cache_);
  program_build_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!narrow_device_) {
    if (!program_from_cache_) write_cache();
    return;
  }
  // The narrow device's program on a thread of its own (narrow_ready): its binary when the wide
  // one's came from the cache too, else the source; the cache is written once both are built.
  std::vector<unsigned char> narrow_binary;
  if (program_from_cache_) narrow_binary = std::move(bins[1]);
  narrow_build_ = std::thread([this, narrow_binary = std::move(narrow_binary), build_options] {
    try {
      bool from_binary = false;
      narrow_program_ = build_for(narrow_device_, narrow_binary, build_options, &from_binary);
      narrow_ready_.store(true, std::memory_order_release);
      if (!from_binary) write_cache();
    } catch (const std::exception& e) {
      narrow_error_ = e.what();  // read after the join (wait_narrow)
      std::fprintf(stderr, "gpu_svc: no narrow queue, the wide one serves every step: %s\n",
                   e.what());
    }
  });
}

cl_program ClDevice::build_for(cl_device_id device, const std::vector<unsigned char>& binary,
                               const std::string& build_options, bool* from_binary) {
  if (from_binary) *from_binary = !binary.empty();
  cl_int err = CL_SUCCESS;
  if (!binary.empty()) {
    const unsigned char* ptr = binary.data();
    const size_t size = binary.size();
    cl_int status = CL_SUCCESS;
    cl_program p = clCreateProgramWithBinary(context_, 1, &device, &size, &ptr, &status, &err);
    if (err == CL_SUCCESS && status == CL_SUCCESS &&
        clBuildProgram(p, 1, &device, build_options.c_str(), nullptr, nullptr) == CL_SUCCESS)
      return p;
    if (err == CL_SUCCESS && p) clReleaseProgram(p);
    if (from_binary) *from_binary = false;  // a stale or foreign binary: the source, below
  }
  const char* src = reinterpret_cast<const char*>(kKernelSource);
  const size_t len = kKernelSourceSize;
  cl_program p = clCreateProgramWithSource(context_, 1, &src, &len, &err);
  check_cl(err, "clCreateProgramWithSource");
  err = clBuildProgram(p, 1, &device, build_options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    size_t n = 0;
    clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n);
    std::string log(n, '\0');
    clGetProgramBuildInfo(p, device, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
    clReleaseProgram(p);
    throw Error(Errc::internal, "building the gpu_svc kernels for " +
                                    device_string(device, CL_DEVICE_NAME) + " failed (" +
                                    cl_error_name(err) + "):\n" + log);
  }
  return p;
}

std::string ClDevice::cache_file(const std::string& devices, const std::string& options) const {
  if (cache_dir_.empty() || cache_dir_ == "-") return "";
  uint64_t h = 1469598103934665603ull;
  for (const std::string& s : {info_.platform, devices, info_.version, info_.driver, options})
    h = fnv1a(h, s.data(), s.size() + 1);
  h = fnv1a(h, kKernelSource, kKernelSourceSize);
  char name[32];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(h));
  return cache_dir_ + "/opencl-" + name + ".bin";
}

cl_program ClDevice::other_isa_program(bool narrow) {
  cl_program& p = narrow ? narrow_other_isa_program_ : other_isa_program_;
  if (p || other_isa_options_.empty()) return p;
  const cl_device_id device = narrow ? narrow_device_ : device_;
  const std::string path = cache_file(narrow ? info_.narrow : info_.name, other_isa_options_);
  const std::vector<std::vector<unsigned char>> bins = read_binaries(path, 1);
  bool from_binary = false;
  p = build_for(device, bins.empty() ? kNoBinary : bins[0], other_isa_options_, &from_binary);
  if (!from_binary) write_binaries(path, {p});
  return p;
}

void ClDevice::build_other_isa_programs() {
  if (other_isa_options_.empty()) return;
  other_isa_program(false);
  if (wait_narrow()) other_isa_program(true);
}

void ClDevice::write_cache() const {
  write_binaries(cache_path_, {program_, narrow_program_});
}

void ClDevice::write_binaries(const std::string& path, const std::vector<cl_program>& programs) {
  if (path.empty()) return;
  std::vector<std::vector<unsigned char>> bins;
  for (cl_program p : programs) {
    if (!p) continue;
    // A cache that cannot be written only costs time: nothing here throws.
    size_t size = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, nullptr) != CL_SUCCESS)
      return;
    std::vector<unsigned char> b(size);
    unsigned char* ptr = b.data();
    if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof ptr, &ptr, nullptr) != CL_SUCCESS) return;
    bins.push_back(std::move(b));
  }
  // Write then rename, so a concurrent reader never sees half a file.
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  std::ofstream out(tmp, std::ios::binary);
  const auto count = static_cast<uint32_t>(bins.size());
  out.write(kBinaryMagic, 8);
  out.write(reinterpret_cast<const char*>(&count), 4);
  for (const auto& b : bins) {
    const uint64_t size = b.size();
    out.write(reinterpret_cast<const char*>(&size), 8);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(size));
  }
  out.close();
  if (out) std::filesystem::rename(tmp, path, ec);
  if (!out || ec) std::filesystem::remove(tmp, ec);
}

bool ClDevice::wait_narrow() {
  if (narrow_build_.joinable()) narrow_build_.join();
  return narrow_ready();
}

cl_kernel ClDevice::kernel(const std::string& name) {
  // The low-priority queue is the wide device's; the narrow one is active only once its program
  // is built (use_narrow).
  const bool narrow = narrow_active_ && !low_active_;
  auto& kernels = narrow ? narrow_kernels_ : kernels_;
  auto it = kernels.find(name);
  if (it != kernels.end()) return it->second;
  cl_int err = CL_SUCCESS;
  cl_kernel k = clCreateKernel(narrow ? narrow_program_ : program_, name.c_str(), &err);
  if (err == CL_INVALID_KERNEL_NAME && !other_isa_options_.empty())
    k = clCreateKernel(other_isa_program(narrow), name.c_str(), &err);
  if (err != CL_SUCCESS)
    throw Error(Errc::internal, "gpu_svc kernel '" + name + "': " + cl_error_name(err));
  kernels.emplace(name, k);
  return k;
}

ClDevice::~ClDevice() {
  wait_narrow();
  for (auto& [name, k] : kernels_) clReleaseKernel(k);
  for (auto& [name, k] : narrow_kernels_) clReleaseKernel(k);
  if (program_) clReleaseProgram(program_);
  if (narrow_program_) clReleaseProgram(narrow_program_);
  if (other_isa_program_) clReleaseProgram(other_isa_program_);
  if (narrow_other_isa_program_) clReleaseProgram(narrow_other_isa_program_);
  if (queue_) clReleaseCommandQueue(queue_);
  if (untimed_queue_) clReleaseCommandQueue(untimed_queue_);
  if (narrow_queue_) clReleaseCommandQueue(narrow_queue_);
  if (low_queue_) clReleaseCommandQueue(low_queue_);
  if (context_) clReleaseContext(context_);
}

ClDevice& shared_device() {
  static std::once_flag once;
  static std::unique_ptr<ClDevice> dev;
  std::call_once(once, [] {
    dev = ClDevice::open();
    dev->wait_narrow();  // a failed narrow build leaves the wide queue serving (narrow_error)
  });
  return *dev;
}

namespace {

// What a waiter blocks on until the event's completion callback (run by the OpenCL runtime's
// thread) marks it. Shared: a waiter that gives up at its deadline leaves it to the callback.
struct EventSignal {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
};

void CL_CALLBACK signal_on_complete(cl_event, cl_int, void* user) {
  auto* holder = static_cast<std::shared_ptr<EventSignal>*>(user);
  {
    std::lock_guard lock((*holder)->m);
    (*holder)->done = true;
  }
  (*holder)->cv.notify_all();
  delete holder;
}

}  // namespace

// A short spin for the ops of a decode step (microseconds), then a blocking wait on the event's
// completion callback. Polling in sleeps instead (every 20 us, as before) woke this thread ~20k
// times in a 1.5 s prefill, and on a CPU device every wake-up preempts a worker running the
// kernels (perf: 46k context switches in one 296-token prefill).
void ClDevice::wait(cl_event e, std::chrono::steady_clock::time_point deadline, const char* what) {
  using Clock = std::chrono::steady_clock;
  check_cl(clFlush(queue()), "clFlush");
  const auto status_of = [&] {
    cl_int status = CL_QUEUED;
    check_cl(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr),
             "clGetEventInfo");
    if (status < 0)
      throw Error(Errc::internal, std::string("gpu_svc: ") + what +
                                      " failed on the device: " + cl_error_name(status));
    return status;
  };
  const auto timeout = [&] {
    return Error(Errc::timeout,
                 std::string("gpu_svc: ") + what + " did not finish by its deadline");
  };
  // A discrete GPU's kernels take none of the host's cores, so there the wait polls to its
  // deadline: NVIDIA's completion callbacks came late on the H100 (bench/gpu/RESULTS.md,
  // "2026-11-28: discrete GPUs").
  const auto spin_until =
      zero_copy_ ? std::min(deadline, Clock::now() + std::chrono::microseconds(50)) : deadline;
  while (Clock::now() < spin_until) {
    if (status_of() == CL_COMPLETE) return;
    std::this_thread::yield();
  }
  if (!zero_copy_) throw timeout();
  auto signal = std::make_shared<EventSignal>();
  auto* holder = new std::shared_ptr<EventSignal>(signal);
  if (const cl_int err = clSetEventCallback(e, CL_COMPLETE, signal_on_complete, holder);
      err != CL_SUCCESS) {
    delete holder;
    check_cl(err, "clSetEventCallback");
  }
  {
    std::unique_lock lock(signal->m);
    if (!signal->cv.wait_until(lock, deadline, [&] { return signal->done; })) throw timeout();
  }
  if (status_of() != CL_COMPLETE) throw timeout();  // the callback also runs on a failure
}

void ClDevice::drain(std::chrono::steady_clock::time_point deadline, const char* what) {
  cl_event marker = nullptr;
  check_cl(clEnqueueMarkerWithWaitList(queue(), 0, nullptr, &marker),
           "clEnqueueMarkerWithWaitList");
  try {
    wait(marker, deadline, what);
  } catch (...) {
    clReleaseEvent(marker);
    throw;
  }
  clReleaseEvent(marker);
}

}  // namespace duet::gpu
