#pragma once
// The service's MemoryResolver: maps the shm segments a Program names (arena, KV pages, flags)
// and mmaps its model file, each once per name, so programs sharing memory share mappings (and
// the runner's zero-copy buffers). Step flags are ShmFlagSync over the flags segment.
#include <map>
#include <memory>
#include <string>

#include "services/gpu_svc/gpu_service.h"

namespace duet::gpu {

class ShmMemoryResolver {
 public:
  ShmMemoryResolver();
  ResolvedMemory operator()(const fb::ProgramT& program);

 private:
  struct Mappings;
  std::shared_ptr<Mappings> mappings_;
};

}  // namespace duet::gpu
