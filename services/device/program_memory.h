#pragma once
// The memory a registered program runs on, as a device service sees it: its arena, KV pages and
// model weights mapped into this process (core ProgramMemory), and its step flags. Both device
// services resolve programs the same way: ShmMemoryResolver maps the shm segments the program
// names (arena, KV pages, flags) and mmaps its model file.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/program/program.h"

namespace duet {

struct ResolvedMemory {
  ProgramMemory mem;
  // Flags for one step, waiting at most until the deadline under the epoch the step was issued
  // under (0: the current one); throws for a step issued under an older epoch. Empty when the
  // program names no flags segment.
  std::function<std::unique_ptr<FlagSync>(std::chrono::steady_clock::time_point deadline,
                                          uint64_t issued_epoch)>
      make_flags;
  // Preemption: wraps a step's flags for a preemptible step (empty: not supported).
  std::function<std::unique_ptr<FlagSync>(FlagSync& inner, const StepArgs& step,
                                          std::chrono::steady_clock::time_point deadline)>
      make_preemptible;
  std::shared_ptr<void> keep_alive;  // mappings that must outlive the program
  uint32_t n_flags = 0;              // flags in the table (0: unknown, indices not checked)
};
using MemoryResolver = std::function<ResolvedMemory(const fb::ProgramT&)>;

// Maps each segment and model file once per name, so programs sharing memory share mappings (and
// gpu_svc's zero-copy buffers over them). A name whose shm object was removed and made anew (a
// restarted frontend) is mapped again. Throws Error(not_found) naming a segment or file that does
// not exist, Error(invalid_argument) for a program that names no arena or model.
class ShmMemoryResolver {
 public:
  // `who` names the service in preemption errors ("gpu_svc", "npu_svc").
  explicit ShmMemoryResolver(const char* who);
  ResolvedMemory operator()(const fb::ProgramT& program);

 private:
  struct Mappings;
  std::shared_ptr<Mappings> mappings_;
  const char* who_;
};

}  // namespace duet
