// libFuzzer: any bytes as a GGUF file. The reader must reject or accept them without crashing,
// and everything it accepts must be readable within the file (then the model loader must also
// reject or accept cleanly).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/base/error.h"
#include "core/model/gguf.h"
#include "core/model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/duet-fuzz-gguf-" + std::to_string(getpid()) + ".gguf";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto file = duet::GgufFile::open(path);
    uint64_t sum = 0;
    for (const auto& t : file->tensors()) {
      // Touch the first and last byte of every tensor the reader vouched for.
      if (t.bytes) sum += t.data[0] + t.data[t.bytes - 1];
    }
    (void)sum;
    auto model = duet::LlamaModel::load(path);
    (void)model;
  } catch (const duet::Error&) {
  }
  std::remove(path.c_str());  // one input at a time: nothing stays in /tmp after the run
  return 0;
}
